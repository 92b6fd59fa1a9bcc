package cgroup

import (
	"math"
	"testing"

	"github.com/google/go-cmp/cmp"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// TestUnlimitedBytes: a byte limit is no limit when negative, or as large as the kernel's
// page counter holds (its "unlimited") or larger, for the node's page size.
func TestUnlimitedBytes(t *testing.T) {
	for _, tc := range []struct {
		v, page int64
		want    bool
	}{
		{-1, page, true},
		{-134217729, page, true}, // -1 less a 128 MiB overhead, as the kubelet sends it
		{0, page, false},
		{64 * mib, page, false},
		{9223372036854771712 - page, page, false},
		{9223372036854771712, page, true}, // cgroup v1's memory.limit_in_bytes, unlimited
		{math.MaxInt64, page, true},
		{9223372036854710272, 64 << 10, true}, // the same with 64 KiB pages
		{9223372036854710272 - 1, 64 << 10, false},
		{math.MaxInt64, 0, true}, // no page size: bytes
	} {
		if got := UnlimitedBytes(tc.v, tc.page); got != tc.want {
			t.Errorf("UnlimitedBytes(%d, %d) = %v, want %v", tc.v, tc.page, got, tc.want)
		}
	}
}

// TestCompareKubeletUnlimited: what the kubelet asks for no limit, by release, against
// cgroups that hold no limit (no mismatch) and against cgroups that hold one (a mismatch).
func TestCompareKubeletUnlimited(t *testing.T) {
	for _, tc := range []struct {
		name    string
		version int
		changes map[string]string
		asked   *runtimeapi.LinuxContainerResources // as the kubelet sends it
		want    []Mismatch
	}{{
		// kubelet 1.33–1.37 with DisableCPUQuotaWithExclusiveCPUs (on), 1.38 always:
		// calculateLinuxResources asks -1 for a container with exclusive CPUs.
		name: "v1 exclusive CPUs: quota -1", version: 1, changes: map[string]string{"cpu.shares": "2048", "cpu.cfs_quota_us": "-1"},
		asked: &runtimeapi.LinuxContainerResources{CpuShares: 2048, CpuQuota: -1, CpuPeriod: 100000, MemoryLimitInBytes: 64 * mib},
	}, {
		name: "v2 exclusive CPUs: quota -1", version: 2, changes: map[string]string{"cpu.weight": "174", "cpu.max": "max 100000"},
		asked: &runtimeapi.LinuxContainerResources{CpuShares: 2048, CpuQuota: -1, CpuPeriod: 100000, MemoryLimitInBytes: 64 * mib},
	}, {
		name: "v1 exclusive CPUs, a quota held", version: 1, changes: map[string]string{"cpu.shares": "2048", "cpu.cfs_quota_us": "200000"},
		asked: &runtimeapi.LinuxContainerResources{CpuShares: 2048, CpuQuota: -1, CpuPeriod: 100000, MemoryLimitInBytes: 64 * mib},
		want:  []Mismatch{{"cpu.cfs_quota_us", "-1 (no quota)", "200000"}},
	}, {
		name: "v2 exclusive CPUs, a quota held", version: 2, changes: map[string]string{"cpu.weight": "174", "cpu.max": "200000 100000"},
		asked: &runtimeapi.LinuxContainerResources{CpuShares: 2048, CpuQuota: -1, CpuPeriod: 100000, MemoryLimitInBytes: 64 * mib},
		want:  []Mismatch{{"cpu.max quota", "max", "200000 100000"}},
	}, {
		// An in-place resize of a pod without a memory limit: the kubelet sends the pod
		// cgroup's memory.limit_in_bytes back (readCgroupMemoryConfig).
		name: "v1 unlimited memory read back", version: 1,
		changes: map[string]string{"cpu.cfs_quota_us": "-1", "memory.limit_in_bytes": v1Unlimited, "memory.memsw.limit_in_bytes": v1Unlimited},
		asked:   &runtimeapi.LinuxContainerResources{CpuShares: 512, CpuQuota: -1, CpuPeriod: 100000, MemoryLimitInBytes: 9223372036854771712},
	}, {
		name: "v1 unlimited memory read back, a limit held", version: 1,
		changes: map[string]string{"cpu.cfs_quota_us": "-1"},
		asked:   &runtimeapi.LinuxContainerResources{CpuShares: 512, CpuQuota: -1, CpuPeriod: 100000, MemoryLimitInBytes: 9223372036854771712},
		want:    []Mismatch{{"memory.limit_in_bytes", "unlimited", "67108864"}},
	}, {
		// On v2 it reads "max" as math.MaxUint64, which is -1 once an int64.
		name: "v2 unlimited memory read back", version: 2,
		changes: map[string]string{"cpu.max": "max 100000", "memory.max": "max", "memory.swap.max": "max"},
		asked:   &runtimeapi.LinuxContainerResources{CpuShares: 512, CpuQuota: -1, CpuPeriod: 100000, MemoryLimitInBytes: -1},
	}, {
		name: "v2 unlimited memory read back, a limit held", version: 2,
		changes: map[string]string{"cpu.max": "max 100000", "memory.swap.max": "max"},
		asked:   &runtimeapi.LinuxContainerResources{CpuShares: 512, CpuQuota: -1, CpuPeriod: 100000, MemoryLimitInBytes: -1},
		want:    []Mismatch{{"memory.max", "max", "67108864"}},
	}, {
		// kubelet 1.38's sandbox without limits (not every container sets one): left out, so
		// not compared, whatever the cgroup holds.
		name: "v1 limits left out", version: 1,
		changes: map[string]string{"cpu.cfs_quota_us": "-1", "memory.limit_in_bytes": v1Unlimited},
		asked:   &runtimeapi.LinuxContainerResources{CpuShares: 512, CpuPeriod: 100000},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			base := v1Files512
			if tc.version == 2 {
				base = v2Files512
			}
			got := Compare(SpecResources(tc.asked, WithSwapController(false)), heldFrom(t, tc.version, base, tc.changes))
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Compare (-want +got):\n%s", diff)
			}
		})
	}
}
