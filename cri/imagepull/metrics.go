package imagepull

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Results of a backend pull, the result label of podgate_image_pull_duration_seconds.
const (
	resultSuccess  = "success"
	resultError    = "error"
	resultCanceled = "canceled"
)

// Reasons a caller stopped waiting, the reason label of podgate_image_pull_cancelled_total.
const (
	reasonCaller     = "caller"
	reasonPodDeleted = "pod_deleted"
)

// metrics are the governor's Prometheus metrics. Labels hold registry hosts and fixed words
// only: never image names of callers' choosing beyond the host, never credentials.
type metrics struct {
	queueLength      prometheus.Gauge
	inFlight         prometheus.Gauge
	registryInFlight *prometheus.GaugeVec
	wait             prometheus.Histogram
	duration         *prometheus.HistogramVec
	deduplicated     prometheus.Counter
	cancelled        *prometheus.CounterVec
	stalls           *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		queueLength: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "podgate", Name: "image_pull_queue_length",
			Help: "Backend pulls waiting for a slot (callers sharing one pull count once).",
		}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "podgate", Name: "image_pull_in_flight",
			Help: "PullImage calls in flight to the backend on this node.",
		}),
		registryInFlight: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "podgate", Name: "image_pull_registry_in_flight",
			Help: "PullImage calls in flight to the backend, by registry host for the hosts in imagePulls.perRegistry, \"other\" for the rest.",
		}, []string{"registry"}),
		wait: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "podgate", Name: "image_pull_wait_seconds",
			Help:    "Time a PullImage caller waited for its pull to start (or until it gave up).",
			Buckets: prometheus.ExponentialBuckets(0.001, 4, 12), // 1ms .. ~70min
		}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "podgate", Name: "image_pull_duration_seconds",
			Help:    "Duration of backend pulls, by result (success, error, canceled).",
			Buckets: prometheus.ExponentialBuckets(0.05, 2, 14), // 50ms .. ~7min
		}, []string{"result"}),
		deduplicated: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "podgate", Name: "image_pull_deduplicated_total",
			Help: "PullImage calls that joined a backend pull of the same image, credentials and runtime handler.",
		}),
		cancelled: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "podgate", Name: "image_pull_cancelled_total",
			Help: "PullImage callers that stopped waiting, by reason (caller: its context ended; pod_deleted).",
		}, []string{"reason"}),
		stalls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "podgate", Name: "image_pull_stalls_total",
			Help: "Backend pulls podgate cancelled as stalled (below imagePulls.stall.minBytesPerSecond over imagePulls.stall.window), by registry host for the hosts in imagePulls.perRegistry, \"other\" for the rest.",
		}, []string{"registry"}),
	}
	for _, r := range []string{resultSuccess, resultError, resultCanceled} {
		m.duration.WithLabelValues(r)
	}
	for _, r := range []string{reasonCaller, reasonPodDeleted} {
		m.cancelled.WithLabelValues(r)
	}
	if reg != nil {
		reg.MustRegister(m.queueLength, m.inFlight, m.registryInFlight, m.wait, m.duration, m.deduplicated, m.cancelled, m.stalls)
	}
	return m
}
