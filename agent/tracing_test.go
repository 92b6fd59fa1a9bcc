package agent

import (
	"context"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/cri-client/pkg/fake"

	"github.com/podgate/podgate/agent/config"
	"github.com/podgate/podgate/test/otlpfake"
	"github.com/podgate/podgate/test/testfs"
)

// The kubelet's span, as its CRI client sends it (W3C trace context).
const (
	kubeletTrace = "4bf92f3577b34da6a3ce929d0e0e4736"
	kubeletSpan  = "00f067aa0ba902b7"
)

// tracedRuntime is cri-client's fake runtime on a real socket, recording the traceparent of
// each call it gets.
type tracedRuntime struct {
	mu      sync.Mutex
	parents map[string][]string // method -> traceparent of each call
}

func serveTracedRuntime(t *testing.T, dir string) (*tracedRuntime, string) {
	t.Helper()
	tr := &tracedRuntime{parents: map[string][]string{}}
	path := filepath.Join(dir, "rt.sock")
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer(grpc.UnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		tr.mu.Lock()
		tr.parents[info.FullMethod] = append(tr.parents[info.FullMethod], strings.Join(md.Get("traceparent"), ","))
		tr.mu.Unlock()
		return h(ctx, req)
	}))
	rt := fake.NewFakeRemoteRuntime()
	runtimeapi.RegisterRuntimeServiceServer(s, rt)
	runtimeapi.RegisterImageServiceServer(s, rt)
	served := make(chan struct{})
	go func() { defer close(served); _ = s.Serve(l) }()
	t.Cleanup(func() { s.Stop(); <-served })
	return tr, path
}

// parent returns the traceparents the runtime got with the method's calls in the kubelet's
// trace: podgate's own calls (its start-up Version) carry none or a trace of podgate's.
func (tr *tracedRuntime) parent(method string) []string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	var out []string
	for _, p := range tr.parents["/runtime.v1.RuntimeService/"+method] {
		if strings.Contains(p, kubeletTrace) {
			out = append(out, p)
		}
	}
	return out
}

// kubeletCalls makes, as the kubelet does with its tracing on, a RunPodSandbox and a Version
// call carrying the kubelet's span, sampled or not.
func kubeletCalls(t *testing.T, socket string, sampled bool) {
	t.Helper()
	flags := "00"
	if sampled {
		flags = "01"
	}
	ctx := metadata.AppendToOutgoingContext(t.Context(), "traceparent", "00-"+kubeletTrace+"-"+kubeletSpan+"-"+flags)
	c := criClient(t, socket)
	if _, err := c.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: podConfig("traced")}, grpc.WaitForReady(true)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Version(ctx, &runtimeapi.VersionRequest{}); err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := runtimeapi.NewImageServiceClient(conn).PullImage(ctx, &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: "example.com/app:1"}}); err != nil {
		t.Fatal(err)
	}
}

// TestTracing: with tracing on, podgate continues the kubelet's trace: its server span of each
// CRI call is the kubelet's span's child, each pipeline stage a child of it, its call to the
// runtime a child of the forward stage (or of the server span for a call passed through; of
// the pull's span for PullImage, beside the wait for a slot), and the runtime gets podgate's
// span as parent. A call the kubelet did not sample makes no span.
// With tracing off, the kubelet's trace context reaches the runtime untouched and nothing is
// exported.
func TestTracing(t *testing.T) {
	for _, tt := range []struct {
		name        string
		on, sampled bool
	}{
		{"on, sampled by the kubelet", true, true},
		{"on, not sampled by the kubelet", true, false},
		{"off", false, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			collector := otlpfake.Start(t)
			dir := testfs.ShortDir(t)
			rt, rtSock := serveTracedRuntime(t, dir)
			cfg := testConfig(dir, rtSock)
			if tt.on {
				cfg.Tracing = &config.Tracing{Endpoint: collector.Endpoint}
				cfg.SetDefaults()
			}
			stop := runAgent(t, cfg)
			kubeletCalls(t, cfg.CRISocket, tt.sampled)
			if err := stop(); err != nil { // the shutdown exports the spans left
				t.Fatal(err)
			}
			spans := collector.Spans()
			switch {
			case !tt.on:
				if len(spans) != 0 {
					t.Errorf("%d spans exported with tracing off", len(spans))
				}
				for _, m := range []string{"RunPodSandbox", "Version"} {
					want := "00-" + kubeletTrace + "-" + kubeletSpan + "-01"
					if got := rt.parent(m); len(got) != 1 || got[0] != want {
						t.Errorf("runtime's %s got traceparent %q, want the kubelet's %q", m, got, want)
					}
				}
				return
			case !tt.sampled:
				if len(spans) != 0 {
					t.Errorf("%d spans exported for calls the kubelet did not sample: %+v", len(spans), spans)
				}
				return
			}
			checkSandboxTrace(t, spans, rt)
		})
	}
}

func checkSandboxTrace(t *testing.T, spans []otlpfake.Span, rt *tracedRuntime) {
	t.Helper()
	one := func(name string, parent string) otlpfake.Span {
		t.Helper()
		for _, s := range otlpfake.Find(spans, "podgate", name) {
			if s.ParentID == parent {
				if s.TraceID != kubeletTrace {
					t.Errorf("span %s in trace %s, want the kubelet's %s", name, s.TraceID, kubeletTrace)
				}
				return s
			}
		}
		t.Fatalf("no podgate span %s with parent %s; spans: %+v", name, parent, spans)
		return otlpfake.Span{}
	}
	server := one("runtime.v1.RuntimeService/RunPodSandbox", kubeletSpan)
	var forward otlpfake.Span
	// DRA is off here (no Kubernetes API): its stages are not in the pipeline
	// (TestDRAPrepareSpanPerDriver traces them).
	for _, stage := range []string{"sysctl-check", "forward", "status", "sysctl-verify", "pod-resources", "record"} {
		s := one("RunPodSandbox/"+stage, server.SpanID)
		if s.Attributes["k8s.pod.name"] != "traced" {
			t.Errorf("stage span %s: attributes %v", s.Name, s.Attributes)
		}
		if stage == "forward" {
			forward = s
		}
	}
	client := one("runtime.v1.RuntimeService/RunPodSandbox", forward.SpanID)
	if got := rt.parent("RunPodSandbox"); len(got) != 1 || !strings.Contains(got[0], kubeletTrace+"-"+client.SpanID) {
		t.Errorf("runtime's RunPodSandbox got traceparent %q, want podgate's client span %s", got, client.SpanID)
	}
	pull := one("runtime.v1.ImageService/PullImage", kubeletSpan)
	one("image pull: wait for a slot", pull.SpanID)
	backendPull := one("image pull", pull.SpanID)
	one("runtime.v1.ImageService/PullImage", backendPull.SpanID)
	version := one("runtime.v1.RuntimeService/Version", kubeletSpan)
	vclient := one("runtime.v1.RuntimeService/Version", version.SpanID)
	if got := rt.parent("Version"); len(got) != 1 || !strings.Contains(got[0], kubeletTrace+"-"+vclient.SpanID) {
		t.Errorf("runtime's Version got traceparent %q, want podgate's client span %s", got, vclient.SpanID)
	}
}
