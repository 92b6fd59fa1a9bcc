// Package registry is podgate's pod registry: a record per pod sandbox (pod identity, network
// namespace, pause PID, cgroups, IPs, sysctl results, attached devices), the DRA claims of each
// pod, the intents to attach DRA network devices, and the containers of each sandbox. The sandbox pipeline writes it, the PodResources
// service and the features read it through single-method views, and a checkpoint in stateDir
// (versioned, checksummed, written atomically) keeps it across restarts. At start-up it is
// rebuilt from the runtime (Rebuild), which adopts what podgate did not see start. This package
// also holds the one decoder of containerd's verbose status ("info").
package registry
