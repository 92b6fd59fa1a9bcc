package imagepull_test

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/distribution/reference"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podgate/podgate/cri"
	"github.com/podgate/podgate/cri/imagepull"
	"github.com/podgate/podgate/test/testfs"
)

// latencyImageService is a backend image service over real gRPC. Each pull takes a random
// latency; the service itself measures how many pulls podgate has outstanding at once, per node
// and per registry, so the caps are checked where they matter rather than by the governor's
// counters.
//
// A call counts from when its handler starts until it returns or its context is cancelled: that
// is what podgate can know of it, and what its caps bound. When podgate cancels a call, its
// client returns at once while the handler may run on for a moment; but the cancellation goes
// out on the connection before any call podgate makes afterwards, and the server cancels the
// handler's context when it reads it. So a call podgate no longer has outstanding has left the
// count before the next call podgate makes is counted.
type latencyImageService struct {
	runtimeapi.UnimplementedImageServiceServer
	minLatency, maxLatency time.Duration

	calls atomic.Int64

	mu      sync.Mutex
	active  map[*backendPull]struct{}
	maxNode int
	regMax  map[string]int
}

// backendPull is one call the backend is serving.
type backendPull struct {
	ctx      context.Context
	registry string
}

func newLatencyImageService(minLatency, maxLatency time.Duration) *latencyImageService {
	return &latencyImageService{minLatency: minLatency, maxLatency: maxLatency,
		active: map[*backendPull]struct{}{}, regMax: map[string]int{}}
}

func (s *latencyImageService) PullImage(ctx context.Context, req *runtimeapi.PullImageRequest) (*runtimeapi.PullImageResponse, error) {
	s.calls.Add(1)
	ref, err := reference.ParseDockerRef(req.GetImage().GetImage())
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "backend: %v", err)
	}
	defer s.enter(ctx, registryOf(ref))()
	latency := s.minLatency + rand.N(s.maxLatency-s.minLatency+1)
	select {
	case <-time.After(latency): // the injected latency: a pull takes time
	case <-ctx.Done():
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	return &runtimeapi.PullImageResponse{ImageRef: "sha256:" + ref.String()}, nil
}

// enter counts a new call with the others still outstanding, and returns how to end it.
func (s *latencyImageService) enter(ctx context.Context, registry string) (leave func()) {
	p := &backendPull{ctx: ctx, registry: registry}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.active[p] = struct{}{}
	node, reg := 0, 0
	for a := range s.active {
		if a.ctx.Err() != nil {
			continue // cancelled by podgate: no longer outstanding
		}
		node++
		if a.registry == registry {
			reg++
		}
	}
	s.maxNode = max(s.maxNode, node)
	s.regMax[registry] = max(s.regMax[registry], reg)
	return func() {
		s.mu.Lock()
		delete(s.active, p)
		s.mu.Unlock()
	}
}

func (s *latencyImageService) maxima() (int, map[string]int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.maxNode, maps.Clone(s.regMax)
}

// registryOf is the backend's own view of the registry host, as containerd sees it.
func registryOf(ref reference.Named) string {
	return strings.ToLower(reference.Domain(ref))
}

// proxy is a cri.Server with the governor in front of a backend image service, both on unix
// sockets, and a client of the proxy.
type proxy struct {
	client runtimeapi.ImageServiceClient
}

