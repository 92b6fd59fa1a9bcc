package cgroup

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// Held is what a container's cgroup holds, as [Read] found it. A field whose file does not
// exist (its controller is not there, e.g. memory on cgroup v2 of a hybrid node) is unset: a
// nil pointer, an empty string, no map entry. Memory amounts are bytes; -1 is unlimited (cgroup
// v1's largest page-aligned number, cgroup v2's "max").
type Held struct {
	// Mode is the node's cgroup mode (ModeUnified, ModeHybrid, ModeLegacy).
	Mode string
	// Version is the cgroup version the limits were read from: 1 in legacy and hybrid mode, 2
	// in unified mode.
	Version int
	// Driver is the cgroup driver the cgroups path was written for (DriverSystemd,
	// DriverCgroupfs).
	Driver string
	// Path is the cgroup's path below each hierarchy's root, a systemd path expanded:
	// "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod123.slice/cri-containerd-abc.scope".
	Path string
	// Dirs are the directories read, by controller: "cpu", "cpuset", "memory", "hugetlb" on
	// cgroup v1 (in hybrid mode "hugetlb" may be the v2 directory), "unified" on cgroup v2.
	Dirs map[string]string
	// PageSize is the node's page size, to which the kernel rounds memory limits down.
	PageSize int64

	// CPUShares is cpu.shares (cgroup v1).
	CPUShares *uint64
	// CPUWeight is cpu.weight (cgroup v2).
	CPUWeight *uint64
	// CPUQuota is cpu.cfs_quota_us (v1) or cpu.max's quota (v2), in µs; -1 is no quota.
	CPUQuota *int64
	// CPUPeriod is cpu.cfs_period_us (v1) or cpu.max's period (v2), in µs.
	CPUPeriod *uint64
	// CPUs is cpuset.cpus as the kernel shows it; on cgroup v2 empty when not set (the
	// parent's CPUs apply).
	CPUs string
	// EffectiveCPUs is what the kernel grants: cpuset.effective_cpus (v1) or
	// cpuset.cpus.effective (v2).
	EffectiveCPUs string
	// Mems is cpuset.mems.
	Mems string
	// MemoryLimit is memory.limit_in_bytes (v1) or memory.max (v2).
	MemoryLimit *int64
	// MemoryMin is memory.min (v2 only).
	MemoryMin *int64
	// MemoryHigh is memory.high (v2 only).
	MemoryHigh *int64
	// Swap is memory.memsw.limit_in_bytes on cgroup v1 — memory and swap together, as the
	// runtime spec's swap — or memory.swap.max on cgroup v2 — swap alone.
	Swap *int64
	// Hugepages are the hugetlb limits by page size ("2MB"): hugetlb.<size>.limit_in_bytes
	// (v1) or hugetlb.<size>.max (v2).
	Hugepages map[string]int64

	// Files are the files read, by name ("cpu.max"), each its content trimmed.
	Files map[string]string
	// Absent are the files looked for that do not exist, by name.
	Absent []string
}

// ReadOption changes what [Read] reads, or where.
type ReadOption func(*readConfig)

type readConfig struct {
	mode    string // "" is the node's
	root    string
	v2Mount string // "" is the mode's
	unified []string
}

// WithMode reads the cgroup as a node of mode (ModeUnified, ModeHybrid, ModeLegacy) would
// hold it, instead of the node's mode (cgroups/v3's Mode). For tests, with [WithRoot].
func WithMode(mode string) ReadOption {
	return func(c *readConfig) { c.mode = mode }
}

// WithRoot reads hierarchies mounted under root instead of [DefaultRoot]: cgroup v1
// controllers at root/<controller>, cgroup v2 at root (unified mode) or root/unified
// (hybrid). For tests, which lay out a tree of their own.
func WithRoot(root string) ReadOption {
	return func(c *readConfig) { c.root = root }
}

// WithV2Mountpoint reads cgroup v2 at dir instead of where the mode mounts it, as
// cgroups/v3's cgroup2.WithMountpoint.
func WithV2Mountpoint(dir string) ReadOption {
	return func(c *readConfig) { c.v2Mount = dir }
}

// WithUnifiedKeys reads these cgroup v2 files too ("io.weight"), into [Held.Files],
// so that [Compare] can compare a unified map's keys beyond those Read always reads (the cpu,
// cpuset, memory and hugetlb limits above, and memory.oom.group). A key must be a file name
// (no "/"); Read refuses others. On cgroup v1 they are not read: runc refuses unified keys
// there.
func WithUnifiedKeys(keys ...string) ReadOption {
	return func(c *readConfig) { c.unified = append(c.unified, keys...) }
}

// ForResources reads what [Compare] needs to compare asked: the files of its unified map
// (see [WithUnifiedKeys]).
func ForResources(asked *specs.LinuxResources) ReadOption {
	return func(c *readConfig) {
		if asked == nil {
			return
		}
		for k := range asked.Unified {
			c.unified = append(c.unified, k)
		}
	}
}

