package imagepull_test

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/distribution/reference"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podgate/podgate/cri"
	"github.com/podgate/podgate/cri/imagepull"
	"github.com/podgate/podgate/test/testfs"
)

// awaitTimeout bounds every wait for an event that must come; reaching it is a failure.
const awaitTimeout = 30 * time.Second

// pullKey is what pulls must have in common to share a backend call, as the backend reads it
// from the request: the image reference normalised as containerd normalises it, the runtime
// handler and the credentials.
type pullKey struct {
	image, handler string
	// auth is "user:password", empty without credentials.
	auth string
}

// imageRef is the backend's answer to a pull of k. It names the whole key, so that a caller can
// tell that it got the result of a pull with its own credentials and runtime handler.
func (k pullKey) imageRef() string {
	return fmt.Sprintf("sha256:%s handler=%q auth=%q", k.image, k.handler, k.auth)
}

// keyOf reads a request's pullKey.
func keyOf(req *runtimeapi.PullImageRequest) (pullKey, reference.Named, error) {
	ref, err := reference.ParseDockerRef(req.GetImage().GetImage())
	if err != nil {
		return pullKey{}, nil, err
	}
	k := pullKey{image: ref.String(), handler: req.GetImage().GetRuntimeHandler()}
	if a := req.GetAuth(); a != nil {
		k.auth = a.GetUsername() + ":" + a.GetPassword()
	}
	return k, ref, nil
}

// loadBackend is a backend image service over real gRPC. It counts the calls it receives per
// pullKey, holds each call while a hold is on (see hold), then lets it finish after a random
// latency. It measures itself how many pulls podgate has outstanding at once, per node and per
// registry, so the caps are checked where they matter rather than by the governor's counters.
//
// A call counts from when its handler starts until it returns or its context is cancelled: that
// is what podgate can know of it, and what its caps bound. When podgate cancels a call, its
// client returns at once while the handler may run on for a moment; but the cancellation goes
// out on the connection before any call podgate makes afterwards, and the server cancels the
// handler's context when it reads it. So a call podgate no longer has outstanding has left the
// count before the next call podgate makes is counted.
type loadBackend struct {
	runtimeapi.UnimplementedImageServiceServer
	// received gets a value for each call once it is counted; buffered for every call a test
	// makes, so that a test reads only what it waits for.
	received chan struct{}

	mu                     sync.Mutex
	rng                    *rand.Rand
	minLatency, maxLatency time.Duration
	gate                   chan struct{} // calls wait until it is closed
	calls                  map[pullKey]int
	active                 map[*backendPull]struct{}
	maxNode                int
	regMax                 map[string]int
}

// backendPull is one call the backend is serving.
type backendPull struct {
	ctx      context.Context
	registry string
}

// newLoadBackend returns a backend whose calls take between minLatency and maxLatency, drawn
// from rng.
func newLoadBackend(rng *rand.Rand, minLatency, maxLatency time.Duration) *loadBackend {
	open := make(chan struct{})
	close(open)
	return &loadBackend{received: make(chan struct{}, 4096), rng: rng,
		minLatency: minLatency, maxLatency: maxLatency, gate: open,
		calls: map[pullKey]int{}, active: map[*backendPull]struct{}{}, regMax: map[string]int{}}
}

func (s *loadBackend) PullImage(ctx context.Context, req *runtimeapi.PullImageRequest) (*runtimeapi.PullImageResponse, error) {
	key, ref, err := keyOf(req)
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "backend: %v", err)
	}
	gate, latency, leave := s.enter(ctx, key, registryOf(ref))
	defer leave()
	s.received <- struct{}{}
	select {
	case <-gate:
	case <-ctx.Done():
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	select {
	case <-time.After(latency): // the injected latency: a pull takes time
	case <-ctx.Done():
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	return &runtimeapi.PullImageResponse{ImageRef: key.imageRef()}, nil
}

// enter counts a new call with the others still outstanding, and returns the gate it waits
// for, its latency and how to end it.
func (s *loadBackend) enter(ctx context.Context, key pullKey, registry string) (<-chan struct{}, time.Duration, func()) {
	p := &backendPull{ctx: ctx, registry: registry}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls[key]++
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
	latency := s.minLatency
	if s.maxLatency > s.minLatency {
		latency += time.Duration(s.rng.Int64N(int64(s.maxLatency-s.minLatency) + 1))
	}
	return s.gate, latency, func() {
		s.mu.Lock()
		delete(s.active, p)
		s.mu.Unlock()
	}
}

// hold makes the calls the backend receives from now on wait, until release.
func (s *loadBackend) hold() (release func()) {
	gate := make(chan struct{})
	s.mu.Lock()
	s.gate = gate
	s.mu.Unlock()
	return sync.OnceFunc(func() { close(gate) })
}

// callsSoFar returns the calls received per key since the last takeCalls.
func (s *loadBackend) callsSoFar() map[pullKey]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.calls)
}

