package cri

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/podgate/podgate/cri/relay"
	"github.com/podgate/podgate/test/testfs"
)

// TestBudgetSeries: the CRI socket's memory budget shows as podgate_cri_budget_limit_bytes
// (criSocketLimits.totalBytes, the relay's default when unset) and
// podgate_cri_budget_held_bytes (what the relay holds: nothing while no request is under way);
// both are 0 before a server uses the metrics.
func TestBudgetSeries(t *testing.T) {
	be := newTestRuntime(t, filepath.Join(testfs.ShortDir(t), "rt.sock"))
	rt, err := NewBackend(t.Context(), "runtime", be.path, WithConnectWait(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close() })
	for _, tt := range []struct {
		name      string
		server    bool
		limits    relay.Limits
		wantLimit float64
	}{
		{name: "no server"},
		{name: "default", server: true, wantLimit: float64(relay.DefaultLimits.TotalBytes)},
		{name: "totalBytes set", server: true, limits: relay.Limits{TotalBytes: 64 << 20}, wantLimit: 64 << 20},
	} {
		t.Run(tt.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			m := NewMetrics(reg)
			if tt.server {
				NewServer(rt, rt, WithMetrics(m), WithLimits(tt.limits))
			}
			mfs, err := reg.Gather()
			if err != nil {
				t.Fatal(err)
			}
			if got := metricValue(mfs, "podgate_cri_budget_limit_bytes", nil); got != tt.wantLimit {
				t.Errorf("podgate_cri_budget_limit_bytes = %v, want %v", got, tt.wantLimit)
			}
			if got := metricValue(mfs, "podgate_cri_budget_held_bytes", nil); got != 0 {
				t.Errorf("podgate_cri_budget_held_bytes = %v with no request under way, want 0", got)
			}
		})
	}
}
