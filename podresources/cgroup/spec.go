package cgroup

import (
	"bufio"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// SpecOption changes how [SpecResources] sees the node.
type SpecOption func(*specConfig)

type specConfig struct {
	swap, hugetlb func() bool
}

// WithSwapController says whether the node has a swap controller (cgroup v1
// memory.memsw.limit_in_bytes, cgroup v2 memory.swap.max), instead of looking. containerd
// sets swap only when it has.
func WithSwapController(available bool) SpecOption {
	return func(c *specConfig) { c.swap = func() bool { return available } }
}

// WithHugetlbController says whether the runtime passes hugepage limits on: containerd does
// with disable_hugetlb_controller = false where the node has the hugetlb controller (cgroup
// v1: mounted; cgroup v2: among the root's controllers). Without it, [SpecResources] assumes
// containerd's default, which does not.
func WithHugetlbController(present bool) SpecOption {
	return func(c *specConfig) { c.hugetlb = func() bool { return present } }
}

// SpecResources turns a CRI request's resources into the runtime spec's, as containerd's CRI
// plugin does (containerd v2.4 internal/cri/opts.WithResources) for CreateContainer and
// UpdateContainerResources — what the runtime then applies:
//
//   - CPU shares, quota and period, and memory limit, when not 0; cpuset CPUs and mems when
//     not empty; a zero or empty value stays unset (a nil pointer), as in containerd. CPU and
//     Memory are never nil.
//   - Swap (memory+swap, as the runtime spec means it): memory_swap_limit_in_bytes when not 0,
//     else the memory limit, so that the container does not swap by default; only when the
//     node has a swap controller.
//   - Hugepage limits, in order, only when [WithHugetlbController] says the runtime passes
//     them on. By default it does not: containerd's CRI plugin drops them unless its
//     disable_hugetlb_controller is false, and it is true by default (containerd 2.x
//     internal/cri/config, DefaultRuntimeConfig) — so on a cgroup v2 node with the hugetlb
//     controller, the kubelet's hugepage limits (0 for every page size) never reach runc, and
//     the container's hugetlb.<size>.max stays "max" (seen in the VM lane, test/vm).
//   - The unified map, copied.
//
// Whether the node has the swap controller is looked up once per process, as containerd
// does; [WithSwapController] says it instead. A nil r is nil.
func SpecResources(r *runtimeapi.LinuxContainerResources, opts ...SpecOption) *specs.LinuxResources {
	if r == nil {
		return nil
	}
	out := &specs.LinuxResources{}
	withResources(out, r, newSpecConfig(opts))
	return out
}

// UpdateSpecResources is [SpecResources] for an UpdateContainerResources of a container whose
// runtime spec resources were current: containerd lays the request over them (containerd v2.4
// internal/cri/server/container_update_resources_linux.go, updateOCIResource, with the same
// opts.WithResources), so a zero or empty value is absent and keeps what the container had,
// where SpecResources leaves it unset. The kubelet sends 0 for a limit the container does not
// have: the CPU limit in a memory resize, the memory limit in a CPU resize (kubelet
// 1.38.0-beta.0, pkg/kubelet/kuberuntime/kuberuntime_manager.go, updatePodContainerResources),
// and it takes a zero CPU request or limit in the runtime's ContainerStatus.resources as absent
// too (pkg/kubelet/kubelet_pods.go, convertContainerStatusResources). The unified map's keys are
// added to the current ones, and a hugepage limit replaces the current one of its page size
// (containerd appends it, and runc writes them in order). current is not changed; nil is a
// container whose spec asked nothing. A nil r changes nothing.
func UpdateSpecResources(current *specs.LinuxResources, r *runtimeapi.LinuxContainerResources, opts ...SpecOption) *specs.LinuxResources {
	if r == nil {
		return current
	}
	out := &specs.LinuxResources{}
	if current != nil {
		*out = *current // the pointers' values are never changed: only replaced
		out.HugepageLimits = slices.Clone(current.HugepageLimits)
		out.Unified = maps.Clone(current.Unified)
		if current.CPU != nil {
			cpu := *current.CPU
			out.CPU = &cpu
		}
		if current.Memory != nil {
			mem := *current.Memory
			out.Memory = &mem
		}
	}
	withResources(out, r, newSpecConfig(opts))
	return out
}

func newSpecConfig(opts []SpecOption) specConfig {
	c := specConfig{swap: swapControllerAvailable, hugetlb: containerdDefaultHugetlb}
	for _, o := range opts {
		o(&c)
	}
	return c
}

// withResources lays r over out as containerd's opts.WithResources does: what r sets (not 0,
// not empty) replaces out's; CPU and Memory are made when nil.
func withResources(out *specs.LinuxResources, r *runtimeapi.LinuxContainerResources, c specConfig) {
	if out.CPU == nil {
		out.CPU = &specs.LinuxCPU{}
	}
	if out.Memory == nil {
		out.Memory = &specs.LinuxMemory{}
	}
	if p := uint64(r.GetCpuPeriod()); p != 0 {
		out.CPU.Period = &p
	}
	if q := r.GetCpuQuota(); q != 0 {
		out.CPU.Quota = &q
	}
	if s := uint64(r.GetCpuShares()); s != 0 {
		out.CPU.Shares = &s
	}
	if cpus := r.GetCpusetCpus(); cpus != "" {
		out.CPU.Cpus = cpus
	}
	if mems := r.GetCpusetMems(); mems != "" {
		out.CPU.Mems = mems
	}
	limit, swap := r.GetMemoryLimitInBytes(), r.GetMemorySwapLimitInBytes()
	if limit != 0 {
		out.Memory.Limit = &limit
		if swap == 0 && c.swap() {
			out.Memory.Swap = &limit
		}
	}
	if swap != 0 && c.swap() {
		out.Memory.Swap = &swap
	}
	if hp := r.GetHugepageLimits(); len(hp) > 0 && c.hugetlb() {
		for _, l := range hp {
			out.HugepageLimits = slices.DeleteFunc(out.HugepageLimits, func(h specs.LinuxHugepageLimit) bool { return h.Pagesize == l.GetPageSize() })
			out.HugepageLimits = append(out.HugepageLimits, specs.LinuxHugepageLimit{Pagesize: l.GetPageSize(), Limit: l.GetLimit()})
		}
	}
	if u := r.GetUnified(); u != nil {
		if out.Unified == nil {
			out.Unified = make(map[string]string, len(u))
		}
		maps.Copy(out.Unified, u)
	}
}

// swapControllerAvailable is containerd's SwapControllerAvailable (internal/cri/opts,
// spec_linux.go): cgroup v1's memory.memsw.limit_in_bytes at the memory hierarchy's root, or
// cgroup v2's memory.swap.max in this process's own cgroup (the root has none).
var swapControllerAvailable = sync.OnceValue(func() bool {
	p := filepath.Join(DefaultRoot, "memory", "memory.memsw.limit_in_bytes")
	if Detect().Mode == ModeUnified {
		self, ok := selfUnifiedCgroup()
		if !ok {
			return false
		}
		p = filepath.Join(DefaultRoot, self, "memory.swap.max")
	}
	_, err := os.Stat(p)
	return err == nil
})

// containerdDefaultHugetlb is whether containerd with its default configuration passes the
// CRI's hugepage limits on to the runtime: never (disable_hugetlb_controller = true), whatever
// controllers the node has.
func containerdDefaultHugetlb() bool { return false }

// selfUnifiedCgroup is this process's cgroup v2 path, from /proc/self/cgroup ("0::/path").
func selfUnifiedCgroup() (string, bool) {
	f, err := os.Open("/proc/self/cgroup")
	if err != nil {
		return "", false
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if p, ok := strings.CutPrefix(s.Text(), "0::"); ok {
			return p, true
		}
	}
	return "", false
}
