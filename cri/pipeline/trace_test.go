package pipeline_test

import (
	"context"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podgate/podgate/cri/pipeline"
	"github.com/podgate/podgate/cri/registry"
	"github.com/podgate/podgate/test/crifake"
)

// TestStageSpans: each stage runs in a span of its own, "RunPodSandbox/<stage>", a child of
// the CRI call's span (from its provider) naming the pod; the stage's own work is its child;
// a failed stage's span says so, with the error.
func TestStageSpans(t *testing.T) {
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	ctx, call := tp.Tracer("test").Start(t.Context(), "runtime.v1.RuntimeService/RunPodSandbox")
	inStage := make(chan trace.SpanContext, 1)
	ok := pipeline.Stage{Name: "ok", Run: func(ctx context.Context, _ *pipeline.Sandbox) error {
		inStage <- trace.SpanContextFromContext(ctx)
		return nil
	}}
	p := pipeline.NewRunner([]pipeline.Stage{ok, failing(pipeline.Stage{Name: "fails"}, errInjected)},
		registry.NewRegistry(nil, registry.CheckpointData{}), prometheus.NewRegistry())
	if _, err := p.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: crifake.PodConfig("p")}, nil); err == nil {
		t.Fatal("RunPodSandbox succeeded past a failing stage")
	}
	call.End()
	byName := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range spans.Ended() {
		byName[s.Name()] = s
	}
	for _, name := range []string{"RunPodSandbox/ok", "RunPodSandbox/fails"} {
		s, found := byName[name]
		if !found {
			t.Fatalf("no span %s; spans %v", name, byName)
		}
		if s.Parent().SpanID() != call.SpanContext().SpanID() {
			t.Errorf("span %s: parent %s, want the call's %s", name, s.Parent().SpanID(), call.SpanContext().SpanID())
		}
		want := []attribute.KeyValue{attribute.String("k8s.pod.name", "p"), attribute.String("k8s.namespace.name", "ns"), attribute.String("k8s.pod.uid", "uid-p")}
		for _, kv := range want {
			if !hasAttribute(s, kv) {
				t.Errorf("span %s: attributes %v, want %s=%s", name, s.Attributes(), kv.Key, kv.Value.String())
			}
		}
	}
	if got := <-inStage; got.SpanID() != byName["RunPodSandbox/ok"].SpanContext().SpanID() {
		t.Errorf("the stage ran in span %s, want its own", got.SpanID())
	}
	if s := byName["RunPodSandbox/ok"].Status(); s.Code != codes.Unset {
		t.Errorf("successful stage's span status %+v", s)
	}
	failed := byName["RunPodSandbox/fails"]
	if s := failed.Status(); s.Code != codes.Error || s.Description != errInjected.Error() || len(failed.Events()) == 0 {
		t.Errorf("failed stage's span: status %+v, events %v; want the error", s, failed.Events())
	}
}

func hasAttribute(s sdktrace.ReadOnlySpan, kv attribute.KeyValue) bool {
	for _, a := range s.Attributes() {
		if a == kv {
			return true
		}
	}
	return false
}
