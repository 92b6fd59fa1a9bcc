// Package resources is podgate's container-resources feature: memory QoS as the kubelet 1.36
// computes it, added to CreateContainer and UpdateContainerResources; the check, after
// StartContainer and UpdateContainerResources and again each recheck period, that a
// container's cgroup holds what was asked; the pod-level resources the kubelet sends
// (RunPodSandbox, UpdatePodSandboxResources) and the check of the pod cgroup after a pod-level
// resize; and what the PodResources extension shows of them.
//
// Subpackage cgroup reads and compares the cgroups; Hooks plugs that into the CRI calls. The
// composition root (agent) builds Hooks and lists its methods in its per-method hook tables:
// this package owns the hooks, their state and their rules, not their order among other
// features'.
package resources
