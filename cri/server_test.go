package cri

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podgate/podgate/test/testfs"
)

type runReqFwd = Forward[*runtimeapi.RunPodSandboxRequest, *runtimeapi.RunPodSandboxResponse]

// withUnknownField appends field 999 (a varint) to m's encoding: a field newer than cri-api.
func withUnknownField(t *testing.T, m proto.Message) []byte {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	b = protowire.AppendTag(b, 999, protowire.VarintType)
	return protowire.AppendVarint(b, 42)
}

func unknownField() []byte {
	b := protowire.AppendTag(nil, 999, protowire.VarintType)
	return protowire.AppendVarint(b, 42)
}

func TestUnaryPassthroughForwardsMetadataDeadlineAndHeaders(t *testing.T) {
	dir := testfs.ShortDir(t)
	be := newTestRuntime(t, filepath.Join(dir, "rt.sock"))
	_, conn := proxyFor(t, be.path, "", nil)
	client := runtimeapi.NewRuntimeServiceClient(conn)

	ctx, cancel := context.WithTimeout(context.Background(), 7*time.Second)
	defer cancel()
	want, _ := ctx.Deadline()
	ctx = metadata.AppendToOutgoingContext(ctx, "x-request-id", "abc-123")
	var hdr, trl metadata.MD
	resp, err := client.Version(ctx, &runtimeapi.VersionRequest{Version: "v1"}, grpc.Header(&hdr), grpc.Trailer(&trl))
	if err != nil {
		t.Fatal(err)
	}
	if resp.RuntimeName != "testRuntime" {
		t.Errorf("RuntimeName = %q", resp.RuntimeName)
	}
	be.mu.Lock()
	defer be.mu.Unlock()
	if got := be.lastMD.Get("x-request-id"); len(got) != 1 || got[0] != "abc-123" {
		t.Errorf("backend got x-request-id %v, want [abc-123]", got)
	}
	if be.lastDL.IsZero() {
		t.Fatal("backend saw no deadline")
	}
	// grpc sends the remaining time, rounded to its wire units: the deadlines agree closely.
	if d := want.Sub(be.lastDL).Abs(); d > time.Second {
		t.Errorf("backend deadline %v off the client's %v by %v", be.lastDL, want, d)
	}
	if got := hdr.Get("x-backend-header"); len(got) != 1 || got[0] != "h1" {
		t.Errorf("client header x-backend-header = %v", got)
	}
	if got := trl.Get("x-backend-trailer"); len(got) != 1 || got[0] != "t1" {
		t.Errorf("client trailer x-backend-trailer = %v", got)
	}
}

func TestCancellationReachesBackend(t *testing.T) {
	be := newTestRuntime(t, filepath.Join(testfs.ShortDir(t), "rt.sock"))
	_, conn := proxyFor(t, be.path, "", nil)
	client := runtimeapi.NewRuntimeServiceClient(conn)

	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := client.ExecSync(ctx, &runtimeapi.ExecSyncRequest{ContainerId: "c1", Cmd: []string{"sleep", "inf"}})
		errc <- err
	}()
	<-be.execStarted
	cancel()
	<-be.execCanceled // the backend's handler saw its context end: the cancel crossed the proxy
	if err := <-errc; status.Code(err) != codes.Canceled {
		t.Fatalf("client got %v, want Canceled", err)
	}
}

