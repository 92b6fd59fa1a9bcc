// Package cgroup reads and verifies what a container's cgroup holds, and computes podgate's
// memory QoS. It imports no other podgate package.
//
// # The node
//
// [Detect] tells the node's cgroup mode (unified, hybrid, legacy, as
// github.com/containerd/cgroups/v3 sees it), the controllers of the cgroup v2 hierarchy, and
// whether memory QoS can apply here — and when it cannot, a reason a person can act on, such
// as "hybrid hierarchy: the memory controller is on cgroup v1 (v2 has: hugetlb)".
// [Driver] tells the runtime's cgroup driver from a runtime spec's linux.cgroupsPath.
//
// # Memory QoS
//
// [MemoryQoS] computes a container's memory.min, memory.low and memory.high exactly as the
// kubelet 1.36 does with its MemoryQoS feature gate (KEP-2570, with its memoryThrottlingFactor
// and memoryReservationPolicy), and [MemoryQoSValues.AddTo] adds them to a CRI request's
// unified map unless the kubelet did its own memory QoS. A container without a memory limit
// is throttled below the node's allocatable memory: [NodeAllocatable] takes it from the
// kubelet's configuration file ([ReadKubeletConfig]), else the Node object, else MemTotal
// ([ReadMemTotal]), and says which. All of it is pure but the file reads: the caller decides
// whether the node can do memory QoS ([Node]).
//
// # What was asked, what is held
//
// [SpecResources] turns the CRI's LinuxContainerResources into the runtime spec's
// LinuxResources the way containerd's CRI plugin does; that is what the runtime (runc) applies.
// [Read] reads a container's cgroup — v1 or v2, cgroupfs or systemd driver — resolving it
// through github.com/containerd/cgroups/v3 and reading the limit files of the directories
// found (cgroups/v3 exposes statistics, not limits). [Compare] says where the two differ,
// converting as the runtime does (CPU shares to cgroup v2 weight, memory+swap to swap alone,
// "max", page rounding, CPU lists as sets).
//
// # Safety
//
// A cgroups path comes from the runtime, and ultimately from the kubelet: [Read] refuses
// (errdefs.ErrInvalidArgument) a path with "..", a path that is not clean, a relative
// cgroupfs path, and NUL bytes, and opens the cgroup's directory beneath the cgroup mount with
// [os.Root], so not even a symlink leads out of it. The package never writes to a cgroup.
//
// Errors are classified with github.com/containerd/errdefs: a cgroup that does not exist is
// errdefs.ErrNotFound, a refused argument errdefs.ErrInvalidArgument.
//
// The package is for Linux: elsewhere Detect says cgroups are unavailable and Read fails.
package cgroup
