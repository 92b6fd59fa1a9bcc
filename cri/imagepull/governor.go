package imagepull

import (
	"container/list"
	"context"
	"errors"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/klog/v2"
)

// ErrPodDeleted is the cause given to a waiting pull whose pod was deleted.
var ErrPodDeleted = errors.New("pod deleted")

// PullFunc makes the backend call of a pull.
type PullFunc func(ctx context.Context) (*runtimeapi.PullImageResponse, error)

// Limits are the governor's caps.
type Limits struct {
	// MaxParallel caps the backend calls podgate has outstanding on the node; 0 means
	// unlimited. A pull holds its slot from the moment podgate starts its backend call until
	// that call has returned to podgate, whatever its callers do meanwhile: a pull whose
	// callers all left keeps its slot until its cancelled call returns. A cancelled gRPC call
	// returns once podgate has sent the cancellation, so the runtime may still be winding the
	// pull down when the next one starts; podgate cannot see the runtime's own work.
	MaxParallel int
	// PerRegistry caps the same outstanding calls per registry host (normalised with
	// [RegistryHost]); a registry not listed is limited only by MaxParallel.
	PerRegistry map[string]int
}

// Option configures a Governor.
type Option func(*Governor)

// WithRegisterer registers the governor's metrics (podgate_image_pull_*) with reg.
func WithRegisterer(reg prometheus.Registerer) Option {
	return func(g *Governor) { g.metrics = newMetrics(reg) }
}

// Governor holds PullImage calls until they may start; see the package documentation.
type Governor struct {
	limits  Limits
	metrics *metrics
	now     func() time.Time
	// trace, when set (by tests), is told of queue events under g.mu: "queued", "joined",
	// "left", "started", "done", with the flight's image. It must not block.
	trace func(event, image string)

	mu          sync.Mutex
	inFlight    int
	regInFlight map[string]int
	// labelInFlight is regInFlight by metric label (registryLabel).
	labelInFlight map[string]int
	queue         queue
	flights       map[flightKey]*flight
	pods          map[string]map[*waiter]struct{}
	seq           uint64
}

// flight is one backend pull and the callers waiting for it. Fields below mu are guarded by
// the governor's mutex; resp and err are written once, before done is closed.
type flight struct {
	key      flightKey
	image    string
	registry string
	fn       PullFunc
	ctx      context.Context // the backend call's: detached from every single caller
	cancel   context.CancelCauseFunc
	done     chan struct{}
	resp     *runtimeapi.PullImageResponse
	err      error

	// guarded by Governor.mu
	prio      Priority
	seq       uint64
	elem      *list.Element // set while queued
	started   time.Time     // zero until started
	waiters   int
	abandoned bool // every waiter left
}

// waiter is one caller of Do.
type waiter struct {
	cancel  context.CancelCauseFunc
	arrived time.Time
	flight  *flight // set under Governor.mu when the caller joins
}

// New creates a governor with the given caps.
func New(limits Limits, opts ...Option) *Governor {
	g := &Governor{
		limits:        Limits{MaxParallel: limits.MaxParallel, PerRegistry: maps.Clone(limits.PerRegistry)},
		now:           time.Now,
		regInFlight:   map[string]int{},
		labelInFlight: map[string]int{},
		queue:         newQueue(),
		flights:       map[flightKey]*flight{},
		pods:          map[string]map[*waiter]struct{}{},
	}
	for _, o := range opts {
		o(g)
	}
	if g.metrics == nil {
		g.metrics = newMetrics(nil)
	}
	return g
}

// Do runs fn for p when the caps and the queue allow, or joins a pull of the same image,
// credentials and runtime handler that is already waiting or running, and returns its result.
// It returns early, with an error that is context.Canceled (or context.DeadlineExceeded) when
// ctx ends and errdefs.ErrAborted when p's pod is deleted; the backend call is cancelled only
// when no caller waits for it any more, and keeps its slot until it has returned.
func (g *Governor) Do(ctx context.Context, p Pull, fn PullFunc) (*runtimeapi.PullImageResponse, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	arrived := g.now()
	w := &waiter{cancel: cancel, arrived: arrived}

	g.mu.Lock()
	g.addWaiter(p.PodUID, w)
	f, leader := g.join(ctx, p, fn)
	w.flight = f
	g.mu.Unlock()
	defer g.removeWaiter(p.PodUID, w)

	select {
	case <-f.done:
	case <-ctx.Done():
		select {
		case <-f.done: // finished at the same moment: the result wins
		default:
			return nil, g.leave(ctx, f, p, arrived)
		}
	}
	// A caller that joined a pull already running waited for nothing.
	g.metrics.wait.Observe(max(0, f.started.Sub(arrived).Seconds()))
	if f.err != nil {
		return nil, f.err
	}
	if leader {
		// The leader's response is the backend's own: the proxy forwards its bytes as they were.
		return f.resp, nil
	}
	return proto.CloneOf(f.resp), nil
}