func TestUnknownFieldsAndMethodsPassThrough(t *testing.T) {
	be := newTestRuntime(t, filepath.Join(testfs.ShortDir(t), "rt.sock"))
	_, conn := proxyFor(t, be.path, "", nil)
	ctx := context.Background()

	t.Run("unknown field of a known method", func(t *testing.T) {
		req := withUnknownField(t, &runtimeapi.VersionRequest{Version: "v1"})
		var resp frame
		if err := conn.Invoke(ctx, "/runtime.v1.RuntimeService/Version", frameOf(req), &resp, grpc.ForceCodecV2(newRawCodec())); err != nil {
			t.Fatal(err)
		}
		be.mu.Lock()
		defer be.mu.Unlock()
		if !bytes.Equal(be.lastUnknown, unknownField()) {
			t.Errorf("backend saw unknown fields %x, want %x", be.lastUnknown, unknownField())
		}
	})
	t.Run("method newer than cri-api", func(t *testing.T) {
		body := []byte("\x0a\x05hello\xf8\x3e\x01")
		var resp frame
		const m = "/runtime.v1.RuntimeService/CheckpointEverything"
		if err := conn.Invoke(ctx, m, frameOf(body), &resp, grpc.ForceCodecV2(newRawCodec())); err != nil {
			t.Fatal(err)
		}
		be.mu.Lock()
		defer be.mu.Unlock()
		if be.rawMethod != m || !bytes.Equal(be.rawBody, body) {
			t.Errorf("backend got %s %x, want %s %x", be.rawMethod, be.rawBody, m, body)
		}
		if !bytes.Equal(resp.bytes(), body) {
			t.Errorf("client got %x back, want %x", resp.bytes(), body)
		}
	})
}

func TestOtherServicesAreNotForwarded(t *testing.T) {
	be := newTestRuntime(t, filepath.Join(testfs.ShortDir(t), "rt.sock"))
	_, conn := proxyFor(t, be.path, "", nil)
	var resp frame
	err := conn.Invoke(context.Background(), "/containerd.services.namespaces.v1.Namespaces/List", frameOf(nil), &resp, grpc.ForceCodecV2(newRawCodec()))
	if status.Code(err) != codes.Unimplemented {
		t.Fatalf("got %v, want Unimplemented", err)
	}
	// A streaming call (grpcurl's reflection) is refused at once, not when the client
	// half-closes: grpcurl waits for the answer with its stream open.
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	st, err := conn.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}, "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo", grpc.ForceCodecV2(newRawCodec()))
	if err != nil {
		t.Fatal(err)
	}
	if err := st.SendMsg(frameOf(nil)); err != nil && !errors.Is(err, io.EOF) {
		t.Fatal(err)
	}
	if err := st.RecvMsg(&resp); status.Code(err) != codes.Unimplemented || !strings.Contains(err.Error(), "podgate serves only") {
		t.Errorf("a reflection stream got %v, want podgate's Unimplemented", err)
	}
	if n := be.calls.Load(); n != 0 {
		t.Errorf("backend got %d calls, want 0", n)
	}
}

func TestStatusFromBackendIsPreserved(t *testing.T) {
	be := newTestRuntime(t, filepath.Join(testfs.ShortDir(t), "rt.sock"))
	st, err := status.New(codes.NotFound, "container \"c1\" not found").WithDetails(durationpb.New(3 * time.Second))
	if err != nil {
		t.Fatal(err)
	}
	be.versionErr = st.Err()
	_, conn := proxyFor(t, be.path, "", nil)
	_, err = runtimeapi.NewRuntimeServiceClient(conn).Version(context.Background(), &runtimeapi.VersionRequest{})
	got := status.Convert(err)
	if got.Code() != codes.NotFound || got.Message() != st.Message() {
		t.Fatalf("got %v, want %v", got, st)
	}
	if len(got.Details()) != 1 || !proto.Equal(got.Details()[0].(proto.Message), durationpb.New(3*time.Second)) {
		t.Errorf("details %v lost", got.Details())
	}
}

