package imagepull_test

import (
	"context"
	"crypto/sha256"
	"fmt"
	"maps"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/distribution/reference"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podgate/podgate/cri"
	"github.com/podgate/podgate/cri/imagepull"
	"github.com/podgate/podgate/test/crifake"
	"github.com/podgate/podgate/test/testfs"
)

// A fake Kubernetes 1.38 runtime (test/crifake's image service with cri-api v0.38's
// security-profile methods, on a real gRPC server) behind podgate's CRI server with the
// governor on PullImage and PullSecurityProfile.

// profileProxy is podgate's CRI server in front of a 1.38 image service, and its clients.
type profileProxy struct {
	images   runtimeapi.ImageServiceClient
	profiles crifake.ProfileClient
	// metrics is the CRI server's registry (podgate_cri_*).
	metrics *prometheus.Registry
}

// startProfileProxy serves images as the runtime and podgate's CRI server in front of it, with
// g on both pull methods (priorities from prio), until the test ends.
func startProfileProxy(t testing.TB, images crifake.ImageServer, g *imagepull.Governor, prio imagepull.Prioritizer) *profileProxy {
	t.Helper()
	return startProxyOn(t, func(path string) { crifake.ServeImages(t, path, nil, images) }, g, prio)
}

// startOldProxy is startProfileProxy with a runtime of cri-api v0.37, which has no
// security-profile methods: containerd 2.3 and 2.4.
func startOldProxy(t testing.TB, images runtimeapi.ImageServiceServer) *profileProxy {
	t.Helper()
	return startProxyOn(t, func(path string) {
		l, err := net.Listen("unix", path)
		if err != nil {
			t.Fatal(err)
		}
		s := grpc.NewServer()
		runtimeapi.RegisterImageServiceServer(s, images)
		go func() { _ = s.Serve(l) }() // returns when stopped below
		t.Cleanup(s.Stop)
	}, imagepull.New(imagepull.Limits{}), nil)
}

// startProxyOn starts the runtime with serve on a unix socket path and podgate's CRI server in
// front of it.
func startProxyOn(t testing.TB, serve func(path string), g *imagepull.Governor, prio imagepull.Prioritizer) *profileProxy {
	t.Helper()
	dir := testfs.ShortDir(t)
	serve(filepath.Join(dir, "rt.sock"))
	be, err := cri.NewBackend(t.Context(), "image", "unix://"+filepath.Join(dir, "rt.sock"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = be.Close() })
	reg := prometheus.NewRegistry()
	s := cri.NewServer(be, be, cri.WithMetrics(cri.NewMetrics(reg)))
	cri.Intercept(s, cri.PullImage, g.Interceptor(prio))
	cri.InterceptRaw(s, cri.PullSecurityProfile, g.ProfileInterceptor(prio))
	conn := serveCRI(t, dir, s)
	return &profileProxy{images: runtimeapi.NewImageServiceClient(conn), profiles: crifake.ProfileClient{Conn: conn}, metrics: reg}
}

// profileRef is a digest-pinned reference of a profile named name on registry host.
func profileRef(host, name string) string {
	return fmt.Sprintf("%s/profiles/%s@sha256:%x", host, name, sha256.Sum256([]byte(name)))
}

// profileReq is a PullSecurityProfileRequest as the kubelet 1.38 sends it, for pod name (UID
// "uid-"+name, in namespace ns) with credentials user (none when "") and runtime handler.
func profileReq(ref, user, handler, ns, pod string) crifake.ProfileRequest {
	r := crifake.ProfileRequest{
		PullImageRequest: &runtimeapi.PullImageRequest{
			Image: &runtimeapi.ImageSpec{Image: ref, UserSpecifiedImage: ref, RuntimeHandler: handler},
			SandboxConfig: &runtimeapi.PodSandboxConfig{
				Metadata: &runtimeapi.PodSandboxMetadata{Namespace: ns, Name: pod, Uid: "uid-" + pod},
			},
		},
		Kind: crifake.SeccompKind,
	}
	if user != "" {
		r.Auth = &runtimeapi.AuthConfig{Username: user, Password: "pw"}
	}
	return r
}

// call is one pull that reached the fake runtime, of either kind; it waits until released.
type call struct {
	kind, ref, user, handler string
	profileKind              int32
	// pod is the name in the request's sandbox config: whose request the runtime got.
	pod     string
	ctx     context.Context
	release chan error
}

func (c *call) String() string {
	return fmt.Sprintf("%s %s user %q handler %q kind %d", c.kind, c.ref, c.user, c.handler, c.profileKind)
}

