package cri

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/podgate/podgate/cri/relay"
)

// TestBudgetGauges: the held and budget gauges read the CRI socket's relay: 0 before a server
// uses the metrics, then the budget in force and what the relay holds.
func TestBudgetGauges(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	gauge := func(name string) float64 {
		t.Helper()
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == name {
				return mf.GetMetric()[0].GetGauge().GetValue()
			}
		}
		t.Fatalf("no %s", name)
		return 0
	}
	if held, budget := gauge("podgate_cri_held_bytes"), gauge("podgate_cri_budget_bytes"); held != 0 || budget != 0 {
		t.Errorf("before a server: held %v, budget %v; want 0, 0", held, budget)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	be, err := NewBackend(ctx, "runtime", "/nonexistent.sock", WithConnectWait(time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	NewServer(be, be, WithMetrics(m), WithLimits(relay.Limits{TotalBytes: 32 << 20}))
	if budget := gauge("podgate_cri_budget_bytes"); budget != 32<<20 {
		t.Errorf("budget %v, want %d", budget, 32<<20)
	}
	if n, err := testutil.GatherAndCount(reg, "podgate_cri_held_bytes"); err != nil || n != 1 {
		t.Errorf("podgate_cri_held_bytes: %d series, %v", n, err)
	}
}