func TestServerStreamPassthrough(t *testing.T) {
	be := newTestRuntime(t, filepath.Join(testfs.ShortDir(t), "rt.sock"))
	for i := range 3 {
		be.events = append(be.events, &runtimeapi.ContainerEventResponse{ContainerId: fmt.Sprint("c", i), ContainerEventType: runtimeapi.ContainerEventType_CONTAINER_STARTED_EVENT})
	}
	_, conn := proxyFor(t, be.path, "", nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream, err := runtimeapi.NewRuntimeServiceClient(conn).GetContainerEvents(ctx, &runtimeapi.GetEventsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	<-be.eventsOpen
	for i := range 3 {
		ev, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if !proto.Equal(ev, be.events[i]) {
			t.Errorf("event %d = %v, want %v", i, ev, be.events[i])
		}
	}
	cancel()
	<-be.eventsEnded // the backend's stream ended with the client's
}

func TestShutdownEndsStreamsAndLetsUnaryCallsFinish(t *testing.T) {
	be := newTestRuntime(t, filepath.Join(testfs.ShortDir(t), "rt.sock"))
	srv, conn := proxyFor(t, be.path, "", nil)
	client := runtimeapi.NewRuntimeServiceClient(conn)

	stream, err := client.GetContainerEvents(context.Background(), &runtimeapi.GetEventsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	<-be.eventsOpen // the stream is open at the backend
	execCtx, execCancel := context.WithCancel(context.Background())
	defer execCancel()
	execErr := make(chan error, 1)
	go func() {
		_, err := client.ExecSync(execCtx, &runtimeapi.ExecSyncRequest{ContainerId: "c1"})
		execErr <- err
	}()
	<-be.execStarted

	grace, graceCancel := context.WithCancel(context.Background())
	shutdownDone := make(chan struct{})
	go func() { srv.Shutdown(grace); close(shutdownDone) }()

	if _, err := stream.Recv(); status.Code(err) != codes.Unavailable {
		t.Errorf("stream ended with %v, want Unavailable", err)
	}
	select {
	case <-shutdownDone:
		t.Fatal("Shutdown returned while a unary call was in flight and the grace period open")
	default:
	}
	graceCancel() // grace period over: the remaining call is cut
	<-shutdownDone
	if err := <-execErr; status.Code(err) != codes.Unavailable && status.Code(err) != codes.Canceled {
		t.Errorf("cut call ended with %v", err)
	}
}

func TestBackendDownFailsFastAndRecovers(t *testing.T) {
	path := filepath.Join(testfs.ShortDir(t), "rt.sock")
	_, conn := proxyFor(t, path, "", nil) // nothing listens on path yet
	client := runtimeapi.NewRuntimeServiceClient(conn)

	// A generous deadline: the call must come back Unavailable, not wait for it to pass.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := client.Version(ctx, &runtimeapi.VersionRequest{})
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("got %v, want Unavailable", err)
	}
	if msg := status.Convert(err).Message(); !strings.Contains(msg, "runtime backend unix://"+path) {
		t.Errorf("message %q does not name the backend", msg)
	}

	be := newTestRuntime(t, path)
	waitVersionOK(t, client)

	be.srv.Stop() // the runtime goes away...
	os.Remove(path)
	_, err = client.Version(ctx, &runtimeapi.VersionRequest{})
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("with the runtime gone: got %v, want Unavailable", err)
	}
	be.start(t) // ...and comes back
	waitVersionOK(t, client)
}

// waitVersionOK retries Version until it succeeds: the proxy reconnects with backoff (at most
// 2s apart), so success must come within a few attempts.
func waitVersionOK(t *testing.T, client runtimeapi.RuntimeServiceClient) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := client.Version(ctx, &runtimeapi.VersionRequest{}, grpc.WaitForReady(true))
		cancel()
		if err == nil {
			return
		}
		if status.Code(err) != codes.Unavailable || time.Now().After(deadline) {
			t.Fatalf("Version after the runtime came back: %v", err)
		}
	}
}

