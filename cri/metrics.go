package cri

import (
	"strings"
	"sync/atomic"
	"time"

	"github.com/podgate/podgate/cri/relay"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Metrics are the proxy's per-method Prometheus metrics.
type Metrics struct {
	requests  *prometheus.CounterVec
	latency   *prometheus.HistogramVec
	inFlight  *prometheus.GaugeVec
	backendUp *prometheus.GaugeVec
	// refusals counts what the relay refused its clients, by reason; each reason's counter is
	// made up front, so that a reason shows at 0 before it happens.
	refusals map[string]prometheus.Counter
	// methods holds the instruments of every method podgate's cri-api knows, and of the newer
	// ones it knows by name (newerMethods), made once so a call does no label lookup. Methods it does not know share the "other" entry: their names
	// come from clients and must not grow the label set.
	methods map[string]*methodMetrics
	other   *methodMetrics
	// budget reads the relay's budget for podgate_cri_budget_held_bytes and
	// podgate_cri_budget_limit_bytes; nil until a Server uses these metrics.
	budget atomic.Pointer[budget]
}

// budget is what a relay holds for its clients, and the most it may hold (its TotalBytes).
type budget struct {
	held  func() int64
	limit int64
}

type methodMetrics struct {
	codes    [codes.Unauthenticated + 1]prometheus.Counter
	latency  prometheus.Observer
	inFlight prometheus.Gauge
}

// NewMetrics creates the proxy's metrics and registers them with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "podgate", Subsystem: "cri", Name: "requests_total",
			Help: "CRI calls served, by method and gRPC status code.",
		}, []string{"method", "code"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "podgate", Subsystem: "cri", Name: "request_duration_seconds",
			Help:    "Latency of CRI calls through podgate, by method.",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120},
		}, []string{"method"}),
		inFlight: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "podgate", Subsystem: "cri", Name: "requests_in_flight",
			Help: "CRI calls being served now, by method (streams count while open).",
		}, []string{"method"}),
		backendUp: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "podgate", Subsystem: "cri", Name: "backend_up",
			Help: "1 when podgate is connected to the backend runtime endpoint, 0 otherwise.",
		}, []string{"backend", "endpoint"}),
		methods:  map[string]*methodMetrics{},
		refusals: map[string]prometheus.Counter{},
	}
	refusals := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "podgate", Subsystem: "cri", Name: "connection_refusals_total",
		Help: "Calls refused and connections closed on the CRI socket because a client went over a limit or broke HTTP/2, by reason.",
	}, []string{"reason"})
	for _, r := range relay.Reasons {
		m.refusals[r] = refusals.WithLabelValues(r)
	}
	held := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "podgate", Subsystem: "cri", Name: "budget_held_bytes",
		Help: "Bytes the CRI socket holds now for its clients (requests not handed on yet, decoded intercepted requests, answers the clients have not taken), counted against criSocketLimits.totalBytes.",
	}, func() float64 {
		if b := m.budget.Load(); b != nil {
			return float64(b.held())
		}
		return 0
	})
	limit := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "podgate", Subsystem: "cri", Name: "budget_limit_bytes",
		Help: "criSocketLimits.totalBytes: the most the CRI socket holds for its clients.",
	}, func() float64 {
		if b := m.budget.Load(); b != nil {
			return float64(b.limit)
		}
		return 0
	})
	reg.MustRegister(m.requests, m.latency, m.inFlight, m.backendUp, refusals, held, limit)
	for _, sd := range []struct {
		name    string
		methods []string
	}{
		{runtimeapi.RuntimeService_ServiceDesc.ServiceName, methodNames(runtimeapi.RuntimeService_ServiceDesc.Methods, runtimeapi.RuntimeService_ServiceDesc.Streams)},
		{runtimeapi.ImageService_ServiceDesc.ServiceName, methodNames(runtimeapi.ImageService_ServiceDesc.Methods, runtimeapi.ImageService_ServiceDesc.Streams)},
	} {
		for _, name := range sd.methods {
			m.methods["/"+sd.name+"/"+name] = m.newMethod(name)
		}
	}
	for _, name := range newerMethodNames() {
		m.methods[name] = m.newMethod(shortMethod(name))
	}
	m.other = m.newMethod("other")
	return m
}

func (m *Metrics) newMethod(label string) *methodMetrics {
	mm := &methodMetrics{
		latency:  m.latency.WithLabelValues(label),
		inFlight: m.inFlight.WithLabelValues(label),
	}
	for c := range mm.codes {
		mm.codes[c] = m.requests.WithLabelValues(label, codes.Code(c).String())
	}
	return mm
}

func (m *Metrics) forMethod(fullMethod string) *methodMetrics {
	if mm, ok := m.methods[fullMethod]; ok {
		return mm
	}
	return m.other
}

// BackendState returns a function for WithStateFunc that keeps podgate_cri_backend_up current.
func (m *Metrics) BackendState(name, endpoint string) func(bool) {
	g := m.backendUp.WithLabelValues(name, endpoint)
	return func(up bool) {
		if up {
			g.Set(1)
		} else {
			g.Set(0)
		}
	}
}

func (mm *methodMetrics) done(start time.Time, code codes.Code) {
	mm.inFlight.Dec()
	mm.latency.Observe(time.Since(start).Seconds())
	if int(code) < len(mm.codes) {
		mm.codes[code].Inc()
	} else {
		mm.codes[codes.Unknown].Inc()
	}
}

// watchBudget makes the budget series read the relay's: held now, and limit.
func (m *Metrics) watchBudget(held func() int64, limit int64) {
	m.budget.Store(&budget{held: held, limit: limit})
}

// refused counts one of the relay's refusals (relay.Server.Refused).
func (m *Metrics) refused(reason string) {
	if c, ok := m.refusals[reason]; ok {
		c.Inc()
	}
}

// shortMethod turns "/runtime.v1.RuntimeService/Version" into "Version" for logs.
func shortMethod(fullMethod string) string {
	return fullMethod[strings.LastIndexByte(fullMethod, '/')+1:]
}
