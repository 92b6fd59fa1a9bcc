package cgroup

import (
	"testing"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// BenchmarkRead reads a container's cgroup in this machine's cgroup v1 hierarchies (root): the
// I/O of one background verification.
func BenchmarkRead(b *testing.B) {
	realV1(b)
	path := "/podgate-test-" + randomName(b)
	makeV1Cgroup(b, path, containerLimits())
	for b.Loop() {
		if _, err := Read(b.Context(), path); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkReadV2Tree reads a container's cgroup, systemd driver, in a cgroup v2 tree laid out
// in a temporary directory (regular files: cheaper than cgroupfs, the path resolution is the
// same).
func BenchmarkReadV2Tree(b *testing.B) {
	root := v2Tree(b)
	for b.Loop() {
		if _, err := Read(b.Context(), besteffortPath, WithMode(ModeUnified), WithRoot(root)); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCompare compares a Burstable container's request with its cgroup v2 cgroup: the
// CPU of one background verification, SpecResources included.
func BenchmarkCompare(b *testing.B) {
	held := heldFrom(b, 2, v2Files512, map[string]string{"memory.min": "33554432", "memory.high": "62914560"})
	req := &runtimeapi.LinuxContainerResources{
		CpuShares: 512, CpuQuota: 50000, CpuPeriod: 100000, CpusetCpus: "0,1", CpusetMems: "0",
		MemoryLimitInBytes: 64 * mib,
		HugepageLimits:     []*runtimeapi.HugepageLimit{{PageSize: "2MB", Limit: 0}},
		Unified:            map[string]string{"memory.min": "33554432", "memory.high": "62914560", "memory.oom.group": "0"},
	}
	b.Run("compare", func(b *testing.B) {
		asked := SpecResources(req, WithSwapController(true), WithHugetlbController(false))
		for b.Loop() {
			if m := Compare(asked, held); len(m) != 0 {
				b.Fatal(m)
			}
		}
	})
	b.Run("spec+compare", func(b *testing.B) {
		for b.Loop() {
			if m := Compare(SpecResources(req, WithSwapController(true), WithHugetlbController(false)), held); len(m) != 0 {
				b.Fatal(m)
			}
		}
	})
}