func TestSeparateImageEndpoint(t *testing.T) {
	dir := testfs.ShortDir(t)
	rt := newTestRuntime(t, filepath.Join(dir, "rt.sock"))
	img := newTestRuntime(t, filepath.Join(dir, "img.sock"))
	_, conn := proxyFor(t, rt.path, img.path, nil)
	ctx := context.Background()
	resp, err := runtimeapi.NewImageServiceClient(conn).ListImages(ctx, &runtimeapi.ListImagesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Images) != 1 || resp.Images[0].Id != "sha256:img.sock" {
		t.Errorf("ListImages answered by %v, want the image backend", resp.Images)
	}
	if _, err := runtimeapi.NewRuntimeServiceClient(conn).Version(ctx, &runtimeapi.VersionRequest{}); err != nil {
		t.Fatal(err)
	}
	if rt.calls.Load() != 1 || img.calls.Load() != 1 {
		t.Errorf("runtime got %d calls, image %d; want 1 each", rt.calls.Load(), img.calls.Load())
	}
}

// TestLargeAnswersPassAsTheRuntimeSendsThem: podgate carries an answer of any size the runtime
// sends, and a client's own message limit applies to it exactly as without podgate: a client
// with the kubelet's 16 MiB limit refuses a 17 MiB answer itself, through podgate and direct
// alike, and a client that allows more gets it whole.
func TestLargeAnswersPassAsTheRuntimeSendsThem(t *testing.T) {
	be := newTestRuntime(t, filepath.Join(testfs.ShortDir(t), "rt.sock"))
	_, conn := proxyFor(t, be.path, "", nil)
	big := strings.Repeat("x", 1<<20)
	for i := range 17 {
		be.containers = append(be.containers, &runtimeapi.Container{Id: fmt.Sprint(i), Labels: map[string]string{"big": big}})
	}
	kubeletLimit := grpc.MaxCallRecvMsgSize(16 << 20)
	for path, c := range map[string]*grpc.ClientConn{"podgate": conn, "direct": dial(t, be.path)} {
		client := runtimeapi.NewRuntimeServiceClient(c)
		_, err := client.ListContainers(t.Context(), &runtimeapi.ListContainersRequest{}, kubeletLimit)
		if status.Code(err) != codes.ResourceExhausted {
			t.Errorf("%s: 17 MiB answer to a client with the kubelet's limit: got %v, want its own ResourceExhausted", path, err)
		}
		resp, err := client.ListContainers(t.Context(), &runtimeapi.ListContainersRequest{})
		if err != nil || len(resp.Containers) != 17 || resp.Containers[16].Labels["big"] != big {
			t.Errorf("%s: 17 MiB answer to a client that allows 64 MiB: %d containers, %v", path, len(resp.GetContainers()), err)
		}
	}
}