// join adds a caller to the flight of p's key, or makes a new flight and queues it. It reports
// whether the caller leads the flight (its fn makes the backend call). g.mu is held.
func (g *Governor) join(ctx context.Context, p Pull, fn PullFunc) (*flight, bool) {
	logger := klog.FromContext(ctx).WithValues("image", p.Image, "pod", p.Pod, "priority", p.Priority)
	if f := g.flights[p.key]; f != nil {
		f.waiters++
		g.metrics.deduplicated.Inc()
		if f.elem != nil && p.Priority > f.prio {
			g.queue.raise(f, p.Priority)
		}
		logger.V(2).Info("Image pull joins a pull of the same image", "started", !f.started.IsZero())
		g.traceEvent("joined", f)
		return f, false
	}
	// The backend call must outlive the caller that starts it when others join; it keeps the
	// caller's values (metadata, logger) but not its cancellation.
	fctx, fcancel := context.WithCancelCause(context.WithoutCancel(ctx))
	g.seq++
	f := &flight{
		key: p.key, image: p.Image, registry: p.Registry, fn: fn,
		ctx: fctx, cancel: fcancel, done: make(chan struct{}),
		prio: p.Priority, seq: g.seq, waiters: 1,
	}
	g.flights[p.key] = f
	g.queue.push(f)
	g.traceEvent("queued", f)
	g.dispatch()
	if f.started.IsZero() {
		logger.Info("Image pull waits", "position", g.queue.position(f), "queued", g.queue.len,
			"inFlight", g.inFlight, "registry", p.Registry, "registryInFlight", g.regInFlight[p.Registry])
	}
	g.metrics.queueLength.Set(float64(g.queue.len))
	return f, true
}

// leave removes a caller whose context ended from its flight and returns the caller's status.
// A flight nobody waits for any more leaves the queue, or is cancelled at the backend.
func (g *Governor) leave(ctx context.Context, f *flight, p Pull, arrived time.Time) error {
	cause := context.Cause(ctx)
	reason := reasonCaller
	if errors.Is(cause, ErrPodDeleted) {
		reason = reasonPodDeleted
	}
	g.metrics.cancelled.WithLabelValues(reason).Inc()
	logger := klog.FromContext(ctx).WithValues("image", p.Image, "pod", p.Pod)

	g.mu.Lock()
	started := f.started
	f.waiters--
	if f.waiters == 0 {
		f.abandoned = true
		if g.flights[f.key] == f {
			delete(g.flights, f.key) // a new caller starts afresh rather than join a dying pull
		}
		if f.elem != nil {
			g.queue.remove(f)
			g.metrics.queueLength.Set(float64(g.queue.len))
		}
		f.cancel(cause) // queued: its fn never runs; running: the backend call ends
	}
	shared := f.waiters > 0
	g.traceEvent("left", f)
	g.mu.Unlock()

	if started.IsZero() {
		g.metrics.wait.Observe(g.now().Sub(arrived).Seconds())
	}
	logger.Info("Image pull abandoned", "reason", reason, "cause", cause.Error(),
		"started", !started.IsZero(), "sharedWithOthers", shared)
	switch {
	case reason == reasonPodDeleted:
		return errorf(errdefs.ErrAborted, "pull of %s abandoned: pod %s was deleted", p.Image, p.Pod)
	case errors.Is(cause, context.DeadlineExceeded):
		return errorf(context.DeadlineExceeded, "pull of %s: caller's deadline passed", p.Image)
	default:
		return errorf(context.Canceled, "pull of %s: cancelled by the caller: %v", p.Image, cause)
	}
}

// dispatch starts queued flights while the caps allow, in queue order; a flight whose registry
// is full is passed over. g.mu is held.
func (g *Governor) dispatch() {
	for g.limits.MaxParallel == 0 || g.inFlight < g.limits.MaxParallel {
		f := g.queue.first(g.registryFree)
		if f == nil {
			return
		}
		g.start(f)
	}
}

func (g *Governor) registryFree(registry string) bool {
	limit, ok := g.limits.PerRegistry[registry]
	return !ok || g.regInFlight[registry] < limit
}

// registryLabel is the registry's metric label: its host when it has a cap of its own, "other"
// for the rest, whose names come from pod specs and must not grow the label set.
func (g *Governor) registryLabel(registry string) string {
	if _, ok := g.limits.PerRegistry[registry]; ok {
		return registry
	}
	return otherRegistries
}

