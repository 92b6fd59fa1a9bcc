package podresources

import (
	"strings"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the package's Prometheus metrics; labels hold method names and fixed words only.
type metrics struct {
	requests        *prometheus.CounterVec
	kubeletRequests *prometheus.CounterVec
	kubeletUp       prometheus.Gauge
	// The coalescing of calls to the kubelet, its waits and what they cost the callers.
	kubeletCoalesced   *prometheus.CounterVec
	kubeletThrottle    prometheus.Histogram
	kubeletWait        *prometheus.HistogramVec
	kubeletUnavailable *prometheus.CounterVec
	watchers           prometheus.GaugeFunc
	watchersDropped    prometheus.Counter
	refusals           *prometheus.CounterVec
}

// newMetrics makes the metrics and registers them with r when r is not nil. watchers reads
// the number of running watches; nil reads zero.
func newMetrics(r prometheus.Registerer) *metrics {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "podgate", Subsystem: "podresources", Name: "requests_total",
			Help: "Calls to podgate's PodResources socket, by gRPC method and status code (ResourceExhausted: over the rate limit).",
		}, []string{"method", "code"}),
		kubeletRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "podgate", Subsystem: "podresources", Name: "kubelet_requests_total",
			Help: "Calls podgate made to the kubelet's PodResources socket, by method and result (ok, not_found, refused: over the kubelet's rate limit, unavailable, not_listening: a socket nobody listens on, absent: no socket, error).",
		}, []string{"method", "result"}),
		kubeletCoalesced: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "podgate", Subsystem: "podresources", Name: "kubelet_coalesced_total",
			Help: "v1 calls that shared a call to the kubelet's PodResources socket another v1 call had asked for, instead of making their own, by method.",
		}, []string{"method"}),
		kubeletThrottle: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "podgate", Subsystem: "podresources", Name: "kubelet_throttle_seconds",
			Help:    "How long calls to the kubelet's PodResources socket waited for podgate's own token bucket (podResources.kubeletQPS, podResources.kubeletBurst).",
			Buckets: prometheus.ExponentialBucketsRange(0.001, 10, 9),
		}),
		kubeletWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "podgate", Subsystem: "podresources", Name: "kubelet_wait_seconds",
			Help:    "How long v1 calls waited for the kubelet's answer (behind another call, for a token, for retries), by method, whether it came or not.",
			Buckets: prometheus.ExponentialBucketsRange(0.001, 10, 9),
		}, []string{"method"}),
		kubeletUnavailable: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "podgate", Subsystem: "podresources", Name: "kubelet_unavailable_total",
			Help: "v1 calls answered Unavailable because the kubelet's part was missing, by method and reason (timeout: no answer within the wait, error: the kubelet failed, stopping: podgate is stopping).",
		}, []string{"method", "reason"}),
		kubeletUp: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "podgate", Subsystem: "podresources", Name: "kubelet_up",
			Help: "1 when the last call to the kubelet's PodResources socket was answered, 0 when it was not.",
		}),
		refusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "podgate", Subsystem: "podresources", Name: "refusals_total",
			Help: "What podgate refused a client of its PodResources socket, by reason (rate_limit, rate_limit_per_user: a call over its process's or its user's rate limit, answered ResourceExhausted; connections, connections_per_process, connections_per_user: a connection over the socket's, the process's or the user's quota, closed at once; streams_per_process, streams_per_user, watches, watches_per_process, watches_per_user: a call over a quota of open calls or watches, answered ResourceExhausted; header_timeout: a connection that opened no call within podResources.headerTimeout, closed; watch_stalled: a watch whose client read nothing for podResources.watchSendTimeout, ended).",
		}, []string{"reason"}),
		watchersDropped: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "podgate", Subsystem: "podresources", Name: "watchers_dropped_total",
			Help: "Watches ended because the client fell too far behind, or read nothing for podResources.watchSendTimeout.",
		}),
	}
	if r != nil {
		r.MustRegister(m.requests, m.kubeletRequests, m.watchersDropped, m.refusals)
	}
	return m
}

// registerKubelet registers the series of the calls to the kubelet's socket, which exist only
// when podgate asks the kubelet.
func (m *metrics) registerKubelet(r prometheus.Registerer) {
	if r != nil {
		r.MustRegister(m.kubeletUp, m.kubeletCoalesced, m.kubeletThrottle, m.kubeletWait, m.kubeletUnavailable)
	}
}

func (m *metrics) registerWatchers(r prometheus.Registerer, b *Broadcaster) {
	m.watchers = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "podgate", Subsystem: "podresources", Name: "watchers",
		Help: "Watches running on podgate's PodResources socket.",
	}, func() float64 { return float64(b.Watchers()) })
	if r != nil {
		r.MustRegister(m.watchers)
	}
}

func containsFold(s, sub string) bool {
	return strings.Contains(strings.ToLower(s), strings.ToLower(sub))
}