func TestInterceptors(t *testing.T) {
	sandbox := &runtimeapi.RunPodSandboxRequest{Config: &runtimeapi.PodSandboxConfig{
		Metadata: &runtimeapi.PodSandboxMetadata{Name: "web", Namespace: "default", Uid: "u1"},
	}}

	t.Run("unchanged request goes byte for byte", func(t *testing.T) {
		be := newTestRuntime(t, filepath.Join(testfs.ShortDir(t), "rt.sock"))
		var sawName string
		_, conn := proxyFor(t, be.path, "", func(s *Server) {
			Intercept(s, RunPodSandbox, func(ctx context.Context, req *runtimeapi.RunPodSandboxRequest, next runReqFwd) (*runtimeapi.RunPodSandboxResponse, error) {
				sawName = req.GetConfig().GetMetadata().GetName()
				return next(ctx, req)
			})
		})
		var resp frame
		if err := conn.Invoke(context.Background(), RunPodSandbox.FullName(), frameOf(withUnknownField(t, sandbox)), &resp, grpc.ForceCodecV2(newRawCodec())); err != nil {
			t.Fatal(err)
		}
		if sawName != "web" {
			t.Errorf("interceptor saw name %q", sawName)
		}
		be.mu.Lock()
		defer be.mu.Unlock()
		if !bytes.Equal(be.lastUnknown, unknownField()) {
			t.Errorf("unknown field lost: %x", be.lastUnknown)
		}
	})

	t.Run("changed request is re-encoded with its unknown fields", func(t *testing.T) {
		be := newTestRuntime(t, filepath.Join(testfs.ShortDir(t), "rt.sock"))
		_, conn := proxyFor(t, be.path, "", func(s *Server) {
			Intercept(s, RunPodSandbox, func(ctx context.Context, req *runtimeapi.RunPodSandboxRequest, next runReqFwd) (*runtimeapi.RunPodSandboxResponse, error) {
				req.Config.Labels = map[string]string{"podgate": "yes"}
				return next(ctx, req)
			})
		})
		var resp frame
		if err := conn.Invoke(context.Background(), RunPodSandbox.FullName(), frameOf(withUnknownField(t, sandbox)), &resp, grpc.ForceCodecV2(newRawCodec())); err != nil {
			t.Fatal(err)
		}
		be.mu.Lock()
		defer be.mu.Unlock()
		if be.lastRunReq.GetConfig().GetLabels()["podgate"] != "yes" {
			t.Errorf("backend did not get the change: %v", be.lastRunReq.GetConfig().GetLabels())
		}
		if !bytes.Equal(be.lastUnknown, unknownField()) {
			t.Errorf("unknown field lost on re-encode: %x", be.lastUnknown)
		}
	})

	t.Run("observers' changes are not sent", func(t *testing.T) {
		be := newTestRuntime(t, filepath.Join(testfs.ShortDir(t), "rt.sock"))
		var sawID string
		_, conn := proxyFor(t, be.path, "", func(s *Server) {
			Observe(s, RunPodSandbox, func(ctx context.Context, req *runtimeapi.RunPodSandboxRequest, next runReqFwd) (*runtimeapi.RunPodSandboxResponse, error) {
				req.Config.Labels = map[string]string{"podgate": "yes"} // a broken observer
				resp, err := next(ctx, req)
				sawID = resp.GetPodSandboxId()
				resp.PodSandboxId = "changed"
				return resp, err
			})
		})
		resp, err := runtimeapi.NewRuntimeServiceClient(conn).RunPodSandbox(context.Background(), sandbox)
		if err != nil {
			t.Fatal(err)
		}
		if sawID != "sandbox-web" || resp.GetPodSandboxId() != "sandbox-web" {
			t.Errorf("observer saw %q, client got %q; want the backend's sandbox-web for both", sawID, resp.GetPodSandboxId())
		}
		be.mu.Lock()
		defer be.mu.Unlock()
		if l := be.lastRunReq.GetConfig().GetLabels(); len(l) != 0 {
			t.Errorf("backend got the observer's change: labels %v", l)
		}
	})

	t.Run("beside an interceptor, changes are looked for", func(t *testing.T) {
		be := newTestRuntime(t, filepath.Join(testfs.ShortDir(t), "rt.sock"))
		_, conn := proxyFor(t, be.path, "", func(s *Server) {
			Observe(s, RunPodSandbox, func(ctx context.Context, req *runtimeapi.RunPodSandboxRequest, next runReqFwd) (*runtimeapi.RunPodSandboxResponse, error) {
				return next(ctx, req)
			})
			Intercept(s, RunPodSandbox, func(ctx context.Context, req *runtimeapi.RunPodSandboxRequest, next runReqFwd) (*runtimeapi.RunPodSandboxResponse, error) {
				req.Config.Labels = map[string]string{"podgate": "yes"}
				resp, err := next(ctx, req)
				if err == nil {
					resp.PodSandboxId += "-seen"
				}
				return resp, err
			})
		})
		resp, err := runtimeapi.NewRuntimeServiceClient(conn).RunPodSandbox(context.Background(), sandbox)
		if err != nil {
			t.Fatal(err)
		}
		if resp.GetPodSandboxId() != "sandbox-web-seen" {
			t.Errorf("client got %q, want the interceptor's sandbox-web-seen", resp.GetPodSandboxId())
		}
		be.mu.Lock()
		defer be.mu.Unlock()
		if be.lastRunReq.GetConfig().GetLabels()["podgate"] != "yes" {
			t.Errorf("backend did not get the interceptor's change: %v", be.lastRunReq.GetConfig().GetLabels())
		}
	})

	t.Run("refusal reaches no backend", func(t *testing.T) {
		be := newTestRuntime(t, filepath.Join(testfs.ShortDir(t), "rt.sock"))
		_, conn := proxyFor(t, be.path, "", func(s *Server) {
			Intercept(s, RunPodSandbox, func(ctx context.Context, req *runtimeapi.RunPodSandboxRequest, next runReqFwd) (*runtimeapi.RunPodSandboxResponse, error) {
				return nil, status.Error(codes.InvalidArgument, "sysctl \"kernel.core_pattern\": not namespaced")
			})
		})
		_, err := runtimeapi.NewRuntimeServiceClient(conn).RunPodSandbox(context.Background(), sandbox)
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "kernel.core_pattern") {
			t.Fatalf("got %v, want the interceptor's InvalidArgument", err)
		}
		if n := be.calls.Load(); n != 0 {
			t.Errorf("backend got %d calls", n)
		}
	})

	t.Run("interceptors nest in order and see the response", func(t *testing.T) {
		be := newTestRuntime(t, filepath.Join(testfs.ShortDir(t), "rt.sock"))
		var order []string
		mk := func(name string) Interceptor[*runtimeapi.RunPodSandboxRequest, *runtimeapi.RunPodSandboxResponse] {
			return func(ctx context.Context, req *runtimeapi.RunPodSandboxRequest, next runReqFwd) (*runtimeapi.RunPodSandboxResponse, error) {
				order = append(order, name+" before")
				resp, err := next(ctx, req)
				order = append(order, name+" after "+resp.GetPodSandboxId())
				return resp, err
			}
		}
		_, conn := proxyFor(t, be.path, "", func(s *Server) {
			Intercept(s, RunPodSandbox, mk("outer"))
			Intercept(s, RunPodSandbox, mk("inner"))
		})
		resp, err := runtimeapi.NewRuntimeServiceClient(conn).RunPodSandbox(context.Background(), sandbox)
		if err != nil {
			t.Fatal(err)
		}
		want := "outer before,inner before,inner after sandbox-web,outer after sandbox-web"
		if got := strings.Join(order, ","); got != want {
			t.Errorf("order %s, want %s", got, want)
		}
		if resp.PodSandboxId != "sandbox-web" {
			t.Errorf("response %v", resp)
		}
	})

	t.Run("plain error becomes Internal, wrapped status keeps its code", func(t *testing.T) {
		be := newTestRuntime(t, filepath.Join(testfs.ShortDir(t), "rt.sock"))
		errs := []error{errors.New("disk full"), fmt.Errorf("prepare claim gpu: %w", status.Error(codes.FailedPrecondition, "driver not registered"))}
		i := 0
		_, conn := proxyFor(t, be.path, "", func(s *Server) {
			Intercept(s, RunPodSandbox, func(ctx context.Context, req *runtimeapi.RunPodSandboxRequest, next runReqFwd) (*runtimeapi.RunPodSandboxResponse, error) {
				err := errs[i]
				i++
				return nil, err
			})
		})
		client := runtimeapi.NewRuntimeServiceClient(conn)
		if _, err := client.RunPodSandbox(context.Background(), sandbox); status.Code(err) != codes.Internal {
			t.Errorf("plain error: got %v, want Internal", err)
		}
		_, err := client.RunPodSandbox(context.Background(), sandbox)
		if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "prepare claim gpu") {
			t.Errorf("wrapped status: got %v", err)
		}
	})
}