// heldRuntime is a 1.38 runtime's image service whose pulls, images and security profiles
// alike, wait until the test releases each (or, with latency set, until latency has passed).
// It measures how many pulls it serves at once, on the node and per registry host: where
// podgate's caps must hold.
type heldRuntime struct {
	runtimeapi.UnimplementedImageServiceServer
	*crifake.Profiles
	calls   chan *call
	latency time.Duration

	mu     sync.Mutex
	active map[*call]struct{}
	most   int
	regMax map[string]int
}

func newHeldRuntime() *heldRuntime {
	r := &heldRuntime{calls: make(chan *call, 100), active: map[*call]struct{}{}, regMax: map[string]int{}}
	r.Profiles = &crifake.Profiles{Before: func(ctx context.Context, req crifake.ProfileRequest) error {
		return r.serve(ctx, &call{kind: "profile", ref: req.GetImage().GetImage(), user: req.GetAuth().GetUsername(),
			handler: req.GetImage().GetRuntimeHandler(), profileKind: req.Kind, pod: req.GetSandboxConfig().GetMetadata().GetName()})
	}}
	return r
}

func (r *heldRuntime) PullImage(ctx context.Context, req *runtimeapi.PullImageRequest) (*runtimeapi.PullImageResponse, error) {
	c := &call{kind: "image", ref: req.GetImage().GetImage(), user: req.GetAuth().GetUsername(), handler: req.GetImage().GetRuntimeHandler(),
		pod: req.GetSandboxConfig().GetMetadata().GetName()}
	if err := r.serve(ctx, c); err != nil {
		return nil, err
	}
	return &runtimeapi.PullImageResponse{ImageRef: "sha256:" + c.ref}, nil
}

// serve counts c among the pulls served now, tells the test of it and waits for its release.
func (r *heldRuntime) serve(ctx context.Context, c *call) error {
	c.ctx, c.release = ctx, make(chan error, 1)
	registry := "?"
	if ref, err := reference.ParseNormalizedNamed(c.ref); err == nil {
		registry = reference.Domain(ref)
	}
	r.mu.Lock()
	r.active[c] = struct{}{}
	node, reg := 0, 0
	for a := range r.active {
		if a.ctx.Err() == nil {
			node++
			if a.ref != "" && strings.HasPrefix(a.ref, registry+"/") {
				reg++
			}
		}
	}
	r.most = max(r.most, node)
	r.regMax[registry] = max(r.regMax[registry], reg)
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		delete(r.active, c)
		r.mu.Unlock()
	}()
	r.calls <- c
	var timer <-chan time.Time
	if r.latency > 0 {
		timer = time.After(r.latency) // the pull's own time: the workload, not a wait for the test
	}
	select {
	case err := <-c.release:
		return err
	case <-timer:
		return nil
	case <-ctx.Done():
		return status.FromContextError(ctx.Err()).Err()
	}
}

// next is the next pull to reach the runtime.
func (r *heldRuntime) next(t *testing.T) *call {
	t.Helper()
	select {
	case c := <-r.calls:
		return c
	case <-time.After(awaitTimeout):
		t.Fatal("no pull reached the runtime")
		return nil
	}
}

// idle fails the test when a pull has reached the runtime that the test did not take.
func (r *heldRuntime) idle(t *testing.T) {
	t.Helper()
	select {
	case c := <-r.calls:
		t.Fatalf("unexpected pull at the runtime: %s", c)
	default:
	}
}

func (r *heldRuntime) maxima() (int, map[string]int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.most, maps.Clone(r.regMax)
}

// queueTrace follows the governor's queue events "queued", "joined", "started" of each
// reference.
type queueTrace chan string

func traceQueue(g *imagepull.Governor) queueTrace {
	q := make(queueTrace, 1000)
	imagepull.SetTrace(g, func(event, image string) { q <- event + " " + image })
	return q
}

// await waits for event of image (the reference as the governor names it).
func (q queueTrace) await(t *testing.T, event, image string) {
	t.Helper()
	timeout := time.After(awaitTimeout)
	for {
		select {
		case e := <-q:
			if e == event+" "+image {
				return
			}
		case <-timeout:
			t.Fatalf("no %s of %s in the governor", event, image)
		}
	}
}

// result is what a caller got.
type result struct {
	cached bool
	err    error
}

// pullProfile makes req's PullSecurityProfile through p in the background.
func (p *profileProxy) pullProfile(ctx context.Context, req crifake.ProfileRequest) <-chan result {
	res := make(chan result, 1)
	go func() {
		cached, err := p.profiles.PullSecurityProfile(ctx, req)
		res <- result{cached, err}
	}()
	return res
}

