package agent

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

	"github.com/podgate/podgate/cri"
	"github.com/podgate/podgate/pipeline"
)

// tracing is podgate's OpenTelemetry set-up: spans exported over OTLP/gRPC, sampled as the
// kubelet samples (parent-based: a call the kubelet traces is traced, others at
// tracing.samplingRatePerMillion), the W3C trace context read from the kubelet's calls and
// written into podgate's calls to containerd.
//
// The SDK's span processing and the OTLP conversion are OpenTelemetry's; the gRPC parts, the
// stats handler that makes a span per call and the client that sends the spans to the
// collector, are podgate's own (tracing_grpc.go): otelgrpc and otlptracegrpc bring metrics,
// retries, configuration from the environment and grpc-gateway with them, about 0.7 MB of
// binary and 0.5 MiB of resident memory on every node, tracing or not (BENCHMARKS.md).
type tracing struct {
	provider *sdktrace.TracerProvider
	server   cri.Option
	backend  cri.BackendOption
}

// newTracing sets up tracing from the tracing section; nil when it is unset (off).
func (a *Agent) newTracing(ctx context.Context) (*tracing, error) {
	tc := a.cfg.Tracing
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
		attribute.String("service.name", "podgate"), attribute.String("service.version", a.version),
		attribute.String("host.name", hostName(a.cfg.NodeName))))
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
	return &tracing{
		provider: tp,
		server:   cri.WithStatsHandler(&callSpans{tracer: tracer, prop: prop, server: true}),
		backend:  cri.WithBackendStatsHandler(&callSpans{tracer: tracer, prop: prop}),
	}, nil
}

// shutdown exports the spans still buffered, within ctx.
func (t *tracing) shutdown(ctx context.Context) error {
	if t == nil {
		return nil
	}
	if err := t.provider.Shutdown(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return fmt.Errorf("tracing: %w", err)
	}
	return nil
}

// serverOptions and backendOptions are what tracing adds to the CRI server and its backends:
// nothing when it is off.
func (t *tracing) serverOptions() []cri.Option {
	if t == nil {
		return nil
	}
	return []cri.Option{t.server}
}

func (t *tracing) backendOptions() []cri.BackendOption {
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
