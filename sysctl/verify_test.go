package sysctl

import (
	"testing"

	"github.com/containerd/errdefs"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/klog/v2"

	"github.com/podgate/podgate/cri/registry"
)

// TestPauseFromCgroup: the pause process is taken from the sandbox's cgroup when it is the one
// process there, with its own namespaces; otherwise, and without WithCgroupProcs, the
// verification waits for the sandbox's status.
func TestPauseFromCgroup(t *testing.T) {
	rec := registry.SandboxRecord{ID: "sb1", PID: 7, NetNS: "/run/netns/cni-1"}
	procs := func(pids ...int) StagesOption {
		return WithCgroupProcs(func(path string) ([]int, error) {
			if path != "/k8s.io/sb1" {
				return nil, errdefs.ErrNotFound
			}
			return pids, nil
		})
	}
	for _, tc := range []struct {
		name string
		opts []StagesOption
		ok   bool
	}{
		{"one process", []StagesOption{procs(42)}, true},
		{"no process", []StagesOption{procs()}, false},
		{"two processes", []StagesOption{procs(42, 43)}, false},
		{"no lookup", nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewStages(nil, VerifyRepair, nil, prometheus.NewRegistry(), tc.opts...)
			got, ok := g.pauseFromCgroup(klog.Background(), rec)
			switch {
			case ok != tc.ok:
				t.Fatalf("found %v, want %v", ok, tc.ok)
			case ok && (got.PID != 42 || got.NetNS != ""):
				t.Errorf("record %+v, want the pause process 42 with its own namespaces", got)
			case !ok && (got.PID != rec.PID || got.NetNS != rec.NetNS):
				t.Errorf("record %+v, want it unchanged", got)
			}
		})
	}
}
