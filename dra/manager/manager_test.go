package manager

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"

	"github.com/podgate/podgate/cri/registry"
)

// TestDRAKubeletVersionFromTheNode: the kubelet's version is taken from the Node object.
func TestDRAKubeletVersionFromTheNode(t *testing.T) {
	reg := registry.NewRegistry(nil, registry.CheckpointData{})
	store, err := NewClaims(reg)
	if err != nil {
		t.Fatal(err)
	}
	// Nothing here reads pods, calls a driver or the runtime.
	d := New(nil, nil, nil, store, reg, nil, prometheus.NewRegistry(), WithPrepare(PrepareAuto))
	d.SetKubeletVersion(t.Context(), &corev1.Node{Status: corev1.NodeStatus{NodeInfo: corev1.NodeSystemInfo{KubeletVersion: "v1.36.3"}}})
	if v := d.kubeletVersion.Load(); v == nil || v.String() != "1.36.3" {
		t.Errorf("kubelet version %v, want 1.36.3", v)
	}
	d.SetKubeletVersion(t.Context(), &corev1.Node{Status: corev1.NodeStatus{NodeInfo: corev1.NodeSystemInfo{KubeletVersion: "not a version"}}})
	if v := d.kubeletVersion.Load(); v == nil || v.String() != "1.36.3" {
		t.Errorf("a version not understood replaced the known one: %v", v)
	}
}
