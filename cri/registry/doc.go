// Package registry is podgate's pod registry: a record per pod sandbox (pod identity, network
// namespace, pause PID, cgroups, IPs, sysctl results, attached devices) and the containers of
// each sandbox. The sandbox pipeline writes it, the PodResources service and the features read
// it through single-method views, and a checkpoint in stateDir (versioned, checksummed, written
// atomically) keeps it across restarts. Features keep their own state and rules and put their
// obligations in the same checkpoint as sections (Section, Register, Commit): package manager's
// DRA claims, package attach's attach intents; the registry builds each pod's view of its claims
// from the claims' section. At start-up it is rebuilt from the runtime (Rebuild), which adopts
// what podgate did not see start. This package also holds the one decoder of containerd's
// verbose status ("info").
package registry
