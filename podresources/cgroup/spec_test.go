package cgroup

import (
	"encoding/json"
	"testing"

	"github.com/google/go-cmp/cmp"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

func ptr[T any](v T) *T { return &v }

func TestSpecResources(t *testing.T) {
	full := &runtimeapi.LinuxContainerResources{
		CpuPeriod: 100000, CpuQuota: 50000, CpuShares: 512,
		MemoryLimitInBytes: 64 * mib, MemorySwapLimitInBytes: 128 * mib,
		CpusetCpus: "0-1", CpusetMems: "0",
		HugepageLimits: []*runtimeapi.HugepageLimit{{PageSize: "2MB", Limit: uint64(4 * mib)}, {PageSize: "1GB", Limit: 0}},
		Unified:        map[string]string{"memory.oom.group": "1"},
		OomScoreAdj:    100, // not a cgroup limit
	}
	empty := &specs.LinuxResources{CPU: &specs.LinuxCPU{}, Memory: &specs.LinuxMemory{}}
	for _, tc := range []struct {
		name    string
		in      *runtimeapi.LinuxContainerResources
		swap    bool
		hugetlb bool
		want    *specs.LinuxResources
	}{{
		name: "nil", in: nil, want: nil,
	}, {
		name: "all zero: nothing set", in: &runtimeapi.LinuxContainerResources{}, swap: true, hugetlb: true, want: empty,
	}, {
		name: "everything", in: full, swap: true, hugetlb: true,
		want: &specs.LinuxResources{
			CPU:    &specs.LinuxCPU{Shares: ptr(uint64(512)), Quota: ptr(int64(50000)), Period: ptr(uint64(100000)), Cpus: "0-1", Mems: "0"},
			Memory: &specs.LinuxMemory{Limit: ptr(64 * mib), Swap: ptr(128 * mib)},
			HugepageLimits: []specs.LinuxHugepageLimit{
				{Pagesize: "2MB", Limit: uint64(4 * mib)}, {Pagesize: "1GB", Limit: 0},
			},
			Unified: map[string]string{"memory.oom.group": "1"},
		},
	}, {
		name: "no swap or hugetlb controller", in: full,
		want: &specs.LinuxResources{
			CPU:     &specs.LinuxCPU{Shares: ptr(uint64(512)), Quota: ptr(int64(50000)), Period: ptr(uint64(100000)), Cpus: "0-1", Mems: "0"},
			Memory:  &specs.LinuxMemory{Limit: ptr(64 * mib)},
			Unified: map[string]string{"memory.oom.group": "1"},
		},
	}, {
		name: "swap defaults to the limit", in: &runtimeapi.LinuxContainerResources{MemoryLimitInBytes: 64 * mib}, swap: true,
		want: &specs.LinuxResources{CPU: &specs.LinuxCPU{}, Memory: &specs.LinuxMemory{Limit: ptr(64 * mib), Swap: ptr(64 * mib)}},
	}, {
		name: "swap without limit", in: &runtimeapi.LinuxContainerResources{MemorySwapLimitInBytes: -1}, swap: true,
		want: &specs.LinuxResources{CPU: &specs.LinuxCPU{}, Memory: &specs.LinuxMemory{Swap: ptr(int64(-1))}},
	}, {
		name: "no quota", in: &runtimeapi.LinuxContainerResources{CpuQuota: -1, CpuPeriod: 100000, CpuShares: 2},
		want: &specs.LinuxResources{CPU: &specs.LinuxCPU{Shares: ptr(uint64(2)), Quota: ptr(int64(-1)), Period: ptr(uint64(100000))}, Memory: &specs.LinuxMemory{}},
	}, {
		name: "empty unified map kept", in: &runtimeapi.LinuxContainerResources{Unified: map[string]string{}},
		want: &specs.LinuxResources{CPU: &specs.LinuxCPU{}, Memory: &specs.LinuxMemory{}, Unified: map[string]string{}},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			got := SpecResources(tc.in, WithSwapController(tc.swap), WithHugetlbController(tc.hugetlb))
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("SpecResources (-want +got):\n%s", diff)
			}
		})
	}
}

// TestSpecResourcesCopiesUnified checks the spec does not share the request's map: memory QoS
// changes the request's.
func TestSpecResourcesCopiesUnified(t *testing.T) {
	in := &runtimeapi.LinuxContainerResources{Unified: map[string]string{"memory.min": "1"}}
	got := SpecResources(in, WithSwapController(false))
	in.Unified["memory.min"] = "2"
	if got.Unified["memory.min"] != "1" {
		t.Errorf("the spec's unified map follows the request's: %v", got.Unified)
	}
}

