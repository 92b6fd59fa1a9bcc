package registry

// CgroupHeld is what a container's cgroup held at its last verification: the resources
// feature's reading (resources/cgroup.Held), kept here as plain data so that the registry
// depends on no feature. It has the same fields, in the same order, as that type, which
// converts to it; the comments there say more of each. Memory amounts are bytes; -1 is
// unlimited. A field whose file does not exist is unset.
type CgroupHeld struct {
	// Mode is the node's cgroup mode (unified, hybrid, legacy).
	Mode string
	// Version is the cgroup version the limits were read from: 1 or 2.
	Version int
	// Driver is the cgroup driver the cgroups path was written for (systemd, cgroupfs).
	Driver string
	// Path is the cgroup's path below each hierarchy's root, a systemd path expanded.
	Path string
	// Dirs are the directories read, by controller ("cpu", "unified").
	Dirs map[string]string
	// PageSize is the node's page size, to which the kernel rounds memory limits down.
	PageSize int64

	// CPUShares is cpu.shares (cgroup v1).
	CPUShares *uint64
	// CPUWeight is cpu.weight (cgroup v2).
	CPUWeight *uint64
	// CPUQuota is the CFS quota in µs; -1 is no quota.
	CPUQuota *int64
	// CPUPeriod is the CFS period in µs.
	CPUPeriod *uint64
	// CPUs is cpuset.cpus as the kernel shows it.
	CPUs string
	// EffectiveCPUs is what the kernel grants (the effective cpuset).
	EffectiveCPUs string
	// Mems is cpuset.mems.
	Mems string
	// MemoryLimit is memory.limit_in_bytes (v1) or memory.max (v2).
	MemoryLimit *int64
	// MemoryMin is memory.min (v2 only).
	MemoryMin *int64
	// MemoryHigh is memory.high (v2 only).
	MemoryHigh *int64
	// Swap is memory and swap together on cgroup v1, swap alone on cgroup v2.
	Swap *int64
	// Hugepages are the hugetlb limits by page size ("2MB").
	Hugepages map[string]int64

	// Files are the files read, by name ("cpu.max"), each its content trimmed.
	Files map[string]string
	// Absent are the files looked for that do not exist, by name.
	Absent []string
}
