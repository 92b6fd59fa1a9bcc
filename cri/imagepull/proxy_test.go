package imagepull_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
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
// latency; the service itself measures how many pulls it serves at once, per node and per
// registry, so the caps are checked where they matter rather than by the governor's counters.
type latencyImageService struct {
	runtimeapi.UnimplementedImageServiceServer
	minLatency, maxLatency time.Duration

	calls    atomic.Int64
	inFlight atomic.Int64
	maxNode  atomic.Int64

	mu          sync.Mutex
	regInFlight map[string]int
	regMax      map[string]int
}

func (s *latencyImageService) PullImage(ctx context.Context, req *runtimeapi.PullImageRequest) (*runtimeapi.PullImageResponse, error) {
	s.calls.Add(1)
	ref, err := name.ParseReference(req.GetImage().GetImage())
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "backend: %v", err)
	}
	reg := imagepullRegistry(ref)
	n := s.inFlight.Add(1)
	for m := s.maxNode.Load(); n > m && !s.maxNode.CompareAndSwap(m, n); m = s.maxNode.Load() {
	}
	s.mu.Lock()
	s.regInFlight[reg]++
	s.regMax[reg] = max(s.regMax[reg], s.regInFlight[reg])
	s.mu.Unlock()
	defer func() {
		s.inFlight.Add(-1)
		s.mu.Lock()
		s.regInFlight[reg]--
		s.mu.Unlock()
	}()
	latency := s.minLatency + rand.N(s.maxLatency-s.minLatency+1)
	select {
	case <-time.After(latency): // the injected latency: a pull takes time
	case <-ctx.Done():
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	return &runtimeapi.PullImageResponse{ImageRef: "sha256:" + ref.Name()}, nil
}

// imagepullRegistry is the backend's own view of the registry host, Docker Hub normalised.
func imagepullRegistry(ref name.Reference) string {
	r := ref.Context().RegistryStr()
	if r == name.DefaultRegistry {
		return "docker.io"
	}
	return r
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
	backend := &latencyImageService{minLatency: time.Millisecond, maxLatency: 4 * time.Millisecond,
		regInFlight: map[string]int{}, regMax: map[string]int{}}
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
	t.Logf("%d succeeded, %d gave up; backend served %d pulls, at most %d at once, per registry %v",
		succeeded.Load(), cancelled.Load(), backend.calls.Load(), backend.maxNode.Load(), backend.regMax)
	if m := backend.maxNode.Load(); m > maxParallel {
		t.Errorf("backend served %d pulls at once, cap %d", m, maxParallel)
	} else if m < maxParallel {
		t.Errorf("backend served at most %d pulls at once: the load never reached the cap %d, the test proves nothing", m, maxParallel)
	}
	for reg, limit := range perRegistry {
		if m := backend.regMax[reg]; m > limit {
			t.Errorf("backend served %d pulls from %s at once, cap %d", m, reg, limit)
		}
	}
	if c := backend.calls.Load(); c >= callers {
		t.Errorf("backend got %d pulls for %d callers sharing 120 image+credential pairs: no de-duplication", c, callers)
	}
}

func mustName(image string) string {
	ref, err := name.ParseReference(image)
	if err != nil {
		panic(err)
	}
	return ref.Name()
}

// TestInvalidImageReference: a bad reference is InvalidArgument and reaches neither queue nor
// backend.
func TestInvalidImageReference(t *testing.T) {
	backend := &latencyImageService{regInFlight: map[string]int{}, regMax: map[string]int{}}
	g := imagepull.New(imagepull.Limits{MaxParallel: 1})
	p := startProxy(t, backend, g, nil)
	for _, image := range []string{"", "UPPER/case", "bad ref with spaces", "example.com/x:tag:tag", "example.com/x@sha256:short"} {
		t.Run(fmt.Sprintf("%q", image), func(t *testing.T) {
			_, err := p.client.PullImage(t.Context(), &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: image}})
			if status.Code(err) != codes.InvalidArgument {
				t.Errorf("PullImage(%q) = %v, want InvalidArgument", image, err)
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
