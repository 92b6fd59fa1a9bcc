package config

import (
	"errors"
	"fmt"
	"net"
)

// DefaultTracingEndpoint is the collector podgate sends spans to when tracing.endpoint is
// unset: the kubelet's default (component-base's TracingConfiguration).
const DefaultTracingEndpoint = "localhost:4317"

// Tracing is the tracing section, in the kubelet's convention (KubeletConfiguration's
// tracing): spans go to an OpenTelemetry collector over OTLP/gRPC. podgate continues the trace
// the kubelet sends with each CRI call and passes its own on to containerd.
type Tracing struct {
	// Endpoint is the collector's OTLP/gRPC endpoint, host:port. Default localhost:4317.
	Endpoint string `json:"endpoint,omitempty"`
	// SamplingRatePerMillion is how many traces per million podgate starts itself are
	// sampled. A call the kubelet sampled is always traced (parent-based sampling), so the
	// default, 0, traces exactly what the kubelet traces.
	SamplingRatePerMillion *int32 `json:"samplingRatePerMillion,omitempty"`
}

func (t *Tracing) setDefaults() {
	if t.Endpoint == "" {
		t.Endpoint = DefaultTracingEndpoint
	}
	if t.SamplingRatePerMillion == nil {
		var zero int32
		t.SamplingRatePerMillion = &zero
	}
}

func (t *Tracing) validate() error {
	var errs []error
	if host, port, err := net.SplitHostPort(t.Endpoint); err != nil || host == "" || port == "" {
		errs = append(errs, fmt.Errorf("tracing.endpoint: %q: want host:port of an OTLP/gRPC collector", t.Endpoint))
	}
	if r := t.SamplingRatePerMillion; r != nil && (*r < 0 || *r > 1_000_000) {
		errs = append(errs, fmt.Errorf("tracing.samplingRatePerMillion: %d: want 0 to 1000000", *r))
	}
	return errors.Join(errs...)
}
