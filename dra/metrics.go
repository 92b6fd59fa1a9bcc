package dra

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Operations, the operation label of podgate_dra_operations_total and
// podgate_dra_operation_duration_seconds.
const (
	opPrepare   = "prepare"
	opUnprepare = "unprepare"
)

// Results of a driver call, the result label of podgate_dra_operations_total.
const (
	resultSuccess    = "success"     // every claim done
	resultClaimError = "claim_error" // the call answered, at least one claim failed
	resultError      = "error"       // the call failed: unreachable, or the driver failed it
	resultTimeout    = "timeout"     // no answer within the call timeout
	resultCanceled   = "canceled"    // the caller gave up first
)

// Reasons a registration socket was not taken, the reason label of
// podgate_dra_driver_discovery_errors_total.
const (
	reasonGetInfo = "getinfo" // no GetInfo answer: not listening, too slow, or an error
	reasonInvalid = "invalid" // a DRAPlugin registration podgate cannot use
)

// metrics are the package's Prometheus metrics. Labels hold driver names (from the node's own
// registrations) and fixed words, never socket paths or claim names.
type metrics struct {
	drivers         *prometheus.GaugeVec
	discoveryErrors *prometheus.CounterVec
	operations      *prometheus.CounterVec
	duration        *prometheus.HistogramVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		drivers: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "podgate", Name: "dra_drivers",
			Help: "DRA drivers podgate knows from the plugin registry: 1 per driver.",
		}, []string{"driver"}),
		discoveryErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "podgate", Name: "dra_driver_discovery_errors_total",
			Help: "Registration sockets that gave no usable answer, by reason (getinfo: no GetInfo answer; invalid: a DRA registration podgate cannot use).",
		}, []string{"reason"}),
		operations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "podgate", Name: "dra_operations_total",
			Help: "Calls to DRA drivers, by driver, operation (prepare, unprepare) and result (success, claim_error, error, timeout, canceled).",
		}, []string{"driver", "operation", "result"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "podgate", Name: "dra_operation_duration_seconds",
			Help:    "Duration of calls to DRA drivers, by driver and operation.",
			Buckets: prometheus.ExponentialBuckets(0.001, 4, 10), // 1ms .. ~4min
		}, []string{"driver", "operation"}),
	}
	for _, r := range []string{reasonGetInfo, reasonInvalid} {
		m.discoveryErrors.WithLabelValues(r)
	}
	if reg != nil {
		reg.MustRegister(m.drivers, m.discoveryErrors, m.operations, m.duration)
	}
	return m
}

func (m *metrics) observe(driver, op, result string, start time.Time) {
	m.operations.WithLabelValues(driver, op, result).Inc()
	m.duration.WithLabelValues(driver, op).Observe(time.Since(start).Seconds())
}
