package cri

import (
	"context"
	"errors"
	"io"
	"net"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podgate/podgate/test/testfs"
)

// testRuntime is a backend runtime served over real gRPC on a unix socket. It records what
// reaches it so tests can compare with what the client sent.
type testRuntime struct {
	runtimeapi.UnimplementedRuntimeServiceServer
	runtimeapi.UnimplementedImageServiceServer

	path  string
	srv   *grpc.Server
	calls atomic.Int64

	mu          sync.Mutex
	lastMD      metadata.MD
	lastDL      time.Time
	lastUnknown []byte // unknown fields of the last request
	lastRunReq  *runtimeapi.RunPodSandboxRequest
	rawMethod   string
	rawBody     []byte

	// behaviours
	versionErr   error
	execStarted  chan struct{}
	execCanceled chan struct{}
	events       []*runtimeapi.ContainerEventResponse
	eventsOpen   chan struct{}
	eventsEnded  chan struct{}
	containers   []*runtimeapi.Container
	sandboxes    []*runtimeapi.PodSandbox
	// List streaming: the pages StreamContainers and StreamPodSandboxes send (nil: the
	// runtime answers Unimplemented, as one older than list streaming), then streamErr as the
	// stream's status. With pageGate set StreamContainers waits for it after its first page.
	containerPages [][]*runtimeapi.Container
	sandboxPages   [][]*runtimeapi.PodSandbox
	streamErr      error
	pageGate       chan struct{}
	streamFilter   *runtimeapi.ContainerFilter // the last StreamContainers' filter
	streams, lists atomic.Int64                // Stream* and List* calls of containers and sandboxes
}

func newTestRuntime(t testing.TB, path string) *testRuntime {
	t.Helper()
	r := &testRuntime{
		path:         path,
		execStarted:  make(chan struct{}, 1),
		execCanceled: make(chan struct{}, 1),
		eventsOpen:   make(chan struct{}, 1),
		eventsEnded:  make(chan struct{}, 1),
	}
	r.start(t)
	return r
}

func (r *testRuntime) start(t testing.TB) {
	t.Helper()
	l, err := net.Listen("unix", r.path)
	if err != nil {
		t.Fatal(err)
	}
	r.srv = grpc.NewServer(grpc.UnknownServiceHandler(r.unknown), grpc.MaxSendMsgSize(64<<20), grpc.ForceServerCodecV2(newRawCodec()))
	runtimeapi.RegisterRuntimeServiceServer(r.srv, r)
	runtimeapi.RegisterImageServiceServer(r.srv, r)
	go r.srv.Serve(l) //nolint:errcheck // ends with Stop
	t.Cleanup(r.srv.Stop)
}

func (r *testRuntime) record(ctx context.Context, unknown []byte) {
	r.calls.Add(1)
	md, _ := metadata.FromIncomingContext(ctx)
	dl, _ := ctx.Deadline()
	r.mu.Lock()
	r.lastMD, r.lastDL, r.lastUnknown = md, dl, unknown
	r.mu.Unlock()
}

func (r *testRuntime) Version(ctx context.Context, req *runtimeapi.VersionRequest) (*runtimeapi.VersionResponse, error) {
	r.record(ctx, req.ProtoReflect().GetUnknown())
	if r.versionErr != nil {
		return nil, r.versionErr
	}
	_ = grpc.SetHeader(ctx, metadata.Pairs("x-backend-header", "h1"))
	_ = grpc.SetTrailer(ctx, metadata.Pairs("x-backend-trailer", "t1"))
	return &runtimeapi.VersionResponse{Version: "0.1.0", RuntimeName: "testRuntime", RuntimeVersion: "1.0", RuntimeApiVersion: "v1"}, nil
}

func (r *testRuntime) RunPodSandbox(ctx context.Context, req *runtimeapi.RunPodSandboxRequest) (*runtimeapi.RunPodSandboxResponse, error) {
	r.record(ctx, req.ProtoReflect().GetUnknown())
	r.mu.Lock()
	r.lastRunReq = req
	r.mu.Unlock()
	return &runtimeapi.RunPodSandboxResponse{PodSandboxId: "sandbox-" + req.GetConfig().GetMetadata().GetName()}, nil
}

func (r *testRuntime) ExecSync(ctx context.Context, req *runtimeapi.ExecSyncRequest) (*runtimeapi.ExecSyncResponse, error) {
	r.record(ctx, nil)
	r.execStarted <- struct{}{}
	<-ctx.Done()
	r.execCanceled <- struct{}{}
	return nil, ctx.Err()
}