func startProxy(t *testing.T, backend runtimeapi.ImageServiceServer, g *imagepull.Governor, prio imagepull.Prioritizer) *proxy {
	t.Helper()
	dir := testfs.ShortDir(t)
	beSock := filepath.Join(dir, "be.sock")
	bl, err := net.Listen("unix", beSock)
	if err != nil {
		t.Fatal(err)
	}
	bs := grpc.NewServer()
	runtimeapi.RegisterImageServiceServer(bs, backend)
	go func() { _ = bs.Serve(bl) }() // returns when stopped below
	t.Cleanup(bs.Stop)

	be, err := cri.NewBackend(t.Context(), "image", "unix://"+beSock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = be.Close() })
	s := cri.NewServer(be, be)
	g.Register(s, prio)
	l, err := cri.Listen(filepath.Join(dir, "cri.sock"), cri.SocketOptions{Mode: 0o600})
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- s.Serve(l) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		s.Shutdown(ctx)
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	conn, err := grpc.NewClient("unix://"+filepath.Join(dir, "cri.sock"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return &proxy{client: runtimeapi.NewImageServiceClient(conn)}
}

// TestCapsUnderLoad sends 200 concurrent random pulls (images, registries, credentials,
// priorities; some callers give up early) through the proxy: the backend never serves more
// than the caps at once, and every caller that stayed gets its own image.
func TestCapsUnderLoad(t *testing.T) {
	const (
		callers     = 200
		maxParallel = 4
	)
	perRegistry := map[string]int{"docker.io": 2, "quay.io": 1}
	registries := []string{"docker.io/library", "quay.io/org", "registry.k8s.io", "127.0.0.1:5000/team"}
	backend := newLatencyImageService(time.Millisecond, 4*time.Millisecond)
	g := imagepull.New(imagepull.Limits{MaxParallel: maxParallel, PerRegistry: perRegistry})
	sp := imagepull.SandboxPriority{Label: "podgate.dev/priority-class", Namespaces: []string{"kube-system"}}
	p := startProxy(t, backend, g, func(_ context.Context, req *runtimeapi.PullImageRequest) imagepull.Priority {
		return sp.Of(req.GetSandboxConfig())
	})

	classes := []string{"", imagepull.ClusterCriticalClass, imagepull.NodeCriticalClass}
	var wg sync.WaitGroup
	var cancelled, succeeded atomic.Int64
	errs := make(chan error, callers)
	for i := range callers {
		image := fmt.Sprintf("%s/img%d:v%d", registries[rand.N(len(registries))], rand.N(10), rand.N(2))
		req := &runtimeapi.PullImageRequest{
			Image: &runtimeapi.ImageSpec{Image: image},
			SandboxConfig: &runtimeapi.PodSandboxConfig{
				Metadata: &runtimeapi.PodSandboxMetadata{Namespace: "kube-system", Name: fmt.Sprint("pod", i), Uid: fmt.Sprint("uid", i)},
				Labels:   map[string]string{"podgate.dev/priority-class": classes[rand.N(len(classes))]},
			},
		}
		if user := rand.N(3); user > 0 {
			req.Auth = &runtimeapi.AuthConfig{Username: fmt.Sprint("user", user), Password: "pw"}
		}
		giveUp := rand.N(10) == 0
		wg.Go(func() {
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			if giveUp {
				// These callers give up at a random moment: waiting, running or done.
				time.AfterFunc(time.Duration(rand.N(20))*time.Millisecond, cancel)
			}
			resp, err := p.client.PullImage(ctx, req)
			switch {
			case giveUp && status.Code(err) == codes.Canceled:
				cancelled.Add(1)
			case err != nil:
				errs <- fmt.Errorf("pull %s: %w", image, err)
			case resp.GetImageRef() != "sha256:"+mustName(image):
				errs <- fmt.Errorf("pull %s: got image %s", image, resp.GetImageRef())
			default:
				succeeded.Add(1)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	maxNode, regMax := backend.maxima()
	t.Logf("%d succeeded, %d gave up; backend served %d pulls, at most %d outstanding at once, per registry %v",
		succeeded.Load(), cancelled.Load(), backend.calls.Load(), maxNode, regMax)
	if maxNode > maxParallel {
		t.Errorf("podgate had %d pulls outstanding at the backend at once, cap %d", maxNode, maxParallel)
	} else if maxNode < maxParallel {
		t.Errorf("podgate had at most %d pulls outstanding at once: the load never reached the cap %d, the test proves nothing", maxNode, maxParallel)
	}
	for reg, limit := range perRegistry {
		if m := regMax[reg]; m > limit {
			t.Errorf("podgate had %d pulls from %s outstanding at once, cap %d", m, reg, limit)
		}
	}
	if c := backend.calls.Load(); c >= callers {
		t.Errorf("backend got %d pulls for %d callers sharing 120 image+credential pairs: no de-duplication", c, callers)
	}
}

func mustName(image string) string {
	ref, err := reference.ParseDockerRef(image)
	if err != nil {
		panic(err)
	}
	return ref.String()
}

// TestInvalidImageReference: a reference containerd would refuse is InvalidArgument, with
// podgate's message, and reaches neither queue nor backend.
func TestInvalidImageReference(t *testing.T) {
	backend := newLatencyImageService(0, 0)
	g := imagepull.New(imagepull.Limits{MaxParallel: 1})
	p := startProxy(t, backend, g, nil)
	for image, want := range map[string]string{
		"":                           "image reference is empty",
		"Busybox":                    `image reference "Busybox": invalid reference format: repository name (library/Busybox) must be lowercase`,
		"bad ref with spaces":        `image reference "bad ref with spaces": invalid reference format`,
		"example.com/x:tag:tag":      `image reference "example.com/x:tag:tag": invalid reference format`,
		"example.com/x@sha256:short": `image reference "example.com/x@sha256:short": invalid reference format`,
	} {
		t.Run(fmt.Sprintf("%q", image), func(t *testing.T) {
			_, err := p.client.PullImage(t.Context(), &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: image}})
			if st := status.Convert(err); st.Code() != codes.InvalidArgument || st.Message() != want {
				t.Errorf("PullImage(%q) = %v, want InvalidArgument %q", image, err, want)
			}
		})
	}
	if c := backend.calls.Load(); c != 0 {
		t.Errorf("backend got %d calls, want 0", c)
	}
	if s := g.Stats(); s != (imagepull.Stats{}) {
		t.Errorf("governor state %+v after invalid pulls, want empty", s)
	}
}

// blockingImageService holds every pull until the test ends.
type blockingImageService struct {
	runtimeapi.UnimplementedImageServiceServer
	started chan struct{}
}

func (s *blockingImageService) PullImage(ctx context.Context, _ *runtimeapi.PullImageRequest) (*runtimeapi.PullImageResponse, error) {
	s.started <- struct{}{}
	<-ctx.Done()
	return nil, status.FromContextError(ctx.Err()).Err()
}

// TestDeletedPodReachesKubeletAsAborted: the governor's errdefs.ErrAborted is Aborted at the
// kubelet, with the governor's message.
func TestDeletedPodReachesKubeletAsAborted(t *testing.T) {
	backend := &blockingImageService{started: make(chan struct{}, 1)}
	g := imagepull.New(imagepull.Limits{MaxParallel: 1})
	queued := make(chan string, 10)
	imagepull.SetTrace(g, func(event, image string) {
		if event == "queued" {
			queued <- image
		}
	})
	p := startProxy(t, backend, g, nil)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel() // ends the blocker
	go func() {
		_, _ = p.client.PullImage(ctx, &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: "example.com/blocker"}})
	}()
	<-backend.started
	<-queued // the blocker

	res := make(chan error, 1)
	go func() {
		_, err := p.client.PullImage(t.Context(), &runtimeapi.PullImageRequest{
			Image:         &runtimeapi.ImageSpec{Image: "example.com/app"},
			SandboxConfig: &runtimeapi.PodSandboxConfig{Metadata: &runtimeapi.PodSandboxMetadata{Namespace: "default", Name: "web", Uid: "uid-web"}},
		})
		res <- err
	}()
	if image := <-queued; image != "example.com/app:latest" {
		t.Fatalf("queued %s, want example.com/app:latest", image)
	}
	g.PodDeleted("uid-web")
	const want = "pull of example.com/app:latest abandoned: pod default/web was deleted"
	if st := status.Convert(<-res); st.Code() != codes.Aborted || st.Message() != want {
		t.Errorf("got %v, want Aborted %q", st.Err(), want)
	}
}
