package scrape

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
)

// page renders what reg holds as a /metrics page does.
func page(t *testing.T, reg *prometheus.Registry) string {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, f := range families {
		if _, err := expfmt.MetricFamilyToText(&b, f); err != nil {
			t.Fatal(err)
		}
	}
	return b.String()
}

func TestMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	calls := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "calls_total", Help: "h"}, []string{"method", "code"})
	queue := prometheus.NewGauge(prometheus.GaugeOpts{Name: "queue_length", Help: "h"})
	stage := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "stage_seconds", Help: "h"}, []string{"stage"})
	reg.MustRegister(calls, queue, stage)
	calls.WithLabelValues("Get", "OK").Add(3)
	calls.WithLabelValues("Get", "NotFound").Inc()
	queue.Set(4)
	stage.WithLabelValues("forward").Observe(0.25)
	before, err := Parse(page(t, reg))
	if err != nil {
		t.Fatal(err)
	}
	stage.WithLabelValues("forward").Observe(0.5)
	after, err := Parse(page(t, reg))
	if err != nil {
		t.Fatal(err)
	}

	if v, ok := after.Value("calls_total", "method", "Get", "code", "NotFound"); !ok || v != 1 {
		t.Errorf("calls_total{Get,NotFound} = %v, %v; want 1", v, ok)
	}
	if v, ok := after.Value("calls_total", "code", "OK"); !ok || v != 3 {
		t.Errorf("calls_total{code=OK} = %v, %v; want 3 (labels given are a subset)", v, ok)
	}
	if v, ok := after.Value("queue_length"); !ok || v != 4 {
		t.Errorf("queue_length = %v, %v; want 4", v, ok)
	}
	if _, ok := after.Value("calls_total", "method", "List"); ok {
		t.Error("calls_total{method=List} found; the page has none")
	}
	if _, ok := after.Value("missing_total"); ok {
		t.Error("missing_total found")
	}
	d := after.Histogram("stage_seconds", "stage", "forward").Sub(before.Histogram("stage_seconds", "stage", "forward"))
	if d.Count != 1 || d.Sum != 0.5 {
		t.Errorf("stage_seconds{forward} between the scrapes: %+v, want one observation of 0.5", d)
	}
	if h := after.Histogram("stage_seconds", "stage", "record"); h != (Histogram{}) {
		t.Errorf("stage_seconds{record}: %+v, want zero (never observed)", h)
	}
	if _, err := Parse("not a metric page {"); err == nil {
		t.Error("Parse of garbage: no error")
	}
}
