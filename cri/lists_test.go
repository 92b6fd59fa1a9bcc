package cri

import (
	"context"
	"errors"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"

	"github.com/podgate/podgate/test/crifixture"
	"github.com/podgate/podgate/test/testfs"
)

// containerPages is pods×perPod kubelet containers in pages of perPod, one pod's a page.
func containerPages(pods, perPod int) [][]*runtimeapi.Container {
	pages := make([][]*runtimeapi.Container, pods)
	for i := range pods {
		for j := range perPod {
			pages[i] = append(pages[i], crifixture.Container(i, j))
		}
	}
	return pages
}

// TestListStreamingMethodsAreKnown: the metrics count each of KEP-5825's list streams under
// its own method name, not under "other" (the names are written out here on purpose: podgate
// takes them from cri-api's service descriptors).
func TestListStreamingMethodsAreKnown(t *testing.T) {
	m := NewMetrics(prometheus.NewRegistry())
	for _, name := range []string{
		"/runtime.v1.RuntimeService/StreamPodSandboxes", "/runtime.v1.RuntimeService/StreamContainers",
		"/runtime.v1.RuntimeService/StreamContainerStats", "/runtime.v1.RuntimeService/StreamPodSandboxStats",
		"/runtime.v1.RuntimeService/StreamPodSandboxMetrics", "/runtime.v1.ImageService/StreamImages",
	} {
		if m.forMethod(name) == m.other {
			t.Errorf("%s is counted as other", name)
		}
	}
}

// TestStreamContainersPassesThrough: the kubelet's StreamContainers (CRIListStreaming) goes
// through podgate to the runtime and back page for page, each page reaching the client while
// the runtime still holds the next (nothing buffers the whole stream), all of them equal to
// what the runtime sent and in its order, and the call is counted under its method.
func TestStreamContainersPassesThrough(t *testing.T) {
	be := newTestRuntime(t, filepath.Join(testfs.ShortDir(t), "rt.sock"))
	be.containerPages = containerPages(16, 250)
	be.pageGate = make(chan struct{})
	reg := prometheus.NewRegistry()
	srv, conn := proxyFor(t, be.path, "", func(s *Server) { s.metrics = NewMetrics(reg) })
	filter := &runtimeapi.ContainerFilter{LabelSelector: map[string]string{"io.kubernetes.pod.namespace": "team-1"}}
	// A relay that held the first page back until the stream's end would end here.
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	stream, err := runtimeapi.NewRuntimeServiceClient(conn).StreamContainers(ctx, &runtimeapi.StreamContainersRequest{Filter: filter})
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range be.containerPages {
		page, err := stream.Recv()
		if err != nil {
			t.Fatalf("page %d: %v", i, err)
		}
		if i == 0 {
			close(be.pageGate) // the runtime sends the rest only now
		}
		if !proto.Equal(page, &runtimeapi.StreamContainersResponse{Containers: want}) {
			t.Fatalf("page %d differs from the runtime's", i)
		}
	}
	if _, err := stream.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("after the last page: %v, want the end of the stream", err)
	}
	be.mu.Lock()
	gotFilter := be.streamFilter
	be.mu.Unlock()
	if !proto.Equal(gotFilter, filter) {
		t.Errorf("the runtime got filter %v, want %v", gotFilter, filter)
	}
	if be.lists.Load() != 0 {
		t.Errorf("the runtime got %d List calls; podgate must not fall back for the kubelet", be.lists.Load())
	}
	assertCounted(t, srv, reg, "StreamContainers", "OK")
}

// TestStreamUnimplementedReachesTheClient: a runtime older than list streaming answers
// Unimplemented; the kubelet gets that answer (it falls back itself), not one podgate made.
func TestStreamUnimplementedReachesTheClient(t *testing.T) {
	be := newTestRuntime(t, filepath.Join(testfs.ShortDir(t), "rt.sock"))
	be.containers = []*runtimeapi.Container{crifixture.Container(0, 0)}
	reg := prometheus.NewRegistry()
	srv, conn := proxyFor(t, be.path, "", func(s *Server) { s.metrics = NewMetrics(reg) })
	stream, err := runtimeapi.NewRuntimeServiceClient(conn).StreamContainers(t.Context(), &runtimeapi.StreamContainersRequest{})
	if err == nil {
		_, err = stream.Recv()
	}
	if st := status.Convert(err); st.Code() != codes.Unimplemented || !strings.Contains(st.Message(), "StreamContainers") {
		t.Fatalf("StreamContainers: %v, want the runtime's Unimplemented", err)
	}
	if be.streams.Load() != 1 || be.lists.Load() != 0 {
		t.Errorf("the runtime got %d streams and %d lists, want the one stream", be.streams.Load(), be.lists.Load())
	}
	assertCounted(t, srv, reg, "StreamContainers", "Unimplemented")
}