// fill sets the fields of h from its Files, as the cgroup version names them.
func (h *Held) fill() error {
	p := parser{files: h.Files, pageSize: max(h.PageSize, 1)}
	if h.Version == 2 {
		h.CPUWeight = p.uint("cpu.weight")
		h.CPUQuota, h.CPUPeriod = p.cpuMax()
		h.CPUs, h.EffectiveCPUs, h.Mems = h.Files["cpuset.cpus"], h.Files["cpuset.cpus.effective"], h.Files["cpuset.mems"]
		h.MemoryMin, h.MemoryHigh = p.v2Bytes("memory.min"), p.v2Bytes("memory.high")
		h.MemoryLimit, h.Swap = p.v2Bytes("memory.max"), p.v2Bytes("memory.swap.max")
	} else {
		h.CPUShares = p.uint("cpu.shares")
		h.CPUQuota, h.CPUPeriod = p.int("cpu.cfs_quota_us"), p.uint("cpu.cfs_period_us")
		h.CPUs, h.EffectiveCPUs, h.Mems = h.Files["cpuset.cpus"], h.Files["cpuset.effective_cpus"], h.Files["cpuset.mems"]
		h.MemoryLimit, h.Swap = p.v1Bytes("memory.limit_in_bytes"), p.v1Bytes("memory.memsw.limit_in_bytes")
	}
	// Hugepages: v1's files, or v2's (in hybrid mode too, where hugetlb can be on v2).
	for name := range h.Files {
		var v *int64
		size, ok := hugepageSize(name, ".limit_in_bytes")
		if ok {
			v = p.v1Bytes(name)
		} else if size, ok = hugepageSize(name, ".max"); ok {
			v = p.v2Bytes(name)
		}
		if v != nil {
			if h.Hugepages == nil {
				h.Hugepages = map[string]int64{}
			}
			h.Hugepages[size] = *v
		}
	}
	return p.err
}

// parser parses the trimmed contents of a cgroup's files, and remembers the first file it
// could not parse. A file not among them is nil.
type parser struct {
	files    map[string]string
	pageSize int64
	err      error
}

// get is the content of a file, if read.
func (p *parser) get(name string) (string, bool) {
	s, ok := p.files[name]
	return s, ok
}

// fail records a file whose content is not what the kernel writes.
func (p *parser) fail(name, s string, err error) {
	if p.err == nil {
		p.err = fmt.Errorf("%w: %s: unexpected content %q: %w", errdefs.ErrInternal, name, s, err)
	}
}

// uint parses a number.
func (p *parser) uint(name string) *uint64 {
	s, ok := p.get(name)
	if !ok {
		return nil
	}
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		p.fail(name, s, err)
		return nil
	}
	return &v
}

// int parses a signed number.
func (p *parser) int(name string) *int64 {
	s, ok := p.get(name)
	if !ok {
		return nil
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		p.fail(name, s, err)
		return nil
	}
	return &v
}

// v1Bytes parses a cgroup v1 byte limit; the kernel's "unlimited" (its largest page-aligned
// number, 9223372036854771712 with 4 KiB pages) is -1.
func (p *parser) v1Bytes(name string) *int64 {
	s, ok := p.get(name)
	if !ok {
		return nil
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		// The kernel prints an unsigned page counter; beyond int64 is unlimited too.
		if u, uerr := strconv.ParseUint(s, 10, 64); uerr == nil && u > math.MaxInt64 {
			v = -1
			return &v
		}
		p.fail(name, s, err)
		return nil
	}
	if UnlimitedBytes(v, p.pageSize) {
		v = -1
	}
	return &v
}

// v2Bytes parses a cgroup v2 value that is a number or "max" (-1).
func (p *parser) v2Bytes(name string) *int64 {
	s, ok := p.get(name)
	if !ok {
		return nil
	}
	v, ok := parseMax(s)
	if !ok {
		p.fail(name, s, fmt.Errorf("want a number or max"))
		return nil
	}
	return &v
}

// cpuMax parses cgroup v2 cpu.max, "$MAX $PERIOD" ("max 100000", "50000 100000").
func (p *parser) cpuMax() (quota *int64, period *uint64) {
	s, ok := p.get("cpu.max")
	if !ok {
		return nil, nil
	}
	f := strings.Fields(s)
	if len(f) != 2 {
		p.fail("cpu.max", s, fmt.Errorf("want quota and period"))
		return nil, nil
	}
	q, qok := parseMax(f[0])
	per, err := strconv.ParseUint(f[1], 10, 64)
	if !qok || err != nil {
		p.fail("cpu.max", s, fmt.Errorf("want a number or max, and a number"))
		return nil, nil
	}
	return &q, &per
}

// hugepageSize is the page size of a hugetlb file ("hugetlb.2MB.max" → "2MB"), and whether
// name is a limit file of that suffix (not the reservation's, hugetlb.2MB.rsvd.max).
func hugepageSize(name, suffix string) (string, bool) {
	size, ok := strings.CutPrefix(name, "hugetlb.")
	if !ok {
		return "", false
	}
	size, ok = strings.CutSuffix(size, suffix)
	if !ok || size == "" || strings.Contains(size, ".") {
		return "", false
	}
	return size, true
}
