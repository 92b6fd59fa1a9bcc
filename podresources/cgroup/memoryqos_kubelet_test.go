package cgroup

import (
	"maps"
	"math"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	kubeletconfig "k8s.io/kubelet/config/v1beta1"
)

// The kubelet's policies, short.
const (
	policyNone   = kubeletconfig.NoneMemoryReservationPolicy
	policyTiered = kubeletconfig.TieredReservationMemoryReservationPolicy
)

// TestMemoryQoS checks MemoryQoS against the kubelet 1.36's memory QoS of a container
// (k8s.io/kubernetes v1.36.3, pkg/kubelet/kuberuntime/kuberuntime_container_linux.go,
// generateLinuxContainerResources). Expected values are numbers worked out by hand (the
// comments show the arithmetic), never a call of the code under test.
//
// Cases marked "kubelet test" are those of
// pkg/kubelet/kuberuntime/kuberuntime_container_linux_test.go at v1.36.3:
// TestGenerateContainerConfigWithMemoryQoSEnforced (policy TieredReservation, factor 0.9,
// node allocatable 32Gi = fakeNodeAllocatableMemory, 4 KiB pages) and
// TestGenerateContainerConfigMemoryQoSPolicyNone. The others are edge cases of the same code.
// Every case was also run once through that kubelet's own generateLinuxContainerConfig (a
// throwaway test in a copy of its kuberuntime package, with its fake runtime manager) and gave
// these values.
func TestMemoryQoS(t *testing.T) {
	const (
		burstable  = corev1.PodQOSBurstable
		guaranteed = corev1.PodQOSGuaranteed
		bestEffort = corev1.PodQOSBestEffort
	)
	b := func(n int64) *int64 { return &n }
	zero := b(0)
	for _, tc := range []struct {
		name string
		in   MemoryQoSInput
		want MemoryQoSValues
	}{{
		// kubelet test Request128MBLimit256MB: memory.low = 128Mi;
		// 128Mi + 0.9 × 128Mi = 255013683.2 → 62259 pages.
		name: "kubelet test: tiered, request 128Mi, limit 256Mi",
		in:   MemoryQoSInput{Request: 128 * mib, Limit: 256 * mib, QOSClass: burstable, NodeAllocatable: 32 * gib, Factor: 0.9, Policy: policyTiered, PageSize: page},
		want: MemoryQoSValues{Low: b(134217728), High: b(62259 * page)}, // 255012864
	}, {
		// kubelet test Request128MBWithoutLimit: the node's 32Gi is the ceiling;
		// 128Mi + 0.9 × (32Gi − 128Mi) = 30937186304 = 7553024 pages exactly.
		name: "kubelet test: tiered, request 128Mi, no limit",
		in:   MemoryQoSInput{Request: 128 * mib, QOSClass: burstable, NodeAllocatable: 32 * gib, Factor: 0.9, Policy: policyTiered, PageSize: page},
		want: MemoryQoSValues{Low: b(134217728), High: b(30937186304)},
	}, {
		// kubelet test TestGenerateContainerConfigMemoryQoSPolicyNone: memory.min "0" and a
		// memory.high; memory.low "0" too, from the same branch of the kubelet's code.
		name: "kubelet test: policy None, request 128Mi, limit 256Mi",
		in:   MemoryQoSInput{Request: 128 * mib, Limit: 256 * mib, QOSClass: burstable, NodeAllocatable: 32 * gib, Factor: 0.9, Policy: policyNone, PageSize: page},
		want: MemoryQoSValues{Min: zero, Low: zero, High: b(255012864)},
	}, {
		name: "policy unset is None",
		in:   MemoryQoSInput{Request: 128 * mib, Limit: 256 * mib, QOSClass: burstable, Factor: 0.9, PageSize: page},
		want: MemoryQoSValues{Min: zero, Low: zero, High: b(255012864)},
	}, {
		// Guaranteed: request = limit, so no memory.high; tiered gives memory.min, not .low.
		name: "tiered, guaranteed",
		in:   MemoryQoSInput{Request: 100 * mib, Limit: 100 * mib, QOSClass: guaranteed, NodeAllocatable: 32 * gib, Factor: 0.9, Policy: policyTiered, PageSize: page},
		want: MemoryQoSValues{Min: b(104857600)},
	}, {
		name: "policy None, guaranteed",
		in:   MemoryQoSInput{Request: 100 * mib, Limit: 100 * mib, QOSClass: guaranteed, NodeAllocatable: 32 * gib, Factor: 0.9, Policy: policyNone, PageSize: page},
		want: MemoryQoSValues{Min: zero, Low: zero},
	}, {
		// A Guaranteed pod by pod-level resources: its container has no memory of its own.
		name: "tiered, guaranteed pod, container without memory",
		in:   MemoryQoSInput{QOSClass: guaranteed, NodeAllocatable: 32 * gib, Factor: 0.9, Policy: policyTiered, PageSize: page},
		want: MemoryQoSValues{Min: zero, Low: zero},
	}, {
		// No request, a limit: no protection (even tiered), memory.high = 0.9 × 256Mi =
		// 241591910.4 → 58982 pages.
		name: "tiered, no request, limit 256Mi",
		in:   MemoryQoSInput{Limit: 256 * mib, QOSClass: burstable, NodeAllocatable: 32 * gib, Factor: 0.9, Policy: policyTiered, PageSize: page},
		want: MemoryQoSValues{Min: zero, Low: zero, High: b(58982 * page)}, // 241590272
	}, {
		// No request, no limit: request = limit = 0, so the kubelet 1.36 writes no memory.high.
		name: "best effort",
		in:   MemoryQoSInput{QOSClass: bestEffort, NodeAllocatable: 32 * gib, Factor: 0.9, Policy: policyNone, PageSize: page},
		want: MemoryQoSValues{Min: zero, Low: zero},
	}, {
		// 16Gi node less 512Mi system and 1Gi kube reserved = 14.5Gi;
		// 1Gi + 0.9 × 13.5Gi = 14119703756.8 → 3447193 pages.
		name: "no limit, reserved node",
		in:   MemoryQoSInput{Request: gib, QOSClass: burstable, NodeAllocatable: 16*gib - 512*mib - gib, Factor: 0.9, Policy: policyNone, PageSize: page},
		want: MemoryQoSValues{Min: zero, Low: zero, High: b(3447193 * page)}, // 14119702528
	}, {
		name: "no limit, node allocatable unknown",
		in:   MemoryQoSInput{Request: 128 * mib, QOSClass: burstable, Factor: 0.9, Policy: policyTiered, PageSize: page},
		want: MemoryQoSValues{Low: b(134217728)},
	}, {
		// 40Gi + 0.9 × (32Gi − 40Gi) = 35218731827.2 < 40Gi: below the request, not written.
		name: "no limit, request above node allocatable",
		in:   MemoryQoSInput{Request: 40 * gib, QOSClass: burstable, NodeAllocatable: 32 * gib, Factor: 0.9, Policy: policyTiered, PageSize: page},
		want: MemoryQoSValues{Low: b(42949672960)},
	}, {
		name: "factor 1: the limit",
		in:   MemoryQoSInput{Request: 64 * mib, Limit: 256 * mib, QOSClass: burstable, Factor: 1, PageSize: page},
		want: MemoryQoSValues{Min: zero, Low: zero, High: b(268435456)},
	}, {
		// factor 1, a limit 100 bytes past a page: rounded down to the page.
		name: "factor 1, unaligned limit",
		in:   MemoryQoSInput{Request: 64 * mib, Limit: 256*mib + 100, QOSClass: burstable, Factor: 1, PageSize: page},
		want: MemoryQoSValues{Min: zero, Low: zero, High: b(268435456)},
	}, {
		// 1Gi + 0.9 × 1Gi = 2040109465.6 → 498073 pages.
		name: "page rounding",
		in:   MemoryQoSInput{Request: gib, Limit: 2 * gib, QOSClass: burstable, Factor: 0.9, PageSize: page},
		want: MemoryQoSValues{Min: zero, Low: zero, High: b(498073 * page)}, // 2040107008
	}, {
		// 100Mi + 0.5 × (100Mi + 1) = 157286400.5 → 2400 pages of 64 KiB = 150Mi.
		name: "64 KiB pages",
		in:   MemoryQoSInput{Request: 100 * mib, Limit: 200*mib + 1, QOSClass: burstable, Factor: 0.5, PageSize: 65536},
		want: MemoryQoSValues{Min: zero, Low: zero, High: b(157286400)},
	}, {
		// 100Mi + 0.5 × 1 byte rounds down to the request's own page: not above the request.
		name: "memory.high not above the request",
		in:   MemoryQoSInput{Request: 100 * mib, Limit: 100*mib + 1, QOSClass: burstable, Factor: 0.5, PageSize: page},
		want: MemoryQoSValues{Min: zero, Low: zero},
	}, {
		// 0.5 × 4000 = 2000 bytes: less than a page, 0, not written.
		name: "memory.high below a page",
		in:   MemoryQoSInput{Limit: 4000, QOSClass: burstable, Factor: 0.5, PageSize: page},
		want: MemoryQoSValues{Min: zero, Low: zero},
	}, {
		// 4096 + 0.5 × 8191 = 8191.5: the kubelet rounds the bytes down (8191) before the page,
		// so one page, not above the request; rounding up would give two.
		name: "half a byte under a page",
		in:   MemoryQoSInput{Request: 4096, Limit: 12287, QOSClass: burstable, Factor: 0.5, PageSize: page},
		want: MemoryQoSValues{Min: zero, Low: zero},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := MemoryQoS(tc.in)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("MemoryQoS(%+v) (-want +got):\n%s", tc.in, diff)
			}
		})
	}
}