// TestSpecResourcesHugepagesAsContainerdByDefault: without WithHugetlbController,
// SpecResources drops the kubelet's hugepage limits, as containerd does with its default
// disable_hugetlb_controller = true. On a cgroup v2 node with the hugetlb controller (the VM
// lane, test/vm) the container's hugetlb.<size>.max then stays "max", and expecting the
// kubelet's 0 there made every container's verification a mismatch.
func TestSpecResourcesHugepagesAsContainerdByDefault(t *testing.T) {
	in := &runtimeapi.LinuxContainerResources{
		MemoryLimitInBytes: 64 * mib,
		HugepageLimits:     []*runtimeapi.HugepageLimit{{PageSize: "2MB", Limit: 0}, {PageSize: "1GB", Limit: 0}},
	}
	if got := SpecResources(in, WithSwapController(false)); got.HugepageLimits != nil {
		t.Errorf("SpecResources without WithHugetlbController: hugepage limits %v, want none (containerd's default drops them)", got.HugepageLimits)
	}
	if got := SpecResources(in, WithSwapController(false), WithHugetlbController(true)); len(got.HugepageLimits) != 2 {
		t.Errorf("SpecResources WithHugetlbController(true): hugepage limits %v, want the request's two", got.HugepageLimits)
	}
}

// TestUpdateSpecResources: an UpdateContainerResources is laid over what the container asked,
// as containerd lays it over the runtime spec: a zero or empty value keeps the earlier one.
func TestUpdateSpecResources(t *testing.T) {
	created := &runtimeapi.LinuxContainerResources{
		CpuPeriod: 100000, CpuQuota: 50000, CpuShares: 512, MemoryLimitInBytes: 64 * mib, CpusetCpus: "0-1",
		HugepageLimits: []*runtimeapi.HugepageLimit{{PageSize: "2MB", Limit: 0}},
		Unified:        map[string]string{"memory.oom.group": "1"},
	}
	opts := []SpecOption{WithSwapController(true), WithHugetlbController(true)}
	for _, tc := range []struct {
		name    string
		current *specs.LinuxResources
		update  *runtimeapi.LinuxContainerResources
		want    *specs.LinuxResources
	}{{
		name: "nil update changes nothing", current: SpecResources(created, opts...), update: nil,
		want: SpecResources(created, opts...),
	}, {
		// kubelet 1.38, a memory resize of a container without a CPU limit: its CPU
		// limit is 0 (no quota) and stays unset.
		name: "memory resize, no CPU limit", current: SpecResources(&runtimeapi.LinuxContainerResources{CpuPeriod: 100000, CpuShares: 102, MemoryLimitInBytes: 64 * mib}, opts...),
		update: &runtimeapi.LinuxContainerResources{CpuPeriod: 100000, CpuShares: 102, MemoryLimitInBytes: 128 * mib},
		want: &specs.LinuxResources{
			CPU:    &specs.LinuxCPU{Shares: ptr(uint64(102)), Period: ptr(uint64(100000))},
			Memory: &specs.LinuxMemory{Limit: ptr(128 * mib), Swap: ptr(128 * mib)},
		},
	}, {
		name: "zeros keep the earlier values", current: SpecResources(created, opts...),
		update: &runtimeapi.LinuxContainerResources{MemoryLimitInBytes: 128 * mib},
		want: &specs.LinuxResources{
			CPU:            &specs.LinuxCPU{Shares: ptr(uint64(512)), Quota: ptr(int64(50000)), Period: ptr(uint64(100000)), Cpus: "0-1"},
			Memory:         &specs.LinuxMemory{Limit: ptr(128 * mib), Swap: ptr(128 * mib)},
			HugepageLimits: []specs.LinuxHugepageLimit{{Pagesize: "2MB", Limit: 0}},
			Unified:        map[string]string{"memory.oom.group": "1"},
		},
	}, {
		name: "values replace, unified keys and hugepages merge", current: SpecResources(created, opts...),
		update: &runtimeapi.LinuxContainerResources{
			CpuQuota: -1, CpuShares: 1024, CpusetCpus: "2",
			HugepageLimits: []*runtimeapi.HugepageLimit{{PageSize: "2MB", Limit: uint64(4 * mib)}, {PageSize: "1GB", Limit: 0}},
			Unified:        map[string]string{"memory.high": "max"},
		},
		want: &specs.LinuxResources{
			CPU:            &specs.LinuxCPU{Shares: ptr(uint64(1024)), Quota: ptr(int64(-1)), Period: ptr(uint64(100000)), Cpus: "2"},
			Memory:         &specs.LinuxMemory{Limit: ptr(64 * mib), Swap: ptr(64 * mib)},
			HugepageLimits: []specs.LinuxHugepageLimit{{Pagesize: "2MB", Limit: uint64(4 * mib)}, {Pagesize: "1GB", Limit: 0}},
			Unified:        map[string]string{"memory.oom.group": "1", "memory.high": "max"},
		},
	}, {
		name: "nothing asked before", current: nil, update: &runtimeapi.LinuxContainerResources{CpuShares: 2},
		want: &specs.LinuxResources{CPU: &specs.LinuxCPU{Shares: ptr(uint64(2))}, Memory: &specs.LinuxMemory{}},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			before := copyJSON(t, tc.current)
			got := UpdateSpecResources(tc.current, tc.update, opts...)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("UpdateSpecResources (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(before, tc.current); diff != "" {
				t.Errorf("UpdateSpecResources changed what was current (-before +after):\n%s", diff)
			}
		})
	}
}

// copyJSON is a deep copy of r.
func copyJSON(t *testing.T, r *specs.LinuxResources) *specs.LinuxResources {
	t.Helper()
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	var out *specs.LinuxResources
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	return out
}
