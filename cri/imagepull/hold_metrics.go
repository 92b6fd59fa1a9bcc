package imagepull

import (
	"github.com/prometheus/client_golang/prometheus"
)

// holdMetrics are the metrics of cool-downs: registries cooling, push-backs, retries, and the
// pulls whose callers got the registry's push-back after all.
type holdMetrics struct {
	pushBacks *prometheus.CounterVec
	retries   *prometheus.CounterVec
	gaveUp    *prometheus.CounterVec
}

// coolingDesc is podgate_image_pull_registry_cooling, collected from the cool-downs at each
// scrape: a cool-down ends by the clock, not by an event.
var coolingDesc = prometheus.NewDesc("podgate_image_pull_registry_cooling",
	"Registries in a cool-down after they pushed back (HTTP 429, or 503 with Retry-After): their pulls wait in podgate's queue. By registry host for the hosts in imagePulls.perRegistry or perRegistryRate (0 or 1), \"other\" for the rest (how many).",
	[]string{"registry"}, nil)

func newHoldMetrics(reg prometheus.Registerer, g *Governor) *holdMetrics {
	m := &holdMetrics{
		pushBacks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "podgate", Name: "image_pull_push_backs_total",
			Help: "Backend pulls that failed because their registry pushed back: HTTP 429 Too Many Requests, or 503 with Retry-After (code), by registry host for the hosts in imagePulls.perRegistry or perRegistryRate, \"other\" for the rest.",
		}, []string{"registry", "code"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "podgate", Name: "image_pull_retries_total",
			Help: "Backend pulls podgate tried again after their registry's cool-down, by registry as in podgate_image_pull_push_backs_total.",
		}, []string{"registry"}),
		gaveUp: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "podgate", Name: "image_pull_push_back_failures_total",
			Help: "Backend pulls whose callers got their registry's push-back error: held and retried for imagePulls.coolDown.retryFor, the registry still refused. By registry as in podgate_image_pull_push_backs_total.",
		}, []string{"registry"}),
	}
	if reg != nil {
		reg.MustRegister(m.pushBacks, m.retries, m.gaveUp, coolingCollector{g})
	}
	return m
}

// coolingCollector collects podgate_image_pull_registry_cooling: a series for each registry
// with a label of its own, and "other", always.
type coolingCollector struct{ g *Governor }

func (c coolingCollector) Describe(ch chan<- *prometheus.Desc) { ch <- coolingDesc }

func (c coolingCollector) Collect(ch chan<- prometheus.Metric) {
	for label, n := range c.g.coolingByLabel() {
		ch <- prometheus.MustNewConstMetric(coolingDesc, prometheus.GaugeValue, float64(n), label)
	}
}

// coolingByLabel counts the registries cooling down now, by metric label, every label of
// the configuration present.
func (g *Governor) coolingByLabel() map[string]int {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := map[string]int{otherRegistries: 0}
	for host := range g.limits.PerRegistry {
		out[host] = 0
	}
	for host := range g.limits.PerRegistryRate {
		out[host] = 0
	}
	if g.cool == nil {
		return out
	}
	now := g.now()
	for registry, s := range g.cool.reg {
		if s.cooling(now) {
			out[g.registryLabel(registry)]++
		}
	}
	return out
}