func TestMemoryQoSInvalid(t *testing.T) {
	ok := MemoryQoSInput{Request: 1, Limit: 2, Factor: 0.9, PageSize: page}
	for _, tc := range []struct {
		name   string
		change func(*MemoryQoSInput)
		errHas string
	}{
		{"factor 0", func(in *MemoryQoSInput) { in.Factor = 0 }, "factor 0"},
		{"factor above 1", func(in *MemoryQoSInput) { in.Factor = 1.5 }, "factor 1.5"},
		{"factor NaN", func(in *MemoryQoSInput) { in.Factor = math.NaN() }, "factor NaN"},
		{"unknown policy", func(in *MemoryQoSInput) { in.Policy = "Tiered" }, `policy "Tiered"`},
		{"negative request", func(in *MemoryQoSInput) { in.Request = -1 }, "request -1"},
		{"negative limit", func(in *MemoryQoSInput) { in.Limit = -1 }, "limit -1"},
		{"limit below request", func(in *MemoryQoSInput) { in.Request, in.Limit = 200, 100 }, "limit 100 is below the request 200"},
		{"negative allocatable", func(in *MemoryQoSInput) { in.NodeAllocatable = -1 }, "allocatable memory -1"},
		{"page size 0", func(in *MemoryQoSInput) { in.PageSize = 0 }, "page size 0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := ok
			tc.change(&in)
			got, err := MemoryQoS(in)
			if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), tc.errHas) {
				t.Fatalf("err = %v, want an invalid-argument error with %q", err, tc.errHas)
			}
			if got != (MemoryQoSValues{}) {
				t.Errorf("values %+v with an error, want none", got)
			}
		})
	}
	if _, err := MemoryQoS(ok); err != nil {
		t.Errorf("the valid input: %v", err)
	}
}

