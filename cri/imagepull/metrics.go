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
// only: never image names of callers' choosing beyond the host, never credentials. What a
// caller or a backend call measured is labelled by the pull's kind (image, security_profile);
// the gauges count what the caps count, both kinds together.
type metrics struct {
	queueLength      prometheus.Gauge
	inFlight         prometheus.Gauge
	registryInFlight *prometheus.GaugeVec
	// wait, duration, deduplicated and cancelled are by the pull's kind: each its vector with
	// the kind label filled in.
	wait         map[Kind]prometheus.Observer
	duration     map[Kind]prometheus.ObserverVec // by result
	deduplicated map[Kind]prometheus.Counter
	cancelled    map[Kind]*prometheus.CounterVec // by reason
	stalls       *prometheus.CounterVec
}

// byKind are the vectors labelled by the pull's kind, before their kind is filled in.
type byKind struct {
	wait, duration          *prometheus.HistogramVec
	deduplicated, cancelled *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	v := newByKind()
	m := &metrics{
		wait: map[Kind]prometheus.Observer{}, duration: map[Kind]prometheus.ObserverVec{},
		deduplicated: map[Kind]prometheus.Counter{}, cancelled: map[Kind]*prometheus.CounterVec{},
		queueLength: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "podgate", Name: "image_pull_queue_length",
			Help: "Backend pulls waiting for a slot, images and security profiles (callers sharing one pull count once).",
		}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "podgate", Name: "image_pull_in_flight",
			Help: "PullImage and PullSecurityProfile calls in flight to the backend on this node.",
		}),
		registryInFlight: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "podgate", Name: "image_pull_registry_in_flight",
			Help: "PullImage and PullSecurityProfile calls in flight to the backend, by registry host for the hosts in imagePulls.perRegistry, \"other\" for the rest.",
		}, []string{"registry"}),
		stalls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "podgate", Name: "image_pull_stalls_total",
			Help: "Backend pulls podgate cancelled as stalled (below imagePulls.stall.minBytesPerSecond over imagePulls.stall.window), by registry host for the hosts in imagePulls.perRegistry, \"other\" for the rest.",
		}, []string{"registry"}),
	}
	for _, k := range kinds {
		kind := prometheus.Labels{"kind": k.String()}
		m.wait[k] = v.wait.With(kind)
		m.duration[k] = v.duration.MustCurryWith(kind)
		m.deduplicated[k] = v.deduplicated.With(kind)
		m.cancelled[k] = v.cancelled.MustCurryWith(kind)
		for _, r := range []string{resultSuccess, resultError, resultCanceled} {
			m.duration[k].WithLabelValues(r)
		}
		for _, r := range []string{reasonCaller, reasonPodDeleted} {
			m.cancelled[k].WithLabelValues(r)
		}
	}
	if reg != nil {
		reg.MustRegister(m.queueLength, m.inFlight, m.registryInFlight, v.wait, v.duration, v.deduplicated, v.cancelled, m.stalls)
	}
	return m
}

// newByKind makes the vectors labelled by kind.
func newByKind() byKind {
	return byKind{
		wait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "podgate", Name: "image_pull_wait_seconds",
			Help:    "Time a PullImage or PullSecurityProfile caller waited for its pull to start (or until it gave up), by kind (image, security_profile).",
			Buckets: prometheus.ExponentialBuckets(0.001, 4, 12), // 1ms .. ~70min
		}, []string{"kind"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "podgate", Name: "image_pull_duration_seconds",
			Help:    "Duration of backend pulls, by kind (image, security_profile) and result (success, error, canceled).",
			Buckets: prometheus.ExponentialBuckets(0.05, 2, 14), // 50ms .. ~7min
		}, []string{"kind", "result"}),
		deduplicated: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "podgate", Name: "image_pull_deduplicated_total",
			Help: "PullImage and PullSecurityProfile calls that joined a backend pull of the same kind, reference, credentials and runtime handler (and profile kind), by kind (image, security_profile).",
		}, []string{"kind"}),
		cancelled: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "podgate", Name: "image_pull_cancelled_total",
			Help: "PullImage and PullSecurityProfile callers that stopped waiting, by kind (image, security_profile) and reason (caller: its context ended; pod_deleted).",
		}, []string{"kind", "reason"}),
	}
}
