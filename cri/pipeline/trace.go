package pipeline

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// TracerName names the spans of podgate's own work (stages, verifications, driver calls).
// It stays the name spans had before the features left the agent, so that trace queries
// written for it keep working.
const TracerName = "github.com/podgate/podgate/agent"

// StartSpan starts a span of podgate's work as a child of the span in ctx (the CRI call's,
// made by the tracing stats handler), from that span's provider: a no-op one when tracing is
// off or the call is not sampled.
func StartSpan(ctx context.Context, name string, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	return trace.SpanFromContext(ctx).TracerProvider().Tracer(TracerName).Start(ctx, name, trace.WithAttributes(attrs...))
}

// EndSpan ends span, marking it failed with err.
func EndSpan(span trace.Span, err error) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}
