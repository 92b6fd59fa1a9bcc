package cgroup

import (
	"math"
	"testing"

	"github.com/containerd/errdefs"
)

const (
	mib  = int64(1) << 20
	gib  = int64(1) << 30
	page = int64(4096)
)

func TestValidateThrottlingFactor(t *testing.T) {
	for _, tc := range []struct {
		f  float64
		ok bool
	}{
		{0.9, true}, {1, true}, {0.0001, true},
		{0, false}, {-0.5, false}, {1.0001, false}, {math.NaN(), false}, {math.Inf(1), false},
	} {
		err := ValidateThrottlingFactor(tc.f)
		if tc.ok != (err == nil) || (err != nil && !errdefs.IsInvalidArgument(err)) {
			t.Errorf("ValidateThrottlingFactor(%v) = %v, want ok=%v", tc.f, err, tc.ok)
		}
	}
}

func TestMemoryHigh(t *testing.T) {
	for _, tc := range []struct {
		name                  string
		request, limit, pageS int64
		factor                float64
		want                  int64
	}{
		// (100Mi + 0.9 × 100Mi) = 190Mi: page-aligned already.
		{"aligned", 100 * mib, 200 * mib, page, 0.9, 190 * mib},
		// 0.8 × 1000 = 800 → floor(800/4096) = 0.
		{"below a page", 0, 1000, page, 0.8, 0},
		// 1Gi + 0.9 × (2Gi−1Gi) = 1.9Gi = 2040109465.6 → 498073 pages.
		{"rounded down", gib, 2 * gib, page, 0.9, 498073 * page},
		{"factor 1 is the limit", 64 * mib, 128 * mib, page, 1, 128 * mib},
		{"unaligned limit", 0, 10*page + 100, page, 1, 10 * page},
		{"64 KiB pages", 100 * mib, 200*mib + 1, 65536, 0.5, 150 * mib},
		{"page size 0 counts as 1", 10, 20, 0, 0.5, 15},
		// A node's allocatable memory as the limit of a container without one.
		{"allocatable", 256 * mib, 31 * gib, page, 0.9, 7320371 * page}, // 29984240435.2 bytes
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := MemoryHigh(tc.request, tc.limit, tc.factor, tc.pageS); got != tc.want {
				t.Errorf("MemoryHigh(%d, %d, %v, %d) = %d, want %d", tc.request, tc.limit, tc.factor, tc.pageS, got, tc.want)
			}
		})
	}
}