func TestMemoryQoSValuesUnified(t *testing.T) {
	b := func(n int64) *int64 { return &n }
	v := MemoryQoSValues{Min: b(0), Low: b(134217728), High: b(255012864)}
	want := map[string]string{"memory.min": "0", "memory.low": "134217728", "memory.high": "255012864"}
	if diff := cmp.Diff(want, v.Unified()); diff != "" {
		t.Errorf("Unified (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(map[string]string{}, (MemoryQoSValues{}).Unified()); diff != "" {
		t.Errorf("Unified of nothing (-want +got):\n%s", diff)
	}
}

func TestMemoryQoSValuesAddTo(t *testing.T) {
	b := func(n int64) *int64 { return &n }
	tiered := MemoryQoSValues{Low: b(100), High: b(4096)}
	none := MemoryQoSValues{Min: b(0), Low: b(0)}
	for _, tc := range []struct {
		name    string
		v       MemoryQoSValues
		in      map[string]string
		want    map[string]string
		changed bool
	}{{
		name: "nil map", v: tiered, in: nil,
		want: map[string]string{"memory.low": "100", "memory.high": "4096"}, changed: true,
	}, {
		name: "other keys kept", v: none, in: map[string]string{"memory.swap.max": "0"},
		want: map[string]string{"memory.swap.max": "0", "memory.min": "0", "memory.low": "0"}, changed: true,
	}, {
		// A kubelet 1.37 without MemoryQoS writes memory.high "max": replaced.
		name: "memory.high max replaced", v: tiered, in: map[string]string{"memory.high": "max"},
		want: map[string]string{"memory.low": "100", "memory.high": "4096"}, changed: true,
	}, {
		name: "kubelet's own memory QoS (memory.min)", v: tiered, in: map[string]string{"memory.min": "0", "memory.low": "0", "memory.high": "8192"},
		want: map[string]string{"memory.min": "0", "memory.low": "0", "memory.high": "8192"},
	}, {
		name: "kubelet's own memory QoS (memory.low)", v: none, in: map[string]string{"memory.low": "5"},
		want: map[string]string{"memory.low": "5"},
	}, {
		name: "nothing to add", v: MemoryQoSValues{}, in: map[string]string{"memory.high": "max"},
		want: map[string]string{"memory.high": "max"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			before := maps.Clone(tc.in)
			got, changed := tc.v.AddTo(tc.in)
			if changed != tc.changed {
				t.Errorf("changed = %v, want %v", changed, tc.changed)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("AddTo (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(before, tc.in); diff != "" {
				t.Errorf("input modified (-before +after):\n%s", diff)
			}
		})
	}
}

func TestValidateReservationPolicy(t *testing.T) {
	for _, tc := range []struct {
		p  kubeletconfig.MemoryReservationPolicy
		ok bool
	}{
		{"", true}, {"None", true}, {"TieredReservation", true},
		{"none", false}, {"Tiered", false}, {"tieredReservation", false},
	} {
		err := ValidateReservationPolicy(tc.p)
		if tc.ok != (err == nil) || (err != nil && !errdefs.IsInvalidArgument(err)) {
			t.Errorf("ValidateReservationPolicy(%q) = %v, want ok=%v", tc.p, err, tc.ok)
		}
	}
}
