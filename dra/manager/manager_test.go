package manager

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// TestDRAKubeletVersionFromTheNode: the kubelet's version is taken from the Node object.
func TestDRAKubeletVersionFromTheNode(t *testing.T) {
	d := &Manager{mode: PrepareAuto}
	d.SetKubeletVersion(t.Context(), &corev1.Node{Status: corev1.NodeStatus{NodeInfo: corev1.NodeSystemInfo{KubeletVersion: "v1.36.3"}}})
	if v := d.kubeletVersion.Load(); v == nil || v.String() != "1.36.3" {
		t.Errorf("kubelet version %v, want 1.36.3", v)
	}
	d.SetKubeletVersion(t.Context(), &corev1.Node{Status: corev1.NodeStatus{NodeInfo: corev1.NodeSystemInfo{KubeletVersion: "not a version"}}})
	if v := d.kubeletVersion.Load(); v == nil || v.String() != "1.36.3" {
		t.Errorf("a version not understood replaced the known one: %v", v)
	}
}