// takeCalls returns the calls received per key since the last takeCalls, and counts afresh.
func (s *loadBackend) takeCalls() map[pullKey]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	calls := s.calls
	s.calls = map[pullKey]int{}
	return calls
}

func (s *loadBackend) maxima() (int, map[string]int) {
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

func startProxy(t testing.TB, backend runtimeapi.ImageServiceServer, g *imagepull.Governor, prio imagepull.Prioritizer) *proxy {
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
	cri.Intercept(s, cri.PullImage, g.Interceptor(prio))
	return &proxy{client: runtimeapi.NewImageServiceClient(serveCRI(t, dir, s))}
}

// serveCRI serves s on dir's cri.sock until the test ends (its clean-up shuts s down and checks
// that Serve returned no error) and returns a client connection to it.
func serveCRI(t testing.TB, dir string, s *cri.Server) *grpc.ClientConn {
	t.Helper()
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
	return conn
}

// seedEnv names the environment variable that replays a randomised test with a given seed.
const seedEnv = "PODGATE_TEST_SEED"

// seededT is a test whose workload is drawn from a seed: every failure it reports names the
// seed, so that the failing workload can be replayed with seedEnv.
type seededT struct {
	*testing.T
	seed uint64
}

// newSeededT takes the seed from seedEnv when it is set, else from the clock, and logs it.
func newSeededT(t *testing.T) seededT {
	t.Helper()
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv(seedEnv); v != "" {
		var err error
		if seed, err = strconv.ParseUint(v, 10, 64); err != nil {
			t.Fatalf("%s=%q: %v", seedEnv, v, err)
		}
	}
	t.Logf("seed %d; replay with %s=%d", seed, seedEnv, seed)
	return seededT{T: t, seed: seed}
}

// rand returns the seed's random stream number stream: one per goroutine that draws.
func (t seededT) rand(stream uint64) *rand.Rand { return rand.New(rand.NewPCG(t.seed, stream)) }

func (t seededT) replay() string { return fmt.Sprintf("[%s=%d]", seedEnv, t.seed) }

// Errorf reports a failure that names the seed.
func (t seededT) Errorf(format string, args ...any) {
	t.Helper()
	t.T.Errorf("%s "+format, append([]any{t.replay()}, args...)...)
}

// Fatalf reports a failure that names the seed, and stops the test.
func (t seededT) Fatalf(format string, args ...any) {
	t.Helper()
	t.T.Fatalf("%s "+format, append([]any{t.replay()}, args...)...)
}

// Error reports a failure that names the seed.
func (t seededT) Error(args ...any) {
	t.Helper()
	t.T.Error(append([]any{t.replay()}, args...)...)
}

// Fatal reports a failure that names the seed, and stops the test.
func (t seededT) Fatal(args ...any) {
	t.Helper()
	t.T.Fatal(append([]any{t.replay()}, args...)...)
}

// governorEvents counts the governor's trace events ("queued", "joined", "left", "started",
// "done") as the test reads them.
type governorEvents struct {
	ch     chan string
	counts map[string]int
}

// traceEvents follows g's trace. The channel holds every event of a test: the governor sends
// under its lock and must never block.
func traceEvents(g *imagepull.Governor) *governorEvents {
	e := &governorEvents{ch: make(chan string, 1<<14), counts: map[string]int{}}
	imagepull.SetTrace(g, func(event, _ string) { e.ch <- event })
	return e
}

// await reads events until cond holds of the counts; what says what the test waits for.
func (e *governorEvents) await(t testing.TB, what string, cond func(counts map[string]int) bool) {
	t.Helper()
	timeout := time.After(awaitTimeout)
	for !cond(e.counts) {
		select {
		case event := <-e.ch:
			e.counts[event]++
		case <-timeout:
			t.Fatalf("waiting for %s: governor events so far %v", what, e.counts)
		}
	}
}

// drain reads the events already sent.
func (e *governorEvents) drain() {
	for {
		select {
		case event := <-e.ch:
			e.counts[event]++
		default:
			return
		}
	}
}

// caller is one PullImage call of a load test.
type caller struct {
	req *runtimeapi.PullImageRequest
	key pullKey
	// giveUp: the caller cancels its call before the pull is done. Set when the workload is
	// drawn, and for the callers of one running pull once the wave has arrived.
	giveUp bool
}

// randomCallers draws n callers from a small space of pull keys, so that many share one:
// 4 repositories (Docker Hub's in three spellings) × 3 images × 2 tags × 3 credentials
// (none, two users) × 2 runtime handlers; random priorities; one in five gives up.
func randomCallers(t testing.TB, rng *rand.Rand, wave, n int) []caller {
	t.Helper()
	repos := [][]string{
		{"img%d:v%d", "docker.io/library/img%d:v%d", "index.docker.io/library/img%d:v%d"},
		{"quay.io/org/img%d:v%d"},
		{"registry.k8s.io/img%d:v%d"},
		{"127.0.0.1:5000/team/img%d:v%d"},
	}
	classes := []string{"", imagepull.ClusterCriticalClass, imagepull.NodeCriticalClass}
	callers := make([]caller, n)
	for i := range callers {
		spellings := repos[rng.IntN(len(repos))]
		req := &runtimeapi.PullImageRequest{
			Image: &runtimeapi.ImageSpec{Image: fmt.Sprintf(spellings[rng.IntN(len(spellings))], rng.IntN(3), rng.IntN(2))},
			SandboxConfig: &runtimeapi.PodSandboxConfig{
				Metadata: &runtimeapi.PodSandboxMetadata{Namespace: "kube-system", Name: fmt.Sprintf("pod%d-%d", wave, i), Uid: fmt.Sprintf("uid%d-%d", wave, i)},
				Labels:   map[string]string{"podgate.dev/priority-class": classes[rng.IntN(len(classes))]},
			},
		}
		if user := rng.IntN(3); user > 0 {
			req.Auth = &runtimeapi.AuthConfig{Username: fmt.Sprint("user", user), Password: "pw"}
		}
		if rng.IntN(2) == 1 {
			req.Image.RuntimeHandler = "kata"
		}
		key, _, err := keyOf(req)
		if err != nil {
			t.Fatalf("workload image %s: %v", req.GetImage().GetImage(), err)
		}
		callers[i] = caller{req: req, key: key, giveUp: rng.IntN(5) == 0}
	}
	return callers
}

// pullKeys returns the pull keys of callers, each true when one of its callers stays and
// false when all give up.
func pullKeys(callers []caller) map[pullKey]bool {
	stays := map[pullKey]bool{}
	for _, c := range callers {
		stays[c.key] = stays[c.key] || !c.giveUp
	}
	return stays
}

// expectedCalls is the backend calls a wave of callers must cause: one per pull key, except for
// a key whose callers all gave up while its pull was still queued (not in started), which must
// never reach the backend.
func expectedCalls(callers []caller, started map[pullKey]int) map[pullKey]int {
	want := map[pullKey]int{}
	for key, stays := range pullKeys(callers) {
		if stays || started[key] > 0 {
			want[key] = 1
		}
	}
	return want
}

// loadTest is the proxy, governor and backend of a load test.
type loadTest struct {
	t       seededT
	rng     *rand.Rand // the workload's
	p       *proxy
	g       *imagepull.Governor
	backend *loadBackend
	events  *governorEvents
}

// TestCapsUnderLoad sends waves of 200 concurrent random pulls (images in several spellings,
// registries, credentials, runtime handlers, priorities; some callers give up) through the
// proxy: the backend never serves more than the caps at once, every caller that stayed gets
// the result of a pull of its own image with its own credentials and runtime handler, and the
// backend receives exactly the calls de-duplication leaves.
//
// The count is exact because the test, not timing, decides what overlaps. While a wave's
// callers arrive the backend holds every call, so no pull can finish: the governor must make
// exactly one flight per distinct key (normalised image, runtime handler, credentials), and
// the test checks its queue holds exactly that. Callers give up only once all have arrived and
// the backend has received every pull the governor started: first the callers of queued pulls
// (leaving the queue frees no slot, so nothing starts meanwhile), then those of running pulls.
// So a key reaches the backend exactly once unless all its callers gave up while its pull was
// queued, and then never; a shared pull whose callers partly gave up goes on for the others.
// A second wave repeats images of the first after it finished: the governor shares only
// concurrent pulls, so they reach the backend again.
func TestCapsUnderLoad(t *testing.T) {
	st := newSeededT(t)
	const (
		waves       = 2
		callers     = 200
		maxParallel = 4
	)
	perRegistry := map[string]int{"docker.io": 2, "quay.io": 1}
	backend := newLoadBackend(st.rand(1), time.Millisecond, 4*time.Millisecond)
	g := imagepull.New(imagepull.Limits{MaxParallel: maxParallel, PerRegistry: perRegistry})
	events := traceEvents(g)
	sp := imagepull.SandboxPriority{Label: "podgate.dev/priority-class", Namespaces: []string{"kube-system"}}
	p := startProxy(st, backend, g, func(_ context.Context, req *runtimeapi.PullImageRequest) imagepull.Priority {
		return sp.Of(req.GetSandboxConfig())
	})
	lt := &loadTest{t: st, rng: st.rand(0), p: p, g: g, backend: backend, events: events}
	for wave := range waves {
		lt.wave(wave, randomCallers(st, lt.rng, wave, callers))
	}

	maxNode, regMax := backend.maxima()
	st.Logf("at most %d pulls outstanding at the backend at once, per registry %v", maxNode, regMax)
	if maxNode > maxParallel {
		st.Errorf("podgate had %d pulls outstanding at the backend at once, cap %d", maxNode, maxParallel)
	} else if maxNode < maxParallel {
		st.Errorf("podgate had at most %d pulls outstanding at once: the load never reached the cap %d, the test proves nothing", maxNode, maxParallel)
	}
	for reg, limit := range perRegistry {
		if m := regMax[reg]; m > limit {
			st.Errorf("podgate had %d pulls from %s outstanding at once, cap %d", m, reg, limit)
		}
	}
}

// wave runs one wave of callers to its end (see TestCapsUnderLoad) and checks the backend
// calls it caused.
func (lt *loadTest) wave(wave int, callers []caller) {
	t := lt.t
	release := lt.backend.hold()
	defer release() // also when the wave fails half-way
	cancels := make([]context.CancelFunc, len(callers))
	errs := make(chan error, len(callers))
	var wg sync.WaitGroup
	for i, c := range callers {
		ctx, cancel := context.WithCancel(t.Context())
		cancels[i] = cancel
		defer cancel()
		wg.Go(func() { errs <- lt.pull(ctx, c) })
	}

	started := lt.arrive(wave, callers)
	lt.abandonOneRunning(callers, started)
	// The callers of queued pulls give up first: no slot frees, nothing starts meanwhile, so
	// a queued pull all of whose callers leave never reaches the backend.
	lt.giveUp(callers, cancels, func(c caller) bool { return started[c.key] == 0 })
	// Then those of running pulls, which the backend has already received.
	lt.giveUp(callers, cancels, func(c caller) bool { return started[c.key] > 0 })
	release()
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("wave %d: %v", wave, err)
		}
	}
	lt.finish(wave)

	got, want := lt.backend.takeCalls(), expectedCalls(callers, started)
	keys := pullKeys(callers)
	abandoned, abandonedRunning := 0, 0
	for key, stays := range keys {
		if !stays {
			abandoned++
			if started[key] > 0 {
				abandonedRunning++
			}
		}
	}
	t.Logf("wave %d: %d callers (%d gave up) sharing %d pull keys; %d pulls abandoned by all their callers, %d of them running; the backend got %d calls",
		wave, len(callers), countGiveUps(callers), len(keys), abandoned, abandonedRunning, total(got))
	if diff := cmp.Diff(want, got, cmp.AllowUnexported(pullKey{})); diff != "" {
		t.Errorf("wave %d: backend calls per pull key (-want +got):\n%s", wave, diff)
	}
}

