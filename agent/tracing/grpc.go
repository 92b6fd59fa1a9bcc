package tracing

import (
	"context"
	"fmt"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	otelcodes "go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// callSpans is a gRPC stats handler that makes a span per call, as otelgrpc's handlers do and
// with their names (the method without its leading slash) and rpc.* attributes. On the
// server it continues the trace whose context the call's metadata carries (the kubelet's);
// on a client it writes the call's span into the outgoing metadata, in place of the context
// forwarded from the caller, so that containerd's spans are children of podgate's.
type callSpans struct {
	tracer trace.Tracer
	prop   propagation.TextMapPropagator
	server bool
}

var _ stats.Handler = (*callSpans)(nil)

// TagRPC starts the call's span.
func (h *callSpans) TagRPC(ctx context.Context, info *stats.RPCTagInfo) context.Context {
	name := strings.TrimPrefix(info.FullMethodName, "/")
	service, method, _ := strings.Cut(name, "/")
	attrs := trace.WithAttributes(attribute.String("rpc.system", "grpc"), attribute.String("rpc.service", service), attribute.String("rpc.method", method))
	if h.server {
		md, _ := metadata.FromIncomingContext(ctx)
		ctx = h.prop.Extract(ctx, mdCarrier(md))
		ctx, _ = h.tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindServer), attrs)
		return ctx
	}
	ctx, _ = h.tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindClient), attrs)
	md, ok := metadata.FromOutgoingContext(ctx) // a copy, ours to change
	if !ok {
		md = metadata.MD{}
	}
	h.prop.Inject(ctx, mdCarrier(md))
	return metadata.NewOutgoingContext(ctx, md)
}

// HandleRPC ends the span with the call, with its gRPC code.
func (h *callSpans) HandleRPC(ctx context.Context, s stats.RPCStats) {
	end, ok := s.(*stats.End)
	if !ok {
		return
	}
	span := trace.SpanFromContext(ctx)
	st := status.Convert(end.Error)
	span.SetAttributes(attribute.Int("rpc.grpc.status_code", int(st.Code())))
	if end.Error != nil {
		span.SetStatus(otelcodes.Error, st.Message())
	}
	span.End(trace.WithTimestamp(end.EndTime))
}

// TagConn implements stats.Handler; connections have no spans.
func (h *callSpans) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context { return ctx }

// HandleConn implements stats.Handler.
func (h *callSpans) HandleConn(context.Context, stats.ConnStats) {}

// mdCarrier is gRPC metadata as a propagation carrier.
type mdCarrier metadata.MD

func (c mdCarrier) Get(key string) string {
	if v := metadata.MD(c).Get(key); len(v) > 0 {
		return v[0]
	}
	return ""
}

func (c mdCarrier) Set(key, value string) { metadata.MD(c).Set(key, value) }

func (c mdCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}

// otlpExportMethod is OTLP/gRPC's one call.
const otlpExportMethod = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"

// otlpExportTimeout bounds one export: a batch of spans to a collector on the node or nearby;
// a collector that does not take it within that loses the batch (spans are best effort).
const otlpExportTimeout = 10 * time.Second

// otlpClient sends the SDK's spans to the collector's TraceService over plain-text gRPC, as
// the kubelet's exporter does. The request, ExportTraceServiceRequest, is one repeated field
// (resource_spans = 1): it is written directly from the converted spans, which spares podgate
// the collector's generated service package and its grpc-gateway dependency.
type otlpClient struct {
	endpoint string
	conn     *grpc.ClientConn
}

var _ otlptrace.Client = (*otlpClient)(nil)

func newOTLPClient(endpoint string) *otlpClient { return &otlpClient{endpoint: endpoint} }

// Start implements otlptrace.Client: the connection is made lazily, on the first export.
func (c *otlpClient) Start(context.Context) error {
	conn, err := grpc.NewClient("passthrough:///"+c.endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.ForceCodecV2(rawProto{})))
	if err != nil {
		return fmt.Errorf("OTLP collector %s: %w", c.endpoint, err)
	}
	c.conn = conn
	return nil
}

// Stop implements otlptrace.Client.
func (c *otlpClient) Stop(context.Context) error {
	if c.conn == nil {
		return nil
	}
	return c.conn.Close()
}

// UploadTraces implements otlptrace.Client.
func (c *otlpClient) UploadTraces(ctx context.Context, spans []*tracepb.ResourceSpans) error {
	var req []byte
	for _, rs := range spans {
		b, err := proto.Marshal(rs)
		if err != nil {
			return fmt.Errorf("encode spans: %w", err)
		}
		req = protowire.AppendTag(req, 1, protowire.BytesType)
		req = protowire.AppendBytes(req, b)
	}
	ctx, cancel := context.WithTimeout(ctx, otlpExportTimeout)
	defer cancel()
	var resp []byte // ExportTraceServiceResponse: partial success, which podgate does not act on
	if err := c.conn.Invoke(ctx, otlpExportMethod, &req, &resp); err != nil {
		return fmt.Errorf("OTLP export to %s: %w", c.endpoint, err)
	}
	return nil
}

// rawProto is a gRPC codec of messages already encoded: *[]byte both ways. Its name is
// "proto", the content subtype a collector expects.
type rawProto struct{}

func (rawProto) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(*v.(*[]byte))}, nil
}

func (rawProto) Unmarshal(data mem.BufferSlice, v any) error {
	*v.(*[]byte) = data.Materialize()
	return nil
}

func (rawProto) Name() string { return "proto" }
