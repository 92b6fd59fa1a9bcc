package registry

import "testing"

// TestContainerdCgroupsPath: the cgroups path containerd 2.4 gives a container, as its own
// tests have it (internal/cri/server, getCgroupsPath).
func TestContainerdCgroupsPath(t *testing.T) {
	for parent, want := range map[string]string{
		"/kubepods/burstable/pod123":                                               "/kubepods/burstable/pod123/ctr1",
		"kubepods-burstable-pod123.slice":                                          "kubepods-burstable-pod123.slice:cri-containerd:ctr1",
		"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod123.slice": "kubepods-burstable-pod123.slice:cri-containerd:ctr1",
		"": "/k8s.io/ctr1",
	} {
		if got := ContainerdCgroupsPath(parent, "ctr1"); got != want {
			t.Errorf("ContainerdCgroupsPath(%q) = %q, want %q", parent, got, want)
		}
	}
}