// pull makes c's call and checks its outcome: a caller who gave up (cancelled ctx) gets
// Canceled, any other the result of a pull of its own key.
func (lt *loadTest) pull(ctx context.Context, c caller) error {
	resp, err := lt.p.client.PullImage(ctx, c.req)
	switch {
	case ctx.Err() != nil && err == nil:
		return fmt.Errorf("pull %s gave up, got %v; want Canceled", c.req.GetImage().GetImage(), resp)
	case ctx.Err() != nil:
		if status.Code(err) != codes.Canceled {
			return fmt.Errorf("pull %s gave up: %w; want Canceled", c.req.GetImage().GetImage(), err)
		}
	case err != nil:
		return fmt.Errorf("pull %s: %w", c.req.GetImage().GetImage(), err)
	case resp.GetImageRef() != c.key.imageRef():
		return fmt.Errorf("pull %s: got %s, want %s", c.req.GetImage().GetImage(), resp.GetImageRef(), c.key.imageRef())
	}
	return nil
}

// arrive waits until every caller of the wave has joined the governor and the backend has
// received every pull the governor started, then returns the calls received so far: the pulls
// running while the others wait. Nothing changes meanwhile, since the backend holds every call.
func (lt *loadTest) arrive(wave int, callers []caller) map[pullKey]int {
	t := lt.t
	t.Helper()
	lt.events.await(t, fmt.Sprintf("the %d callers of wave %d to arrive", len(callers), wave), func(c map[string]int) bool {
		return c["queued"]+c["joined"] == len(callers)
	})
	s := lt.g.Stats()
	if keys := len(pullKeys(callers)); s.Queued+s.InFlight != keys || s.Waiters != len(callers) {
		t.Fatalf("wave %d: governor has %d pulls queued and %d running for %d callers; want %d pulls (one per pull key) for %d callers",
			wave, s.Queued, s.InFlight, s.Waiters, keys, len(callers))
	}
	timeout := time.After(awaitTimeout)
	for range s.InFlight {
		select {
		case <-lt.backend.received:
		case <-timeout:
			t.Fatalf("wave %d: the governor started %d pulls, the backend did not receive them all", wave, s.InFlight)
		}
	}
	started := lt.backend.callsSoFar()
	if total(started) != s.InFlight {
		t.Fatalf("wave %d: the backend holds %v, want the %d pulls the governor started", wave, started, s.InFlight)
	}
	return started
}