// classError is shaped like the errors of podgate's policy packages (sysctl.RejectedError,
// imagepull's): a message of its own that unwraps to its class, an errdefs error or a context
// error.
type classError struct {
	class error
	msg   string
}

func (e *classError) Error() string { return e.msg }
func (e *classError) Unwrap() error { return e.class }

// classifiedErrors are errors of each class podgate's packages return, with the status the
// kubelet must get for each.
var classifiedErrors = []struct {
	name     string
	err      error
	code     codes.Code
	msg      string
	canceled bool // the call's own context is cancelled too
}{
	{"sysctl refusal", &classError{errdefs.ErrInvalidArgument, `sysctl "kernel.core_pattern": not namespaced: it would change the whole node`},
		codes.InvalidArgument, `sysctl "kernel.core_pattern": not namespaced: it would change the whole node`, false},
	{"refusal, wrapped", fmt.Errorf("pod default/web: %w", &classError{errdefs.ErrInvalidArgument, "image reference is empty"}),
		codes.InvalidArgument, "pod default/web: image reference is empty", false},
	{"refusal after the caller left", &classError{errdefs.ErrInvalidArgument, "auth: bad"}, codes.InvalidArgument, "auth: bad", true},
	{"pod deleted", &classError{errdefs.ErrAborted, "pull of docker.io/library/busybox:latest abandoned: pod default/web was deleted"},
		codes.Aborted, "pull of docker.io/library/busybox:latest abandoned: pod default/web was deleted", false},
	{"caller gave up", &classError{context.Canceled, "pull of docker.io/library/busybox:latest: cancelled by the caller: context canceled"},
		codes.Canceled, "pull of docker.io/library/busybox:latest: cancelled by the caller: context canceled", false},
	{"caller's deadline", &classError{context.DeadlineExceeded, "pull of docker.io/library/busybox:latest: caller's deadline passed"},
		codes.DeadlineExceeded, "pull of docker.io/library/busybox:latest: caller's deadline passed", false},
	{"errdefs message", errdefs.ErrFailedPrecondition.WithMessage("claim not reserved"), codes.FailedPrecondition, "claim not reserved", false},
	{"errdefs wrapped", fmt.Errorf("sandbox s1: %w", errdefs.ErrNotFound), codes.NotFound, "sandbox s1: not found", false},
	{"explicitly unknown", errdefs.ErrUnknown.WithMessage("runtime said so"), codes.Unknown, "runtime said so", false},
	{"driver timed out", fmt.Errorf("driver net.example: %w: %w", errdefs.ErrUnavailable, context.DeadlineExceeded),
		codes.Unavailable, "driver net.example: unavailable: context deadline exceeded", false},
	{"plain context error", fmt.Errorf("list sandboxes: %w", context.DeadlineExceeded),
		codes.DeadlineExceeded, "list sandboxes: context deadline exceeded", false},
	{"unclassified", errors.New("disk full"), codes.Internal, "disk full", false},
	{"unclassified after the caller left", errors.New("disk full"), codes.Canceled, "disk full", true},
	{"status passes through", fmt.Errorf("prepare claim gpu: %w", status.Error(codes.FailedPrecondition, "driver not registered")),
		codes.FailedPrecondition, "prepare claim gpu: driver not registered", false},
}

