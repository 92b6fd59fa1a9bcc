// Package otlpfake is an OpenTelemetry collector for tests: a real gRPC server implementing
// OTLP's TraceService (go.opentelemetry.io/proto/otlp) on 127.0.0.1, which keeps every span it
// is sent, so that a test can check which spans a trace holds and how they nest.
package otlpfake

import (
	"context"
	"encoding/hex"
	"net"
	"slices"
	"sync"
	"testing"

	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"
)

// Span is one span received, flattened.
type Span struct {
	// Service is the resource's service.name: kubelet, podgate, containerd.
	Service                    string
	Name                       string
	TraceID, SpanID, ParentID  string
	Attributes                 map[string]string
	StartUnixNano, EndUnixNano uint64
	ErrorStatus                bool
}

// Collector receives spans over OTLP/gRPC.
type Collector struct {
	collectortrace.UnimplementedTraceServiceServer
	// Endpoint is host:port to give the exporters.
	Endpoint string

	mu    sync.Mutex
	spans []Span

	server *grpc.Server
	served chan error
}

// Start serves a collector on a free loopback port until the test ends.
func Start(t testing.TB) *Collector {
	t.Helper()
	c, err := Listen()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("OTLP collector: %v", err)
		}
	})
	return c
}

// Listen serves a collector on a free loopback port until Close, for programs (the demo).
func Listen() (*Collector, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	c := &Collector{Endpoint: l.Addr().String(), server: grpc.NewServer(), served: make(chan error, 1)}
	collectortrace.RegisterTraceServiceServer(c.server, c)
	go func() { c.served <- c.server.Serve(l) }()
	return c, nil
}

// Close stops serving and returns what serving ended with.
func (c *Collector) Close() error {
	c.server.Stop()
	return <-c.served
}

// Export implements the TraceService.
func (c *Collector) Export(_ context.Context, req *collectortrace.ExportTraceServiceRequest) (*collectortrace.ExportTraceServiceResponse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, rs := range req.GetResourceSpans() {
		var service string
		for _, kv := range rs.GetResource().GetAttributes() {
			if kv.GetKey() == "service.name" {
				service = kv.GetValue().GetStringValue()
			}
		}
		for _, ss := range rs.GetScopeSpans() {
			for _, sp := range ss.GetSpans() {
				attrs := map[string]string{}
				for _, kv := range sp.GetAttributes() {
					v := kv.GetValue()
					switch {
					case v.GetStringValue() != "":
						attrs[kv.GetKey()] = v.GetStringValue()
					default:
						attrs[kv.GetKey()] = v.String()
					}
				}
				c.spans = append(c.spans, Span{
					Service: service, Name: sp.GetName(),
					TraceID: hex.EncodeToString(sp.GetTraceId()), SpanID: hex.EncodeToString(sp.GetSpanId()),
					ParentID: hex.EncodeToString(sp.GetParentSpanId()), Attributes: attrs,
					StartUnixNano: sp.GetStartTimeUnixNano(), EndUnixNano: sp.GetEndTimeUnixNano(),
					ErrorStatus: sp.GetStatus().GetCode() == 2,
				})
			}
		}
	}
	return &collectortrace.ExportTraceServiceResponse{}, nil
}

// Spans returns every span received so far.
func (c *Collector) Spans() []Span {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.spans)
}

// Find returns the spans of service named name ("" matches any service).
func Find(spans []Span, service, name string) []Span {
	var out []Span
	for _, s := range spans {
		if (service == "" || s.Service == service) && s.Name == name {
			out = append(out, s)
		}
	}
	return out
}

// ByID returns the span with this ID.
func ByID(spans []Span, id string) (Span, bool) {
	for _, s := range spans {
		if s.SpanID == id {
			return s, true
		}
	}
	return Span{}, false
}
