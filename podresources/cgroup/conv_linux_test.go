package cgroup

import (
	"testing"

	"github.com/containerd/cgroups/v3/cgroup2"
)

// TestCPUSharesToWeightMatchesCgroupsV3 checks every shares value against
// containerd/cgroups/v3's copy of the same conversion: the two must never drift apart
// unnoticed.
func TestCPUSharesToWeightMatchesCgroupsV3(t *testing.T) {
	for s := uint64(0); s <= 270000; s++ {
		if got, want := CPUSharesToWeight(s), cgroup2.ConvertCPUSharesToCgroupV2Value(s); got != want {
			t.Fatalf("CPUSharesToWeight(%d) = %d, cgroups/v3 gives %d", s, got, want)
		}
	}
}