// abandonOneRunning makes every caller of one running pull, drawn at random, give up, so that
// each wave has the backend cancel a running pull that no caller waits for any more.
func (lt *loadTest) abandonOneRunning(callers []caller, started map[pullKey]int) {
	lt.t.Helper()
	if len(started) == 0 {
		lt.t.Fatal("the governor started no pull")
	}
	keys := slices.SortedFunc(maps.Keys(started), func(a, b pullKey) int {
		return strings.Compare(a.image+" "+a.handler+" "+a.auth, b.image+" "+b.handler+" "+b.auth)
	})
	key := keys[lt.rng.IntN(len(keys))]
	for i := range callers {
		if callers[i].key == key {
			callers[i].giveUp = true
		}
	}
}

// giveUp cancels the calls of the callers who give up and match, and waits until they have
// left the governor.
func (lt *loadTest) giveUp(callers []caller, cancels []context.CancelFunc, match func(caller) bool) {
	lt.t.Helper()
	before, n := lt.events.counts["left"], 0
	for i, c := range callers {
		if c.giveUp && match(c) {
			cancels[i]()
			n++
		}
	}
	lt.events.await(lt.t, fmt.Sprintf("%d callers to leave", n), func(c map[string]int) bool { return c["left"] == before+n })
}

// finish waits, once every caller has returned, until every pull the governor started has
// returned from the backend, and checks that the governor is left empty; the next wave starts
// from nothing.
func (lt *loadTest) finish(wave int) {
	t := lt.t
	t.Helper()
	// Every "started" was sent before its callers returned (or, for a pull they all left,
	// before they gave up): with the events sent so far read, the counts can only wait for
	// "done".
	lt.events.drain()
	lt.events.await(t, "every started pull to be done", func(c map[string]int) bool { return c["done"] == c["started"] })
	if s := lt.g.Stats(); s != (imagepull.Stats{}) {
		t.Errorf("wave %d: governor state %+v after every caller returned, want empty", wave, s)
	}
	lt.events.counts = map[string]int{}
	for range len(lt.backend.received) {
		<-lt.backend.received
	}
}

func countGiveUps(callers []caller) int {
	n := 0
	for _, c := range callers {
		if c.giveUp {
			n++
		}
	}
	return n
}

func total(calls map[pullKey]int) int {
	n := 0
	for _, c := range calls {
		n += c
	}
	return n
}

// TestInvalidImageReference: a reference containerd would refuse is InvalidArgument, with
// podgate's message, and reaches neither queue nor backend.
func TestInvalidImageReference(t *testing.T) {
	backend := newLoadBackend(nil, 0, 0)
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
	if c := total(backend.takeCalls()); c != 0 {
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