func (r *testRuntime) ListContainers(ctx context.Context, req *runtimeapi.ListContainersRequest) (*runtimeapi.ListContainersResponse, error) {
	r.record(ctx, nil)
	r.lists.Add(1)
	return &runtimeapi.ListContainersResponse{Containers: r.containers}, nil
}

func (r *testRuntime) ListPodSandbox(ctx context.Context, req *runtimeapi.ListPodSandboxRequest) (*runtimeapi.ListPodSandboxResponse, error) {
	r.record(ctx, nil)
	r.lists.Add(1)
	return &runtimeapi.ListPodSandboxResponse{Items: r.sandboxes}, nil
}

func (r *testRuntime) StreamContainers(req *runtimeapi.StreamContainersRequest, s runtimeapi.RuntimeService_StreamContainersServer) error {
	r.record(s.Context(), nil)
	r.streams.Add(1)
	r.mu.Lock()
	r.streamFilter = req.GetFilter()
	r.mu.Unlock()
	if r.containerPages == nil {
		return r.UnimplementedRuntimeServiceServer.StreamContainers(req, s)
	}
	for i, page := range r.containerPages {
		if err := s.Send(&runtimeapi.StreamContainersResponse{Containers: page}); err != nil {
			return err
		}
		if i == 0 && r.pageGate != nil {
			select {
			case <-r.pageGate:
			case <-s.Context().Done():
				return s.Context().Err()
			}
		}
	}
	return r.streamErr
}

func (r *testRuntime) StreamPodSandboxes(req *runtimeapi.StreamPodSandboxesRequest, s runtimeapi.RuntimeService_StreamPodSandboxesServer) error {
	r.record(s.Context(), nil)
	r.streams.Add(1)
	if r.sandboxPages == nil {
		return r.UnimplementedRuntimeServiceServer.StreamPodSandboxes(req, s)
	}
	for _, page := range r.sandboxPages {
		if err := s.Send(&runtimeapi.StreamPodSandboxesResponse{PodSandboxes: page}); err != nil {
			return err
		}
	}
	return r.streamErr
}

func (r *testRuntime) GetContainerEvents(req *runtimeapi.GetEventsRequest, s runtimeapi.RuntimeService_GetContainerEventsServer) error {
	r.record(s.Context(), nil)
	r.eventsOpen <- struct{}{}
	for _, e := range r.events {
		if err := s.Send(e); err != nil {
			return err
		}
	}
	<-s.Context().Done()
	r.eventsEnded <- struct{}{}
	return nil
}

func (r *testRuntime) ListImages(ctx context.Context, req *runtimeapi.ListImagesRequest) (*runtimeapi.ListImagesResponse, error) {
	r.record(ctx, nil)
	return &runtimeapi.ListImagesResponse{Images: []*runtimeapi.Image{{Id: "sha256:" + filepath.Base(r.path)}}}, nil
}

// unknown answers methods that podgate's cri-api does not know: it echoes the request bytes.
func (r *testRuntime) unknown(_ any, ss grpc.ServerStream) error {
	m, _ := grpc.MethodFromServerStream(ss)
	var f frame
	if err := ss.RecvMsg(&f); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	r.calls.Add(1)
	r.mu.Lock()
	r.rawMethod, r.rawBody = m, append([]byte(nil), f.bytes()...)
	r.mu.Unlock()
	return ss.SendMsg(&f)
}

// proxyFor starts a podgate CRI server in front of runtime (and image, when given) and returns
// a client connection to it.
func proxyFor(t testing.TB, runtimePath, imagePath string, setup func(*Server)) (*Server, *grpc.ClientConn) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	rt, err := NewBackend(ctx, "runtime", runtimePath, WithConnectWait(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close() })
	img := rt
	if imagePath != "" {
		if img, err = NewBackend(ctx, "image", imagePath); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { img.Close() })
	}
	s := NewServer(rt, img)
	if setup != nil {
		setup(s)
	}
	sock := filepath.Join(testfs.ShortDir(t), "podgate.sock")
	l, err := Listen(sock, SocketOptions{Mode: 0o660})
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve(l) //nolint:errcheck // returns nil after Shutdown
	t.Cleanup(func() { s.Shutdown(ctx) })
	return s, dial(t, sock)
}

func dial(t testing.TB, path string) *grpc.ClientConn {
	t.Helper()
	c, err := grpc.NewClient("unix://"+path,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}
