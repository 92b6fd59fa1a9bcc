package resources

import (
	"context"
	"maps"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	kubeletconfig "k8s.io/kubelet/config/v1beta1"

	"github.com/podgate/podgate/cri/registry"
	"github.com/podgate/podgate/podresources/cgroup"
)

// TestOneMemoryQoSWriter: where the kubelet writes memory QoS itself, podgate leaves the
// request as the kubelet sent it — even a value podgate would compute otherwise — and records
// the kubelet's values as what the cgroup must hold, so that the verification reports drift
// from them; where it does not, podgate writes them. The kubelet's answer is asked at each
// call: it may change once the kubelet's version is known.
func TestOneMemoryQoSWriter(t *testing.T) {
	pod := memoryPod("burst", corev1.PodQOSBurstable)
	var kubeletWrites atomic.Bool
	s := New(Config{MemoryQoS: true, MemoryThrottlingFactor: 0.9, MemoryReservationPolicy: kubeletconfig.NoneMemoryReservationPolicy},
		v2Node, registry.NewRegistry(nil, registry.CheckpointData{}), noStatus{}, prometheus.NewRegistry(),
		WithPods(newFakePods(pod)), WithKubeletMemoryQoS(kubeletWrites.Load), withPageSize(4096))
	s.allocatable.Store(4 << 30)
	create := func(id string, unified map[string]string) map[string]string {
		t.Helper()
		var sent *runtimeapi.CreateContainerRequest
		next := func(_ context.Context, req *runtimeapi.CreateContainerRequest) (*runtimeapi.CreateContainerResponse, error) {
			sent = req
			return &runtimeapi.CreateContainerResponse{ContainerId: id}, nil
		}
		res := &runtimeapi.LinuxContainerResources{MemoryLimitInBytes: 1 << 30, Unified: unified}
		if _, err := s.CreateContainer(t.Context(), createRequest(string(pod.UID), "app", res), next); err != nil {
			t.Fatal(err)
		}
		return sent.GetConfig().GetLinux().GetResources().GetUnified()
	}

	// The kubelet writes: what it wrote (here a memory.high the kubelet's own factor gives) goes
	// to the runtime untouched; a request it sent without memory QoS gets none from podgate.
	kubeletWrites.Store(true)
	kubelet := map[string]string{"memory.min": "0", "memory.low": "0", "memory.high": "966367641"}
	if got := create("by-kubelet", kubelet); !maps.Equal(got, kubelet) {
		t.Errorf("kubelet writes: unified sent = %v, want the kubelet's %v", got, kubelet)
	}
	if got := create("bare", nil); got != nil {
		t.Errorf("kubelet writes: podgate added %v to a request without memory QoS; want nothing", got)
	}
	if n := testutil.ToFloat64(s.qosApplied); n != 0 {
		t.Errorf("memory_qos_applied_total = %v with the kubelet writing, want 0", n)
	}
	// Verified like any cgroup value: the record holds the kubelet's values, and a cgroup that
	// drifted from them is a mismatch naming the file.
	if _, ok := s.containers.Container("by-kubelet"); !ok {
		t.Fatal("container not in the registry")
	}
	rec, ok := s.records.get("by-kubelet")
	if !ok {
		t.Fatal("container's resources not recorded")
	}
	if !maps.Equal(rec.asked.Unified, kubelet) {
		t.Errorf("recorded unified = %v, want the kubelet's %v", rec.asked.Unified, kubelet)
	}
	// Only the unified files are laid out here: the mismatches of memory QoS's files count.
	qosMismatches := func(held *cgroup.Held) []cgroup.Mismatch {
		var out []cgroup.Mismatch
		for _, m := range cgroup.Compare(rec.asked, held) {
			if _, qos := kubelet[m.Field]; qos {
				out = append(out, m)
			}
		}
		return out
	}
	held := &cgroup.Held{Mode: cgroup.ModeUnified, Version: 2, PageSize: 4096, Files: map[string]string{
		"memory.min": "0", "memory.low": "0", "memory.high": "966365184",
	}}
	if m := qosMismatches(held); len(m) != 0 {
		t.Errorf("cgroup holding the kubelet's values: mismatches %v, want none", m)
	}
	held.Files["memory.high"] = "max"
	if m := qosMismatches(held); len(m) != 1 || m[0].Field != "memory.high" || m[0].Held != "max" {
		t.Errorf("drifted memory.high: mismatches %v, want memory.high held max", m)
	}

	// The kubelet does not write (an older kubelet, its gate off): podgate does.
	kubeletWrites.Store(false)
	if got := create("by-podgate", nil); got["memory.high"] != "993210368" {
		t.Errorf("kubelet does not write: unified sent = %v, want podgate's memory.high 993210368", got)
	}
	if n := testutil.ToFloat64(s.qosApplied); n != 1 {
		t.Errorf("memory_qos_applied_total = %v, want 1", n)
	}
}