// pullImage makes a PullImage of ref through p in the background, with the credentials of user
// (none when "").
func (p *profileProxy) pullImage(ctx context.Context, ref, user, ns, pod string) <-chan result {
	req := &runtimeapi.PullImageRequest{
		Image:         &runtimeapi.ImageSpec{Image: ref},
		SandboxConfig: &runtimeapi.PodSandboxConfig{Metadata: &runtimeapi.PodSandboxMetadata{Namespace: ns, Name: pod, Uid: "uid-" + pod}},
	}
	if user != "" {
		req.Auth = &runtimeapi.AuthConfig{Username: user, Password: "pw"}
	}
	res := make(chan result, 1)
	go func() {
		_, err := p.images.PullImage(ctx, req)
		res <- result{err: err}
	}()
	return res
}

func await(t *testing.T, what string, res <-chan result) result {
	t.Helper()
	select {
	case r := <-res:
		return r
	case <-time.After(awaitTimeout):
		t.Fatalf("no answer to %s", what)
		return result{}
	}
}

// TestProfilePullsUnderMaxParallel is the measurement of issue 48: six concurrent profile pulls
// through podgate with maxParallel 2, each taking the runtime 1 s; the runtime serves at most 2
// at once (before podgate governed them it served all 6 at once), and every pull succeeds.
func TestProfilePullsUnderMaxParallel(t *testing.T) {
	rt := newHeldRuntime()
	rt.latency = time.Second
	g := imagepull.New(imagepull.Limits{MaxParallel: 2})
	p := startProfileProxy(t, rt, g, nil)
	var results []<-chan result
	for i := range 6 {
		results = append(results, p.pullProfile(t.Context(), profileReq(profileRef("registry.example.com", fmt.Sprint("p", i)), "", "", "default", fmt.Sprint("pod", i))))
	}
	for i, res := range results {
		if r := await(t, "a profile pull", res); r.err != nil {
			t.Errorf("pull %d: %v", i, r.err)
		}
	}
	most, _ := rt.maxima()
	t.Logf("6 profile pulls of 1 s, maxParallel 2: at most %d at the runtime at once", most)
	if most != 2 {
		t.Errorf("the runtime served %d profile pulls at once, want 2 (maxParallel)", most)
	}
}

// TestProfileAndImagePullsShareTheCaps: profile pulls and image pulls hold the same slots, the
// node's (maxParallel) and their registry's (perRegistry, a profile's by its reference's host),
// and wait in one queue: first come first served, a pull whose registry is full letting the
// next one of another registry start. The runtime never serves more than the caps.
func TestProfileAndImagePullsShareTheCaps(t *testing.T) {
	rt := newHeldRuntime()
	g := imagepull.New(imagepull.Limits{MaxParallel: 2, PerRegistry: map[string]int{"a.example": 1}})
	q := traceQueue(g)
	p := startProfileProxy(t, rt, g, nil)
	ctx := t.Context()
	type pull struct {
		name string
		res  <-chan result
	}
	a1, a2, b1 := profileRef("a.example", "one"), profileRef("a.example", "two"), profileRef("b.example", "one")
	// In this order: a profile of registry a (starts), an image of a (waits: a's cap), a
	// profile of b (starts: the node's second slot), a second profile of a and an image of b
	// (both wait for the node).
	pulls := []pull{{a1, p.pullProfile(ctx, profileReq(a1, "", "", "default", "p1"))}}
	q.await(t, "started", a1)
	pulls = append(pulls, pull{"a.example/app:v1", p.pullImage(ctx, "a.example/app:v1", "", "default", "p2")})
	q.await(t, "queued", "a.example/app:v1")
	pulls = append(pulls, pull{b1, p.pullProfile(ctx, profileReq(b1, "", "", "default", "p3"))})
	q.await(t, "started", b1)
	pulls = append(pulls, pull{a2, p.pullProfile(ctx, profileReq(a2, "", "", "default", "p4"))})
	q.await(t, "queued", a2)
	pulls = append(pulls, pull{"b.example/app:v1", p.pullImage(ctx, "b.example/app:v1", "", "default", "p5")})
	q.await(t, "queued", "b.example/app:v1")
	// The two started together: they reach the runtime in either order.
	first, second := rt.next(t), rt.next(t)
	if first.ref == b1 {
		first, second = second, first
	}
	if first.ref != a1 || second.ref != b1 {
		t.Fatalf("the runtime serves %s and %s, want %s and %s", first, second, a1, b1)
	}
	rt.idle(t)
	if s := g.Stats(); s.InFlight != 2 || s.Queued != 3 {
		t.Fatalf("governor %+v, want 2 running and 3 queued", s)
	}
	// b's profile ends: the node's slot goes to the first pull whose registry has room, b's
	// image (a's two pulls wait for a's cap, held by a1).
	second.release <- nil
	if c := rt.next(t); c.ref != "b.example/app:v1" {
		t.Fatalf("after b's profile the runtime serves %s, want b.example/app:v1", c)
	} else {
		c.release <- nil
	}
	// a's profile ends: a's slot goes to a's image, which came before a's second profile.
	first.release <- nil
	c := rt.next(t)
	if c.ref != "a.example/app:v1" {
		t.Fatalf("after a's first profile the runtime serves %s, want a.example/app:v1", c)
	}
	rt.idle(t)
	c.release <- nil
	if c := rt.next(t); c.ref != a2 {
		t.Fatalf("last the runtime serves %s, want %s", c, a2)
	} else {
		c.release <- nil
	}
	for _, pl := range pulls {
		if r := await(t, pl.name, pl.res); r.err != nil {
			t.Errorf("%s: %v", pl.name, r.err)
		}
	}
	most, regMax := rt.maxima()
	if most > 2 || regMax["a.example"] > 1 {
		t.Errorf("the runtime served %d pulls at once, %d of a.example; caps 2 and 1", most, regMax["a.example"])
	}
}