// assertCounted checks that method was counted once with code and is no longer in flight, once
// the server has ended the call (its count follows the client's last frame).
func assertCounted(t *testing.T, srv *Server, reg *prometheus.Registry, method, code string) {
	t.Helper()
	if err := srv.Quiet(t.Context(), time.Millisecond, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if got := metricValue(mfs, "podgate_cri_requests_total", map[string]string{"method": method, "code": code}); got != 1 {
		t.Errorf("podgate_cri_requests_total{method=%s,code=%s} = %v, want 1", method, code, got)
	}
	if got := metricValue(mfs, "podgate_cri_requests_in_flight", map[string]string{"method": method}); got != 0 {
		t.Errorf("podgate_cri_requests_in_flight{method=%s} = %v after the call ended", method, got)
	}
}

// TestStreamingListsCollectPages: podgate's own lists take the runtime's streams whole, every
// page's items in order, with the caller's filter, and never ask the unary List.
func TestStreamingListsCollectPages(t *testing.T) {
	be := newTestRuntime(t, filepath.Join(testfs.ShortDir(t), "rt.sock"))
	be.containerPages = containerPages(5, 7)
	be.sandboxPages = [][]*runtimeapi.PodSandbox{{crifixture.Sandbox(0), crifixture.Sandbox(1)}, {crifixture.Sandbox(2)}}
	rt := StreamingLists(runtimeapi.NewRuntimeServiceClient(dial(t, be.path)))
	filter := &runtimeapi.ContainerFilter{PodSandboxId: "x"}
	for range 2 {
		resp, err := rt.ListContainers(t.Context(), &runtimeapi.ListContainersRequest{Filter: filter})
		if err != nil {
			t.Fatal(err)
		}
		var want []*runtimeapi.Container
		for _, p := range be.containerPages {
			want = append(want, p...)
		}
		if !proto.Equal(resp, &runtimeapi.ListContainersResponse{Containers: want}) {
			t.Errorf("ListContainers answered %d containers, not the %d of the stream in order", len(resp.GetContainers()), len(want))
		}
		sbs, err := rt.ListPodSandbox(t.Context(), &runtimeapi.ListPodSandboxRequest{})
		if err != nil {
			t.Fatal(err)
		}
		wantSbs := append(append([]*runtimeapi.PodSandbox(nil), be.sandboxPages[0]...), be.sandboxPages[1]...)
		if !proto.Equal(sbs, &runtimeapi.ListPodSandboxResponse{Items: wantSbs}) {
			t.Errorf("ListPodSandbox answered %v, want the stream's %v", sbs.GetItems(), wantSbs)
		}
	}
	be.mu.Lock()
	gotFilter := be.streamFilter
	be.mu.Unlock()
	if !proto.Equal(gotFilter, filter) {
		t.Errorf("the stream's filter %v, want the list's %v", gotFilter, filter)
	}
	if be.streams.Load() != 4 || be.lists.Load() != 0 {
		t.Errorf("the runtime got %d streams and %d lists, want 4 streams", be.streams.Load(), be.lists.Load())
	}
}

// TestStreamingListsFallBackOnce: against a runtime older than list streaming, podgate's own
// lists use the unary List, ask the stream once per list for the connection's life, and say
// so once at -v 2.
func TestStreamingListsFallBackOnce(t *testing.T) {
	be := newTestRuntime(t, filepath.Join(testfs.ShortDir(t), "rt.sock"))
	be.containers = []*runtimeapi.Container{crifixture.Container(0, 0), crifixture.Container(0, 1)}
	be.sandboxes = []*runtimeapi.PodSandbox{crifixture.Sandbox(0)}
	logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.Verbosity(2), ktesting.BufferLogs(true)))
	ctx := klog.NewContext(t.Context(), logger)
	rt := StreamingLists(runtimeapi.NewRuntimeServiceClient(dial(t, be.path)))
	for range 3 {
		resp, err := rt.ListContainers(ctx, &runtimeapi.ListContainersRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if !proto.Equal(resp, &runtimeapi.ListContainersResponse{Containers: be.containers}) {
			t.Errorf("ListContainers answered %v, want the runtime's %v", resp.GetContainers(), be.containers)
		}
		sbs, err := rt.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if !proto.Equal(sbs, &runtimeapi.ListPodSandboxResponse{Items: be.sandboxes}) {
			t.Errorf("ListPodSandbox answered %v, want the runtime's %v", sbs.GetItems(), be.sandboxes)
		}
	}
	if be.streams.Load() != 2 || be.lists.Load() != 6 {
		t.Errorf("the runtime got %d streams and %d lists, want 2 (one per list) and 6", be.streams.Load(), be.lists.Load())
	}
	logged := logger.GetSink().(ktesting.Underlier).GetBuffer().String()
	for _, method := range []string{"StreamContainers", "StreamPodSandboxes"} {
		if n := strings.Count(logged, `Runtime does not stream lists; podgate lists with unary calls method="`+method+`"`); n != 1 {
			t.Errorf("the fallback for %s logged %d times, want once:\n%s", method, n, logged)
		}
	}
}

// TestStreamingListsFailMidStream: a stream that fails after its first page fails the list
// with the runtime's status; the runtime serves streams, so podgate does not fall back.
func TestStreamingListsFailMidStream(t *testing.T) {
	be := newTestRuntime(t, filepath.Join(testfs.ShortDir(t), "rt.sock"))
	be.containerPages = containerPages(2, 3)
	be.streamErr = status.Error(codes.Unimplemented, "gave up midway")
	rt := StreamingLists(runtimeapi.NewRuntimeServiceClient(dial(t, be.path)))
	resp, err := rt.ListContainers(t.Context(), &runtimeapi.ListContainersRequest{})
	if st := status.Convert(err); st.Code() != codes.Unimplemented || st.Message() != "gave up midway" || resp != nil {
		t.Fatalf("ListContainers: %v, %v; want only the stream's status", resp, err)
	}
	if be.lists.Load() != 0 {
		t.Errorf("the runtime got %d List calls after a stream that had begun", be.lists.Load())
	}
}
