package agent

import (
	"path/filepath"
	"testing"

	dto "github.com/prometheus/client_model/go"

	"github.com/prometheus/client_golang/prometheus"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podgate/podgate/test/crifake"
)

// serveRuntime serves rt as a CRI runtime on a unix socket in dir and returns its path.
func serveRuntime(t testing.TB, dir string, rt runtimeapi.RuntimeServiceServer) string {
	t.Helper()
	path := filepath.Join(dir, "rt.sock")
	crifake.Serve(t, path, rt)
	return path
}

// counterValue returns the value of the counter name{label=value} in reg, 0 when absent.
func counterValue(t *testing.T, reg prometheus.Gatherer, name, label, value string) float64 {
	t.Helper()
	return findMetric(t, reg, name, label, value).GetCounter().GetValue()
}

// histogramCount returns the sample count of the histogram name{label=value} in reg, 0 when
// absent.
func histogramCount(t *testing.T, reg prometheus.Gatherer, name, label, value string) uint64 {
	t.Helper()
	return findMetric(t, reg, name, label, value).GetHistogram().GetSampleCount()
}

// findMetric returns the metric name{label=value} in reg; nil (whose getters give zeros) when
// absent.
func findMetric(t *testing.T, reg prometheus.Gatherer, name, label, value string) *dto.Metric {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == label && lp.GetValue() == value {
					return m
				}
			}
		}
	}
	return nil
}
