package cgroup

import (
	"cmp"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// Mismatch is a limit a cgroup does not hold as asked.
type Mismatch struct {
	// Field is the cgroup file ("cpu.shares", "memory.max"), with the part of it meant when
	// the file holds two values ("cpu.max quota").
	Field string
	// Asked is the value the file should hold, as the runtime converts what was asked
	// (e.g. "100 (cpu shares 1024)").
	Asked string
	// Held is what the file holds; "absent" when it does not exist, "not read" when [Read] did
	// not read it (a unified key without [ForResources]).
	Held string
}

// String shows the mismatch as "field: asked X, cgroup holds Y".
func (m Mismatch) String() string {
	return m.Field + ": asked " + m.Asked + ", cgroup holds " + m.Held
}

// Compare says where a cgroup does not hold what was asked: asked is the container's runtime
// spec resources ([SpecResources] of its CRI request), held what [Read] found. Only what was
// asked is compared — a nil pointer, a zero number (which the runtime leaves alone) or an
// empty string is not — and the comparison is the runtime's (runc v1.5.2) view of the cgroup:
//
//   - CPU shares: cpu.shares on cgroup v1; on v2 cpu.weight, converted with
//     [CPUSharesToWeight] as runc converts them (as the kubelet does with [WrittenByKubelet]).
//   - Quota and period: cpu.cfs_quota_us and cpu.cfs_period_us, or cpu.max on v2; a negative
//     quota is no quota (-1, "max"): the kubelet 1.38 asks -1 for a pod or container with
//     exclusive CPUs (pkg/kubelet/kuberuntime/kuberuntime_container_linux.go,
//     calculateLinuxResources; doPodResizeAction's ResourceConfigForPod with CFS quota off),
//     less the overhead's quota in UpdatePodSandboxResources.
//   - cpuset CPUs and mems, as sets: "0-3" is "0,1,2,3".
//   - Memory limit: memory.limit_in_bytes or memory.max, rounded down to the page size as
//     the kernel does; -1 is unlimited, and so is cgroup v1's unlimited number
//     ([UnlimitedBytes]), which the kubelet sends back for a pod cgroup without a limit.
//   - Swap: on cgroup v1 memory.memsw.limit_in_bytes, memory and swap together as the spec
//     means it (-1 also when the memory limit is -1, as runc sets it); on v2 memory.swap.max,
//     swap alone, converted as runc converts it (swap − memory, "0" when they are equal,
//     unset when both are; a missing file is fine where runc ignores it: for "max" and "0").
//   - Hugepage limits by page size, rounded down to the huge page size.
//   - Unified keys (cgroup v2): the file's content, trimmed, against the value — byte amounts
//     page-rounded, cpu.max's period optional, CPU lists as sets. A unified key overrides the
//     limit its file holds (runc writes the unified map last). On cgroup v1, where runc
//     refuses unified keys, each is a mismatch.
//
// Mismatches come in that order. A nil asked or held is no mismatch.
func Compare(asked *specs.LinuxResources, held *Held, opts ...CompareOption) []Mismatch {
	if asked == nil || held == nil {
		return nil
	}
	c := &comparer{asked: asked, held: held, v2: held.Version == 2, page: max(held.PageSize, 1), weight: CPUSharesToWeight}
	for _, o := range opts {
		o(c)
	}
	c.cpu(asked.CPU)
	c.memory(asked.Memory)
	c.hugepages(asked.HugepageLimits)
	c.unifiedKeys(asked.Unified)
	return c.out
}

// CompareOption changes how Compare reads a cgroup.
type CompareOption func(*comparer)

// WrittenByKubelet compares a cgroup the kubelet writes itself (a pod's cgroup, not a
// container's): on cgroup v2 its cpu.weight is the kubelet's conversion of the CPU shares
// ([KubeletCPUSharesToWeight]), not runc's.
func WrittenByKubelet() CompareOption {
	return func(c *comparer) { c.weight = KubeletCPUSharesToWeight }
}

// comparer collects the mismatches of one Compare.
type comparer struct {
	asked *specs.LinuxResources
	held  *Held
	v2    bool
	page  int64
	// weight converts CPU shares to the cgroup v2 cpu.weight the cgroup's writer writes.
	weight func(uint64) uint64
	out    []Mismatch
}

// add records a mismatch of field, showing what file holds.
func (c *comparer) add(field, asked, file string) {
	c.out = append(c.out, Mismatch{Field: field, Asked: asked, Held: c.shown(file)})
}

// shown is what a file holds, for a person.
func (c *comparer) shown(file string) string {
	if s, ok := c.held.Files[file]; ok {
		if s == "" {
			return `""`
		}
		return s
	}
	if slices.Contains(c.held.Absent, file) {
		return "absent"
	}
	return "not read"
}

// overridden tells whether a unified key sets file on cgroup v2, where runc writes it last.
func (c *comparer) overridden(file string) bool {
	_, ok := c.asked.Unified[file]
	return c.v2 && ok
}

func (c *comparer) cpu(cpu *specs.LinuxCPU) {
	if cpu == nil {
		return
	}
	h := c.held
	if cpu.Shares != nil && *cpu.Shares != 0 {
		switch {
		case !c.v2:
			if !equal(h.CPUShares, *cpu.Shares) {
				c.add("cpu.shares", strconv.FormatUint(*cpu.Shares, 10), "cpu.shares")
			}
		case !c.overridden("cpu.weight"):
			if w := c.weight(*cpu.Shares); !equal(h.CPUWeight, w) {
				c.add("cpu.weight", fmt.Sprintf("%d (cpu shares %d)", w, *cpu.Shares), "cpu.weight")
			}
		}
	}
	c.cpuMax(cpu.Quota, cpu.Period)
	if cpu.Cpus != "" && !c.overridden("cpuset.cpus") && !sameCPUSet(cpu.Cpus, h.CPUs) {
		c.add("cpuset.cpus", cpu.Cpus, "cpuset.cpus")
	}
	if cpu.Mems != "" && !c.overridden("cpuset.mems") && !sameCPUSet(cpu.Mems, h.Mems) {
		c.add("cpuset.mems", cpu.Mems, "cpuset.mems")
	}
}

// cpuMax compares the CFS quota and period.
func (c *comparer) cpuMax(quota *int64, period *uint64) {
	qField, qFile, pField, pFile := "cpu.cfs_quota_us", "cpu.cfs_quota_us", "cpu.cfs_period_us", "cpu.cfs_period_us"
	if c.v2 {
		if c.overridden("cpu.max") {
			return
		}
		qField, qFile, pField, pFile = "cpu.max quota", "cpu.max", "cpu.max period", "cpu.max"
	}
	if quota != nil && *quota != 0 {
		want := max(*quota, -1) // any negative quota is none
		if !equal(c.held.CPUQuota, want) {
			c.add(qField, c.showUnlimited(want, "-1 (no quota)"), qFile)
		}
	}
	if period != nil && *period != 0 && !equal(c.held.CPUPeriod, *period) {
		c.add(pField, strconv.FormatUint(*period, 10), pFile)
	}
}

func (c *comparer) memory(m *specs.LinuxMemory) {
	if m == nil {
		return
	}
	var limit, swap int64
	if m.Limit != nil {
		limit = *m.Limit
	}
	if m.Swap != nil {
		swap = *m.Swap
	}
	file := "memory.limit_in_bytes"
	if c.v2 {
		file = "memory.max"
	}
	if limit != 0 && !c.overridden(file) {
		if want := c.bytes(limit); !equal(c.held.MemoryLimit, want) {
			c.add(file, c.showBytes(want), file)
		}
	}
	if c.v2 {
		c.swapV2(swap, limit)
		return
	}
	c.swapV1(swap, limit)
}

// swapV1 compares cgroup v1's memory+swap limit, as runc's fs driver sets it.
func (c *comparer) swapV1(swap, limit int64) {
	const file = "memory.memsw.limit_in_bytes"
	if limit == -1 && swap == 0 && c.held.Swap != nil {
		swap = -1 // runc: unlimited memory, swap not set: both unlimited
	}
	if swap == 0 {
		return
	}
	if want := c.bytes(swap); !equal(c.held.Swap, want) {
		c.add(file, c.showBytes(want), file)
	}
}

// swapV2 compares cgroup v2's swap limit, as runc's fs2 driver sets it.
func (c *comparer) swapV2(swap, limit int64) {
	const file = "memory.swap.max"
	if c.overridden(file) {
		return
	}
	want, err := swapToV2(swap, limit)
	switch {
	case err != nil:
		c.add(file, fmt.Sprintf("nothing: runc refuses swap %d with memory limit %d (%v)", swap, limit, err), file)
		return
	case want == 0 && swap == 0:
		return // unset
	case c.held.Swap == nil && (want == -1 || want == 0):
		return // no swap accounting: runc ignores "max" and "0"
	}
	if want = c.bytes(want); !equal(c.held.Swap, want) {
		c.add(file, c.showBytes(want), file)
	}
}

func (c *comparer) hugepages(limits []specs.LinuxHugepageLimit) {
	for _, l := range limits {
		file := c.hugetlbFile(l.Pagesize)
		if c.overridden(file) {
			continue
		}
		want := int64(-1)
		if l.Limit <= math.MaxInt64 {
			want = int64(l.Limit)
			if size, ok := parsePageSize(l.Pagesize); ok {
				want = want / size * size // the kernel counts whole huge pages
			}
		}
		got, ok := c.held.Hugepages[l.Pagesize]
		switch {
		case !ok:
			// No such file: no hugetlb controller, or no such page size.
			c.out = append(c.out, Mismatch{Field: file, Asked: c.showUnlimited(want, "unlimited"), Held: "absent"})
		case got != want:
			c.add(file, c.showUnlimited(want, "unlimited"), file)
		}
	}
}

// hugetlbFile is the limit file of a huge page size: v2's where the limits were read from v2
// (unified mode, or hybrid without a v1 hugetlb hierarchy), v1's otherwise.
func (c *comparer) hugetlbFile(size string) string {
	v2 := c.v2
	for name := range c.held.Files {
		if _, ok := hugepageSize(name, ".max"); ok {
			v2 = true
			break
		}
	}
	if v2 {
		return "hugetlb." + size + ".max"
	}
	return "hugetlb." + size + ".limit_in_bytes"
}

func (c *comparer) unifiedKeys(unified map[string]string) {
	for _, k := range slices.Sorted(maps.Keys(unified)) {
		v := strings.TrimSpace(unified[k])
		if !c.v2 {
			c.out = append(c.out, Mismatch{Field: k, Asked: v, Held: "nothing: cgroup v1, where runc refuses unified keys"})
			continue
		}
		if got, ok := c.held.Files[k]; !ok || !sameUnified(k, v, got, c.page) {
			c.add(k, v, k)
		}
	}
}

// bytes is the amount the kernel holds for a byte limit: rounded down to the page size;
// negative, or as large as the kernel's "unlimited" or larger, is unlimited (-1).
func (c *comparer) bytes(v int64) int64 {
	if UnlimitedBytes(v, c.page) {
		return -1
	}
	return v / c.page * c.page
}

// UnlimitedBytes tells whether a byte limit asked of a cgroup means no limit: it is negative
// (-1, "max"), or no smaller than the largest limit the kernel holds, its page counter's
// maximum in bytes (math.MaxInt64 rounded down to pageSize: 9223372036854771712 with 4 KiB
// pages), which is what cgroup v1's memory.limit_in_bytes shows when unlimited. The kernel
// takes any larger limit as that one (mm/page_counter.c, page_counter_memparse), and cgroup v2
// then shows "max".
//
// The kubelet asks for that number itself: for a pod without a memory limit, an in-place
// resize reads the pod cgroup's memory.limit_in_bytes back (kubelet 1.38.0-beta.0,
// pkg/kubelet/cm/cgroup_manager_linux.go, readCgroupMemoryConfig, called from
// kuberuntime_manager.go, doPodResizeAction, as currentPodMemoryConfig) and sends it in
// UpdatePodSandboxResources as the memory limit; a pod has none unless every container sets
// one or the pod does (component-helpers resource.PodLimits, kubernetes#141014).
func UnlimitedBytes(v, pageSize int64) bool {
	return v < 0 || v >= math.MaxInt64/max(pageSize, 1)*max(pageSize, 1)
}

// showBytes shows a byte limit as it should be in the file.
func (c *comparer) showBytes(v int64) string {
	return c.showUnlimited(v, "unlimited")
}

// showUnlimited shows v, and -1 as v1 says it or as "max" on v2.
func (c *comparer) showUnlimited(v int64, v1 string) string {
	switch {
	case v >= 0:
		return strconv.FormatInt(v, 10)
	case c.v2:
		return "max"
	}
	return v1
}

// equal tells whether a held value is set and is want.
func equal[T comparable](held *T, want T) bool {
	return held != nil && *held == want
}

// memoryKeys are the cgroup v2 files holding a byte amount or "max", which the kernel rounds
// down to the page size.
var memoryKeys = map[string]bool{
	"memory.min": true, "memory.low": true, "memory.high": true, "memory.max": true,
	"memory.swap.max": true, "memory.zswap.max": true,
}

// sameUnified tells whether cgroup v2 file k holding got holds the asked value.
func sameUnified(k, asked, got string, page int64) bool {
	if asked == got {
		return true
	}
	switch {
	case memoryKeys[k]:
		a, aok := parseMax(asked)
		g, gok := parseMax(got)
		if a >= 0 {
			a = a / page * page
		}
		return aok && gok && a == g
	case k == "cpu.max":
		// "$MAX [$PERIOD]": the period may be left out, the kernel then keeps its own.
		a, g := strings.Fields(asked), strings.Fields(got)
		return len(a) == 1 && len(g) == 2 && a[0] == g[0]
	case k == "cpuset.cpus" || k == "cpuset.mems":
		return sameCPUSet(asked, got)
	}
	return false
}

// parseMax parses a number or "max" (-1).
func parseMax(s string) (int64, bool) {
	if s == "max" {
		return -1, true
	}
	v, err := strconv.ParseInt(s, 10, 64)
	return v, err == nil
}

// parsePageSize parses a huge page size as the runtime spec and the kernel name them ("2MB",
// "1GB", "64KB": binary units).
func parsePageSize(s string) (int64, bool) {
	for i, unit := range []string{"KB", "MB", "GB", "TB", "PB"} {
		if n, ok := strings.CutSuffix(s, unit); ok {
			v, err := strconv.ParseInt(n, 10, 64)
			if err != nil || v <= 0 {
				return 0, false
			}
			return v << (10 * (i + 1)), true
		}
	}
	return 0, false
}

// sameCPUSet tells whether two CPU (or memory node) lists name the same set: "0-3" and
// "0,1,2,3" do. Lists that do not parse are compared as strings.
func sameCPUSet(a, b string) bool {
	ca, errA := canonicalCPUList(a)
	cb, errB := canonicalCPUList(b)
	if errA != nil || errB != nil {
		return a == b
	}
	return ca == cb
}

// canonicalCPUList turns a kernel CPU list ("0-3,5,4") into its canonical form ("0-5"):
// ranges sorted and merged. It never expands a range, so a huge one costs nothing.
func canonicalCPUList(s string) (string, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return "", nil
	}
	var ranges [][2]uint64
	for part := range strings.SplitSeq(s, ",") {
		lo, hi, isRange := strings.Cut(strings.TrimSpace(part), "-")
		l, err := strconv.ParseUint(lo, 10, 32)
		if err != nil {
			return "", err
		}
		h := l
		if isRange {
			if h, err = strconv.ParseUint(hi, 10, 32); err != nil {
				return "", err
			}
			if h < l {
				return "", fmt.Errorf("range %s is backwards", part)
			}
		}
		ranges = append(ranges, [2]uint64{l, h})
	}
	slices.SortFunc(ranges, func(x, y [2]uint64) int { return cmp.Compare(x[0], y[0]) })
	merged := ranges[:1]
	for _, r := range ranges[1:] {
		last := &merged[len(merged)-1]
		if r[0] <= last[1]+1 {
			last[1] = max(last[1], r[1])
			continue
		}
		merged = append(merged, r)
	}
	var out strings.Builder
	for i, r := range merged {
		if i > 0 {
			out.WriteByte(',')
		}
		out.WriteString(strconv.FormatUint(r[0], 10))
		if r[1] != r[0] {
			out.WriteString("-" + strconv.FormatUint(r[1], 10))
		}
	}
	return out.String(), nil
}
