package dra_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"k8s.io/klog/v2/ktesting"

	"github.com/podgate/podgate/dra"
	"github.com/podgate/podgate/dra/dratest"
	"github.com/podgate/podgate/test/testfs"
)

// waitLimit bounds every wait of these tests: a bound on a failure, never a pause.
const waitLimit = 30 * time.Second

// node is a plugin registry and, beside it, a directory for the drivers' DRA sockets, as
// /var/lib/kubelet/plugins_registry and /var/lib/kubelet/plugins are on a node.
type node struct {
	registry string
	plugins  string
}

func newNode(t *testing.T) *node {
	t.Helper()
	base := testfs.ShortDir(t)
	n := &node{registry: filepath.Join(base, "r"), plugins: filepath.Join(base, "p")}
	for _, dir := range []string{n.registry, n.plugins} {
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return n
}

// startDriver starts a fake driver on n until the test ends.
func startDriver(t *testing.T, n *node, name string, opts ...dratest.Option) *dratest.Driver {
	t.Helper()
	return dratest.Start(t, n.registry, n.plugins, name, opts...)
}

// tracer records the events Drivers reports on registry paths.
type tracer struct {
	mu     sync.Mutex
	counts map[[2]string]int
	wake   chan struct{}
}

func newTracer() *tracer {
	return &tracer{counts: map[[2]string]int{}, wake: make(chan struct{})}
}

func (tr *tracer) record(event, path string) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.counts[[2]string{event, path}]++
	close(tr.wake)
	tr.wake = make(chan struct{})
}

func (tr *tracer) count(event, path string) int {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return tr.counts[[2]string{event, path}]
}

// wait waits until event has been reported on path at least n times.
func (tr *tracer) wait(t *testing.T, event, path string, n int) {
	t.Helper()
	limit := time.NewTimer(waitLimit)
	defer limit.Stop()
	for {
		tr.mu.Lock()
		got, wake := tr.counts[[2]string{event, path}], tr.wake
		tr.mu.Unlock()
		if got >= n {
			return
		}
		select {
		case <-wake:
		case <-limit.C:
			t.Fatalf("no %d× %q on %s within %s (got %d)", n, event, path, waitLimit, got)
		}
	}
}

// discovery is a running Drivers with its metrics registry and event trace.
type discovery struct {
	*dra.Drivers
	metrics *prometheus.Registry
	trace   *tracer
}

// startDiscovery runs Drivers on n's registry until the test ends, and checks that Run then
// returns nil. Retries are quick so that tests wait little.
func startDiscovery(t *testing.T, n *node, opts ...dra.Option) *discovery {
	t.Helper()
	reg := prometheus.NewRegistry()
	opts = append([]dra.Option{
		dra.WithPluginRegistryDir(n.registry),
		dra.WithRegisterer(reg),
		dra.WithRetryBackoff(5*time.Millisecond, 20*time.Millisecond),
	}, opts...)
	d := &discovery{Drivers: dra.NewDrivers(opts...), metrics: reg, trace: newTracer()}
	dra.SetTrace(d.Drivers, d.trace.record)
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- d.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-ran; err != nil {
			t.Errorf("Run: %v", err)
		}
		if err := d.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return d
}

// waitFor waits until the driver is known, with the test's bound.
func (d *discovery) waitFor(t *testing.T, name string) *dra.Driver {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	drv, err := d.WaitFor(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	return drv
}

// waitUntil waits until cond holds of the set, re-checking at each change.
func (d *discovery) waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	limit := time.NewTimer(waitLimit)
	defer limit.Stop()
	for {
		changed := d.Changed()
		if cond() {
			return
		}
		select {
		case <-changed:
		case <-limit.C:
			t.Fatalf("not %s within %s; drivers: %v", what, waitLimit, d.Names())
		}
	}
}

// metric returns the value of the counter or gauge name with labels, and whether it exists.
func (d *discovery) metric(t *testing.T, name string, labels map[string]string) (float64, bool) {
	t.Helper()
	families, err := d.metrics.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			if !hasLabels(m, labels) {
				continue
			}
			switch {
			case m.GetCounter() != nil:
				return m.GetCounter().GetValue(), true
			case m.GetGauge() != nil:
				return m.GetGauge().GetValue(), true
			case m.GetHistogram() != nil:
				return float64(m.GetHistogram().GetSampleCount()), true
			}
		}
	}
	return 0, false
}

func hasLabels(m *dto.Metric, labels map[string]string) bool {
	n := 0
	for _, lp := range m.GetLabel() {
		v, ok := labels[lp.GetName()]
		if !ok {
			continue
		}
		if v != lp.GetValue() {
			return false
		}
		n++
	}
	return n == len(labels)
}

// mustRemove removes a file the test made.
func mustRemove(t *testing.T, path string) {
	t.Helper()
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
}
