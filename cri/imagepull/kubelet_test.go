package imagepull

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestMaskedBy: a kubelet cap at or below one of podgate's caps makes that cap moot; none, or
// one above, masks nothing.
func TestMaskedBy(t *testing.T) {
	limits := Limits{MaxParallel: 4, PerRegistry: map[string]int{"quay.io": 2, "docker.io": 8}}
	for _, tt := range []struct {
		name string
		cap  int
		want []string
	}{
		{"no kubelet cap", 0, nil},
		{"serializeImagePulls", 1, []string{"imagePulls.maxParallel (4)", "imagePulls.perRegistry[docker.io] (8)", "imagePulls.perRegistry[quay.io] (2)"}},
		{"equal to maxParallel", 4, []string{"imagePulls.maxParallel (4)", "imagePulls.perRegistry[docker.io] (8)"}},
		{"between", 5, []string{"imagePulls.perRegistry[docker.io] (8)"}},
		{"above every cap", 9, nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := limits.MaskedBy(tt.cap); !slices.Equal(got, tt.want) {
				t.Errorf("MaskedBy(%d) = %q, want %q", tt.cap, got, tt.want)
			}
		})
	}
	if got := (Limits{}).MaskedBy(1); got != nil {
		t.Errorf("no podgate caps: MaskedBy(1) = %q, want nothing", got)
	}
	if (Limits{}).Capped() || !limits.Capped() {
		t.Error("Capped: want false without caps, true with")
	}
}

// TestKubeletCapMetric: WithKubeletCap exports the kubelet's cap and whether it masks
// podgate's; without it, nothing.
func TestKubeletCapMetric(t *testing.T) {
	for _, tt := range []struct {
		name string
		opts []FeatureOption
		want string
	}{
		{"serialized below podgate", []FeatureOption{WithKubeletCap(1)}, `podgate_image_pull_kubelet_cap{below_podgate="true"} 1`},
		{"above podgate", []FeatureOption{WithKubeletCap(10)}, `podgate_image_pull_kubelet_cap{below_podgate="false"} 10`},
		{"no cap", []FeatureOption{WithKubeletCap(0)}, `podgate_image_pull_kubelet_cap{below_podgate="false"} 0`},
		{"not known", nil, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			if _, err := NewFeature(context.Background(), Limits{MaxParallel: 3}, SandboxPriority{}, reg, tt.opts...); err != nil {
				t.Fatal(err)
			}
			n, err := testutil.GatherAndCount(reg, "podgate_image_pull_kubelet_cap")
			if err != nil {
				t.Fatal(err)
			}
			if tt.want == "" {
				if n != 0 {
					t.Errorf("%d series of podgate_image_pull_kubelet_cap, want none", n)
				}
				return
			}
			want := "# HELP podgate_image_pull_kubelet_cap " + kubeletCapHelp(t, reg) + "\n# TYPE podgate_image_pull_kubelet_cap gauge\n" + tt.want + "\n"
			if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "podgate_image_pull_kubelet_cap"); err != nil {
				t.Error(err)
			}
		})
	}
}

// kubeletCapHelp is the metric's help text as registered.
func kubeletCapHelp(t *testing.T, reg *prometheus.Registry) string {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "podgate_image_pull_kubelet_cap" {
			return mf.GetHelp()
		}
	}
	t.Fatal("podgate_image_pull_kubelet_cap not registered")
	return ""
}
