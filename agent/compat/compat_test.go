package compat

import (
	"strings"
	"testing"
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