func TestToStatus(t *testing.T) {
	if err := toStatus(context.Background(), nil); err != nil {
		t.Errorf("toStatus(nil) = %v", err)
	}
	for _, tc := range classifiedErrors {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if tc.canceled {
				cancel()
			}
			st, ok := status.FromError(toStatus(ctx, tc.err))
			if !ok || st.Code() != tc.code || st.Message() != tc.msg {
				t.Errorf("toStatus(%q) = %v %q, want %v %q", tc.err, st.Code(), st.Message(), tc.code, tc.msg)
			}
		})
	}
}

// TestClassifiedErrorsReachTheClient: an interceptor's typed error reaches the kubelet with its
// class's code and its own message, mapped once at the boundary.
func TestClassifiedErrorsReachTheClient(t *testing.T) {
	be := newTestRuntime(t, filepath.Join(testfs.ShortDir(t), "rt.sock"))
	byPod := map[string]error{}
	for _, tc := range classifiedErrors {
		if !tc.canceled {
			byPod[tc.name] = tc.err
		}
	}
	_, conn := proxyFor(t, be.path, "", func(s *Server) {
		Intercept(s, RunPodSandbox, func(_ context.Context, req *runtimeapi.RunPodSandboxRequest, _ runReqFwd) (*runtimeapi.RunPodSandboxResponse, error) {
			return nil, byPod[req.GetConfig().GetMetadata().GetName()]
		})
	})
	client := runtimeapi.NewRuntimeServiceClient(conn)
	for _, tc := range classifiedErrors {
		if tc.canceled {
			continue // a client that left sees only its own cancellation
		}
		t.Run(tc.name, func(t *testing.T) {
			_, err := client.RunPodSandbox(t.Context(), &runtimeapi.RunPodSandboxRequest{Config: &runtimeapi.PodSandboxConfig{
				Metadata: &runtimeapi.PodSandboxMetadata{Name: tc.name},
			}})
			st := status.Convert(err)
			if st.Code() != tc.code || st.Message() != tc.msg {
				t.Errorf("got %v %q, want %v %q", st.Code(), st.Message(), tc.code, tc.msg)
			}
		})
	}
	if n := be.calls.Load(); n != 0 {
		t.Errorf("backend got %d calls", n)
	}
}

