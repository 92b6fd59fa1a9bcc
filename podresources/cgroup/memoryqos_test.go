package cgroup

import (
	"maps"
	"math"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	"github.com/google/go-cmp/cmp"
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

func TestApplyMemoryQoS(t *testing.T) {
	for _, tc := range []struct {
		name           string
		in             map[string]string
		request, limit int64
		factor         float64
		pageSize       int64
		want           map[string]string
		changed        bool
		errHas         string // an invalid-argument error whose message has this
	}{{
		name: "burstable", request: 100 * mib, limit: 200 * mib, factor: 0.9, pageSize: page,
		want:    map[string]string{"memory.min": "104857600", "memory.high": "199229440"},
		changed: true,
	}, {
		name: "kept keys and others", in: map[string]string{"memory.oom.group": "1"},
		request: 100 * mib, limit: 200 * mib, factor: 0.9, pageSize: page,
		want:    map[string]string{"memory.oom.group": "1", "memory.min": "104857600", "memory.high": "199229440"},
		changed: true,
	}, {
		name: "kubelet set memory.min", in: map[string]string{"memory.min": "1"},
		request: 100 * mib, limit: 200 * mib, factor: 0.9, pageSize: page,
		want:    map[string]string{"memory.min": "1", "memory.high": "199229440"},
		changed: true,
	}, {
		name: "kubelet set both", in: map[string]string{"memory.min": "1", "memory.high": "2"},
		request: 100 * mib, limit: 200 * mib, factor: 0.9, pageSize: page,
		want: map[string]string{"memory.min": "1", "memory.high": "2"},
	}, {
		name: "no request", request: 0, limit: 200 * mib, factor: 0.9, pageSize: page,
	}, {
		name: "no request, no limit", request: 0, limit: 0, factor: 0.9, pageSize: page,
	}, {
		name: "guaranteed", request: 200 * mib, limit: 200 * mib, factor: 0.9, pageSize: page,
		in: map[string]string{}, want: map[string]string{},
	}, {
		// request + 0.5 × 1 byte rounds down to the request's page: not above the request.
		name: "high not above request", request: 100 * mib, limit: 100*mib + 1, factor: 0.5, pageSize: page,
	}, {
		name: "node allocatable as limit", request: gib, limit: 16 * gib, factor: 0.9, pageSize: page,
		want:    map[string]string{"memory.min": "1073741824", "memory.high": "15569256448"},
		changed: true,
	}, {
		name: "factor 0", request: 1, limit: 2, factor: 0, pageSize: page, errHas: "factor 0",
	}, {
		name: "factor above 1", request: 1, limit: 2, factor: 1.5, pageSize: page, errHas: "factor 1.5",
	}, {
		name: "factor NaN", request: 1, limit: 2, factor: math.NaN(), pageSize: page, errHas: "factor NaN",
	}, {
		name: "negative request", request: -1, limit: 2, factor: 0.9, pageSize: page, errHas: "request -1",
	}, {
		name: "negative limit", request: 0, limit: -1, factor: 0.9, pageSize: page, errHas: "limit -1",
	}, {
		name: "limit below request", request: 200, limit: 100, factor: 0.9, pageSize: page, errHas: "limit 100 is below the request 200",
	}, {
		name: "no limit passed", request: 200, limit: 0, factor: 0.9, pageSize: page, errHas: "allocatable",
	}, {
		name: "page size 0", request: 1, limit: 2, factor: 0.9, pageSize: 0, errHas: "page size 0",
	}, {
		name: "errors before keys", in: map[string]string{"memory.min": "1", "memory.high": "2"},
		request: 1, limit: 2, factor: 2, pageSize: page, errHas: "factor 2",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			before := maps.Clone(tc.in)
			got, changed, err := ApplyMemoryQoS(tc.in, tc.request, tc.limit, tc.factor, tc.pageSize)
			if tc.errHas != "" {
				if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), tc.errHas) {
					t.Fatalf("err = %v, want an invalid-argument error with %q", err, tc.errHas)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if changed != tc.changed {
				t.Errorf("changed = %v, want %v", changed, tc.changed)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("out (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(before, tc.in); diff != "" {
				t.Errorf("input modified (-before +after):\n%s", diff)
			}
		})
	}
}