// otherRegistries labels the registries without a cap of their own.
const otherRegistries = "other"

func (g *Governor) setRegistryGauge(registry string) {
	label := g.registryLabel(registry)
	g.metrics.registryInFlight.WithLabelValues(label).Set(float64(g.labelInFlight[label]))
}

// start takes f's slots and runs its backend call. g.mu is held.
func (g *Governor) start(f *flight) {
	g.queue.remove(f)
	g.inFlight++
	g.regInFlight[f.registry]++
	g.labelInFlight[g.registryLabel(f.registry)]++
	f.started = g.now()
	g.metrics.queueLength.Set(float64(g.queue.len))
	g.metrics.inFlight.Set(float64(g.inFlight))
	g.setRegistryGauge(f.registry)
	klog.FromContext(f.ctx).Info("Image pull started", "image", f.image, "priority", f.prio,
		"waiters", f.waiters, "inFlight", g.inFlight, "registry", f.registry)
	g.traceEvent("started", f)
	go g.run(f)
}

// run makes f's backend call, then frees its slots and starts what may start next.
func (g *Governor) run(f *flight) {
	resp, err := f.fn(f.ctx)
	// Only now, with the call back from the backend, is the slot free: the callers may have
	// left long ago, but until fn returns podgate still has the call outstanding.
	g.mu.Lock()
	defer g.mu.Unlock()
	g.inFlight--
	if g.regInFlight[f.registry]--; g.regInFlight[f.registry] == 0 {
		delete(g.regInFlight, f.registry) // registries come from pods: keep only the busy ones
	}
	g.labelInFlight[g.registryLabel(f.registry)]--
	g.metrics.inFlight.Set(float64(g.inFlight))
	g.setRegistryGauge(f.registry)
	if g.flights[f.key] == f {
		delete(g.flights, f.key)
	}
	result := resultSuccess
	switch {
	case f.abandoned:
		result = resultCanceled
	case err != nil:
		result = resultError
	}
	g.metrics.duration.WithLabelValues(result).Observe(g.now().Sub(f.started).Seconds())
	f.resp, f.err = resp, err
	f.cancel(nil)
	close(f.done)
	g.traceEvent("done", f)
	g.dispatch()
}

func (g *Governor) traceEvent(event string, f *flight) {
	if g.trace != nil {
		g.trace(event, f.image)
	}
}

// PodDeleted makes the waiting pulls of the pod with this UID leave with errdefs.ErrAborted.
// Call it when the API server reports the pod deleted.
func (g *Governor) PodDeleted(uid string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for w := range g.pods[uid] {
		w.cancel(ErrPodDeleted)
	}
}

func (g *Governor) addWaiter(uid string, w *waiter) {
	if uid == "" {
		return
	}
	ws := g.pods[uid]
	if ws == nil {
		ws = map[*waiter]struct{}{}
		g.pods[uid] = ws
	}
	ws[w] = struct{}{}
}

func (g *Governor) removeWaiter(uid string, w *waiter) {
	if uid == "" {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.pods[uid], w)
	if len(g.pods[uid]) == 0 {
		delete(g.pods, uid)
	}
}

// PodPull is one pull a pod's caller waits for.
type PodPull struct {
	Image string
	// Started: the backend pull runs; otherwise it waits in the queue.
	Started bool
	// Since is when the caller asked.
	Since time.Time
}

// PodPulls returns the pulls the callers for the pod with this UID wait for, oldest first.
func (g *Governor) PodPulls(uid string) []PodPull {
	g.mu.Lock()
	defer g.mu.Unlock()
	ws := g.pods[uid]
	if len(ws) == 0 {
		return nil
	}
	out := make([]PodPull, 0, len(ws))
	for w := range ws {
		if w.flight == nil {
			continue
		}
		out = append(out, PodPull{Image: w.flight.image, Started: !w.flight.started.IsZero(), Since: w.arrived})
	}
	slices.SortFunc(out, func(a, b PodPull) int {
		if c := a.Since.Compare(b.Since); c != 0 {
			return c
		}
		return strings.Compare(a.Image, b.Image)
	})
	return out
}

// Stats is a snapshot of the governor's state, for tests and debugging.
type Stats struct {
	// Queued counts flights waiting for a slot; InFlight flights running.
	Queued, InFlight int
	// Waiters counts the callers waiting for those flights.
	Waiters int
}

// Stats returns a snapshot of the governor's state.
func (g *Governor) Stats() Stats {
	g.mu.Lock()
	defer g.mu.Unlock()
	s := Stats{Queued: g.queue.len, InFlight: g.inFlight}
	for _, f := range g.flights {
		s.Waiters += f.waiters
	}
	return s
}
