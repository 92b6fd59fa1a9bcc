// Package tracing is podgate's OpenTelemetry set-up (the kubelet's tracing keys), plugged into
// the CRI server and its backends as gRPC stats handlers.
package tracing

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"k8s.io/klog/v2"

	"github.com/podgate/podgate/agent/config"
	"github.com/podgate/podgate/cri"
	"github.com/podgate/podgate/cri/pipeline"
)

// Tracing is podgate's OpenTelemetry set-up: spans exported over OTLP/gRPC, sampled as the
// kubelet samples (parent-based: a call the kubelet traces is traced, others at
// tracing.samplingRatePerMillion), the W3C trace context read from the kubelet's calls and
// written into podgate's calls to containerd.
//
// The SDK's span processing and the OTLP conversion are OpenTelemetry's; the gRPC parts, the
// stats handler that makes a span per call and the client that sends the spans to the
// collector, are podgate's own (grpc.go): otelgrpc and otlptracegrpc bring metrics,
// retries, configuration from the environment and grpc-gateway with them, about 0.7 MB of
// binary and 0.5 MiB of resident memory on every node, tracing or not (BENCHMARKS.md).
type Tracing struct {
	provider *sdktrace.TracerProvider
	server   cri.Option
	backend  cri.BackendOption
}

// New sets up tracing from the tracing section, for podgate of this version on this node
// (nodeName; "": the host's name); nil when the section is unset (off).
func New(ctx context.Context, tc *config.Tracing, version, nodeName string) (*Tracing, error) {
	if tc == nil {
		return nil, nil
	}
	// The client connects lazily: a collector that is not there yet loses the spans of the
	// meantime, never a CRI call.
	exp, err := otlptrace.New(ctx, newOTLPClient(tc.Endpoint))
	if err != nil {
		return nil, fmt.Errorf("tracing.endpoint: %w", err)
	}
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(
		attribute.String("service.name", "podgate"), attribute.String("service.version", version),
		attribute.String("host.name", hostName(nodeName))))
	if err != nil {
		return nil, fmt.Errorf("tracing resource: %w", err)
	}
	rate := float64(*tc.SamplingRatePerMillion) / 1e6
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(rate))),
		sdktrace.WithBatcher(exp),
		sdktrace.WithResource(res),
	)
	prop := propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
	tracer := tp.Tracer(pipeline.TracerName)
	klog.FromContext(ctx).Info("Tracing on", "endpoint", tc.Endpoint, "samplingRatePerMillion", *tc.SamplingRatePerMillion)
	return &Tracing{
		provider: tp,
		server:   cri.WithStatsHandler(&callSpans{tracer: tracer, prop: prop, server: true}),
		backend:  cri.WithBackendStatsHandler(&callSpans{tracer: tracer, prop: prop}),
	}, nil
}

// Shutdown exports the spans still buffered, within ctx.
func (t *Tracing) Shutdown(ctx context.Context) error {
	if t == nil {
		return nil
	}
	if err := t.provider.Shutdown(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return fmt.Errorf("tracing: %w", err)
	}
	return nil
}

// ServerOptions is what tracing adds to the CRI server: nothing when it is off.
func (t *Tracing) ServerOptions() []cri.Option {
	if t == nil {
		return nil
	}
	return []cri.Option{t.server}
}

// BackendOptions is what tracing adds to the CRI server's backends: nothing when it is off.
func (t *Tracing) BackendOptions() []cri.BackendOption {
	if t == nil {
		return nil
	}
	return []cri.BackendOption{t.backend}
}

// hostName is the node's name as the kubelet names it: nodeName, else the host name in lower
// case; "" when neither is known.
func hostName(nodeName string) string {
	if nodeName != "" {
		return nodeName
	}
	h, _ := os.Hostname() // only a resource attribute: none when the kernel has no name
	return strings.ToLower(h)
}