// TestRelayedCallsAreCounted: the calls the relay forwards to the runtime are counted per
// method and code, and leave nothing in flight; the intercepted ones are counted once, by
// their handler.
func TestRelayedCallsAreCounted(t *testing.T) {
	be := newTestRuntime(t, filepath.Join(testfs.ShortDir(t), "rt.sock"))
	reg := prometheus.NewRegistry()
	_, conn := proxyFor(t, be.path, "", func(s *Server) {
		s.metrics = NewMetrics(reg)
		passThrough(s, RunPodSandbox)
	})
	client := runtimeapi.NewRuntimeServiceClient(conn)
	for range 2 {
		if _, err := client.Version(t.Context(), &runtimeapi.VersionRequest{}); err != nil {
			t.Fatal(err)
		}
	}
	// The test runtime implements no Status: the runtime's Unimplemented, counted as such.
	if _, err := client.Status(t.Context(), &runtimeapi.StatusRequest{}); status.Code(err) != codes.Unimplemented {
		t.Fatalf("Status: %v, want the runtime's Unimplemented", err)
	}
	if _, err := client.RunPodSandbox(t.Context(), &runtimeapi.RunPodSandboxRequest{}); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		method, code string
		want         float64
	}{{"Version", "OK", 2}, {"Status", "Unimplemented", 1}, {"RunPodSandbox", "OK", 1}} {
		c, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		if got := metricValue(c, "podgate_cri_requests_total", map[string]string{"method": tt.method, "code": tt.code}); got != tt.want {
			t.Errorf("podgate_cri_requests_total{method=%s,code=%s} = %v, want %v", tt.method, tt.code, got, tt.want)
		}
	}
	c, _ := reg.Gather()
	for _, m := range []string{"Version", "Status", "RunPodSandbox"} {
		if got := metricValue(c, "podgate_cri_requests_in_flight", map[string]string{"method": m}); got != 0 {
			t.Errorf("podgate_cri_requests_in_flight{method=%s} = %v after the calls ended", m, got)
		}
	}
}

// metricValue is the value of the counter or gauge name with labels in mfs, 0 when absent.
func metricValue(mfs []*dto.MetricFamily, name string, labels map[string]string) float64 {
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if want, ok := labels[lp.GetName()]; ok && want != lp.GetValue() {
					continue next
				}
			}
			if m.GetCounter() != nil {
				return m.GetCounter().GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	return 0
}
