// Package scrape reads a Prometheus /metrics page, such as podgate's, for tests and the demo:
// the value of a counter or gauge, and the sum and count of a histogram, by metric name and
// labels.
package scrape

import (
	"fmt"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Metrics is one scrape: the metric families of a page, by name.
type Metrics map[string]*dto.MetricFamily

// Parse reads a page in the Prometheus text format.
func Parse(page string) (Metrics, error) {
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(strings.NewReader(page))
	if err != nil {
		return nil, fmt.Errorf("parse metrics: %w", err)
	}
	return Metrics(families), nil
}

// find returns the sample of name whose labels include labels (name, value, name, value, ...),
// or nil.
func (m Metrics) find(name string, labels []string) *dto.Metric {
	f := m[name]
	if f == nil {
		return nil
	}
	for _, s := range f.GetMetric() {
		if hasLabels(s, labels) {
			return s
		}
	}
	return nil
}

func hasLabels(s *dto.Metric, labels []string) bool {
	for i := 0; i+1 < len(labels); i += 2 {
		found := false
		for _, l := range s.GetLabel() {
			if l.GetName() == labels[i] && l.GetValue() == labels[i+1] {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// Value is the value of the counter or gauge name with labels (name, value pairs), and whether
// the page has it.
func (m Metrics) Value(name string, labels ...string) (float64, bool) {
	s := m.find(name, labels)
	switch {
	case s == nil:
		return 0, false
	case s.GetCounter() != nil:
		return s.GetCounter().GetValue(), true
	case s.GetGauge() != nil:
		return s.GetGauge().GetValue(), true
	case s.GetUntyped() != nil:
		return s.GetUntyped().GetValue(), true
	}
	return 0, false
}

// Histogram is the sum and count of one histogram.
type Histogram struct {
	Sum   float64
	Count uint64
}

// Sub is h minus an earlier scrape of the same histogram: what was observed between the two.
func (h Histogram) Sub(earlier Histogram) Histogram {
	return Histogram{Sum: h.Sum - earlier.Sum, Count: h.Count - earlier.Count}
}

// Histogram is the histogram name with labels (name, value pairs); zero when the page lacks it,
// as a histogram nobody observed yet.
func (m Metrics) Histogram(name string, labels ...string) Histogram {
	s := m.find(name, labels)
	if s.GetHistogram() == nil {
		return Histogram{}
	}
	return Histogram{Sum: s.GetHistogram().GetSampleSum(), Count: s.GetHistogram().GetSampleCount()}
}