// TestProfilePullPriority: a profile pull takes its pod's priority as an image pull does, from
// the request's sandbox config: a system-node-critical pod's profile pull starts before the
// ordinary pulls queued before it, of either kind, which then start in their order.
func TestProfilePullPriority(t *testing.T) {
	rt := newHeldRuntime()
	g := imagepull.New(imagepull.Limits{MaxParallel: 1})
	q := traceQueue(g)
	sp := imagepull.SandboxPriority{Label: "podgate.dev/priority-class", Namespaces: []string{"kube-system"}}
	p := startProfileProxy(t, rt, g, func(_ context.Context, req *runtimeapi.PullImageRequest) imagepull.Priority {
		return sp.Of(req.GetSandboxConfig())
	})
	ctx := t.Context()
	blocker := p.pullImage(ctx, "example.com/blocker:v1", "", "default", "blocker")
	held := rt.next(t)
	ordinary := profileRef("example.com", "ordinary")
	first := p.pullProfile(ctx, profileReq(ordinary, "", "", "default", "ordinary"))
	q.await(t, "queued", ordinary)
	image := p.pullImage(ctx, "example.com/app:v1", "", "default", "app")
	q.await(t, "queued", "example.com/app:v1")
	critical := profileRef("example.com", "critical")
	req := profileReq(critical, "", "", "kube-system", "critical")
	req.SandboxConfig.Labels = map[string]string{sp.Label: imagepull.NodeCriticalClass}
	last := p.pullProfile(ctx, req)
	q.await(t, "queued", critical)
	held.release <- nil
	for _, want := range []string{critical, ordinary, "example.com/app:v1"} {
		c := rt.next(t)
		if c.ref != want {
			t.Fatalf("the runtime serves %s, want %s", c, want)
		}
		rt.idle(t)
		c.release <- nil
	}
	for _, res := range []<-chan result{blocker, first, image, last} {
		if r := await(t, "a pull", res); r.err != nil {
			t.Error(r.err)
		}
	}
}

// TestProfilePullPodDeleted: a waiting profile pull of a deleted pod leaves the queue with
// Aborted and never reaches the runtime.
func TestProfilePullPodDeleted(t *testing.T) {
	rt := newHeldRuntime()
	g := imagepull.New(imagepull.Limits{MaxParallel: 1})
	q := traceQueue(g)
	p := startProfileProxy(t, rt, g, nil)
	blocker := p.pullImage(t.Context(), "example.com/blocker:v1", "", "default", "blocker")
	held := rt.next(t)
	ref := profileRef("example.com", "gone")
	res := p.pullProfile(t.Context(), profileReq(ref, "", "", "default", "gone"))
	q.await(t, "queued", ref)
	g.PodDeleted("uid-gone")
	want := fmt.Sprintf("pull of %s abandoned: pod default/gone was deleted", ref)
	if r := await(t, "the deleted pod's pull", res); status.Code(r.err) != codes.Aborted || status.Convert(r.err).Message() != want {
		t.Errorf("got %v, want Aborted %q", r.err, want)
	}
	held.release <- nil
	if r := await(t, "the blocker", blocker); r.err != nil {
		t.Fatal(r.err)
	}
	rt.idle(t)
	if calls := rt.Calls(); len(calls) != 0 {
		t.Errorf("the runtime got %v, want no profile pull", calls)
	}
}
