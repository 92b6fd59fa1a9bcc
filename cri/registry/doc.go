// Package registry is podgate's pod registry: a record per pod sandbox (its identity and
// lifecycle: pod, runtime handler, origin, readiness, network namespace, pause PID, cgroups,
// IPs) and the containers of each sandbox. The sandbox pipeline writes it, the PodResources
// service and the features read it through single-method views, and a checkpoint in stateDir
// (versioned, checksummed, written atomically) keeps it across restarts.
//
// What a feature does for a sandbox or a pod is the feature's record, of the feature's own
// types, kept by the feature: the registry writes it in the same checkpoint as the feature's
// section (Section, Register, Commit), either top-level keys (package manager's DRA claims,
// package attach's attach intents) or keys of each sandbox object (SandboxFields: package
// sysctl's results, package attach's attached devices), tells the sections of the sandboxes'
// and containers' lives (SandboxWatcher, AdoptWatcher, ContainerWatcher), and shows their
// records with each pod (PodViewer: PodState.Views, read by each feature's InPod; PodKeeper: a
// pod known by its DRA claims before it has a sandbox). A key no section owns is carried
// through writes unchanged. At start-up the registry is rebuilt from the runtime (Rebuild),
// which adopts what podgate did not see start. This package also holds the one decoder of
// containerd's verbose status ("info").
package registry
