package compat

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/version"

	"github.com/podgate/podgate/test/matrix"
)

func TestCheck(t *testing.T) {
	for _, tc := range []struct {
		r       Range
		v       string
		tested  bool
		whyPart string
	}{
		{Kubelet, "v1.35.0", true, ""},
		{Kubelet, "v1.36.3", true, ""},
		{Kubelet, "v1.37.2", true, ""},
		{Kubelet, "1.37.9-gke.100", true, ""},
		{Kubelet, "v1.34.4", false, "older than the tested kubelet 1.35–1.37"},
		{Kubelet, "v1.38.0-alpha.1", false, "newer than the tested kubelet 1.35–1.37"},
		{Kubelet, "v2.0.0", false, "newer"},
		{Kubelet, "", false, "not understood"},
		{Kubelet, "latest", false, "not understood"},
		{Containerd, "v2.3.7", true, ""},
		{Containerd, "v2.4.2", true, ""},
		{Containerd, "v2.2.9", false, "older than the tested containerd 2.3–2.4"},
		{Containerd, "v2.5.0", false, "newer"},
	} {
		got := tc.r.Check(tc.v)
		if got.Tested != tc.tested || got.Version != tc.v || !contains(got.Why, tc.whyPart) || (tc.tested && got.Why != "") {
			t.Errorf("%s.Check(%q) = %+v, want tested %v, why containing %q", tc.r.Component, tc.v, got, tc.tested, tc.whyPart)
		}
	}
}

func TestRuntime(t *testing.T) {
	if got := Runtime("containerd", "v2.4.2"); !got.Tested {
		t.Errorf("containerd v2.4.2: %+v, want tested", got)
	}
	if got := Runtime("containerd", "v1.7.30"); got.Tested || !contains(got.Why, "older") {
		t.Errorf("containerd v1.7.30: %+v, want older than tested", got)
	}
	if got := Runtime("cri-o", "1.37.0"); got.Tested || !contains(got.Why, `runtime "cri-o" is not tested`) {
		t.Errorf("cri-o: %+v, want not tested", got)
	}
}

func contains(s, part string) bool {
	return strings.Contains(s, part)
}

// The release matrix (test/matrix) is the range podgate logs as tested, oldest first and newest last.
func TestVersionsMatchCompat(t *testing.T) {
	v, err := matrix.ReadVersions("../../test/matrix/versions.env")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		key string
		r   Range
	}{{"KUBELET_VERSIONS", Kubelet}, {"CONTAINERD_VERSIONS", Containerd}} {
		list := v[tc.key]
		if len(list) < 2 {
			t.Fatalf("%s = %q: want the oldest and the newest release at least", tc.key, list)
		}
		for i, s := range list {
			if !tc.r.Check(s).Tested {
				t.Errorf("%s: %s is outside the tested range's %s", tc.key, s, tc.r)
			}
			if i > 0 && !version.MustParseSemantic(list[i-1]).LessThan(version.MustParseSemantic(s)) {
				t.Errorf("%s: %s after %s: want oldest first", tc.key, s, list[i-1])
			}
		}
		minor := func(s string) string {
			p := version.MustParseSemantic(s)
			return version.MajorMinor(p.Major(), p.Minor()).String()
		}
		if got := minor(list[0]); got != tc.r.Min {
			t.Errorf("%s starts at %s, the tested range's %s at %s", tc.key, got, tc.r, tc.r.Min)
		}
		if got := minor(list[len(list)-1]); got != tc.r.Max {
			t.Errorf("%s ends at %s, the tested range's %s at %s", tc.key, got, tc.r, tc.r.Max)
		}
	}
}
