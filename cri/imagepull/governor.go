package imagepull

import (
	"container/list"
	"context"
	"errors"
	"maps"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	oteltrace "go.opentelemetry.io/otel/trace"
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
	// PerRegistryRate is the request budget of registry hosts (normalised as PerRegistry's):
	// their backend calls start at most at this rate, whatever the caps allow.
	PerRegistryRate map[string]Rate
}

// Option configures a Governor.
type Option func(*Governor)

// WithRegisterer registers the governor's metrics (podgate_image_pull_*) with reg.
func WithRegisterer(reg prometheus.Registerer) Option {
	return func(g *Governor) { g.reg = reg }
}

// WithObserver tells o of what happens to callers that the caps and the queue do not show: a
// caller that joins another caller's pull, and one that leaves because its pod was deleted.
func WithObserver(o Observer) Option {
	return func(g *Governor) { g.observer = o }
}

// WithKeep calls keep with the image of a running image pull that every caller left (its pods
// deleted, or the callers gone), before the backend call is cancelled: containerd's CRI drops
// what a failed pull fetched with its lease, and keep can hold it for the retry.
func WithKeep(keep func(image string)) Option {
	return func(g *Governor) { g.keep = keep }
}

// Observer is told of callers' events (see [WithObserver]). It is called without the
// governor's lock held, from the caller's goroutine; it must not block for long.
type Observer interface {
	PullEvent(e Event)
}

// EventKind says what happened to a caller.
type EventKind int

// The events an Observer is told of.
const (
	// EventJoined: the caller shares a pull another caller started (Event.Leader).
	EventJoined EventKind = iota + 1
	// EventPodDeleted: the caller left because its pod was deleted.
	EventPodDeleted
	// EventFinished: the caller got the backend pull's result (Event.Err).
	EventFinished
)

// Event is one caller's event.
type Event struct {
	Kind EventKind
	// Pull is the caller's pull.
	Pull Pull
	// Leader is the pod whose call made the backend pull the caller joined (EventJoined); the
	// zero ref when that call named no pod.
	Leader klog.ObjectRef
	// Started: the backend pull was running at the time.
	Started bool
	// Err is the backend pull's error (EventFinished).
	Err error
}

// Governor holds PullImage calls until they may start; see the package documentation.
type Governor struct {
	limits  Limits
	metrics *metrics
	// reg is WithRegisterer's; New registers the metrics once every option is applied, since a
	// scrape may come from then on and reads what the options set.
	reg      prometheus.Registerer
	observer Observer
	// keep is called before a running pull nobody waits for is cancelled (WithKeep); nil: no.
	keep func(image string)
	now  func() time.Time
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
	// anonymous are the callers whose call names no pod.
	anonymous map[*waiter]struct{}
	seq       uint64
	// holds are the registries' cool-downs and budgets.
	holds
}

// flight is one backend pull and the callers waiting for it. Fields below mu are guarded by
// the governor's mutex; resp and err are written once, before done is closed.
type flight struct {
	key      flightKey
	image    string
	registry string
	fn       flightCall
	ctx      context.Context // the backend call's: detached from every single caller
	cancel   context.CancelCauseFunc
	done     chan struct{}
	// running is closed when the backend call starts.
	running chan struct{}
	resp    any // fn's answer
	err     error
	// pod is the pod of the caller that made the flight.
	pod klog.ObjectRef

	// guarded by Governor.mu
	prio      Priority
	seq       uint64
	elem      *list.Element // set while queued
	started   time.Time     // zero until started
	waiters   int
	abandoned bool // every waiter left
	// stall, once set (Stall), is the error every caller gets: the pull was cancelled for it.
	stall *stallError
	// hold is its part in its registry's cool-down.
	hold
}

// waiter is one caller of Do.
type waiter struct {
	cancel  context.CancelCauseFunc
	arrived time.Time
	pull    Pull
	flight  *flight // set under Governor.mu when the caller joins
	leads   bool    // the caller made the flight
}

// New creates a governor with the given caps.
func New(limits Limits, opts ...Option) *Governor {
	g := &Governor{
		limits:        Limits{MaxParallel: limits.MaxParallel, PerRegistry: maps.Clone(limits.PerRegistry), PerRegistryRate: maps.Clone(limits.PerRegistryRate)},
		now:           time.Now,
		regInFlight:   map[string]int{},
		labelInFlight: map[string]int{},
		queue:         newQueue(),
		flights:       map[flightKey]*flight{},
		pods:          map[string]map[*waiter]struct{}{},
		anonymous:     map[*waiter]struct{}{},
	}
	for _, o := range opts {
		o(g)
	}
	g.initHolds()
	g.metrics, g.hm = newMetrics(g.reg), newHoldMetrics(g.reg, g)
	return g
}

// Do runs fn for p when the caps and the queue allow, or joins a pull of the same image,
// credentials and runtime handler that is already waiting or running, and returns its result.
// It returns early, with an error that is context.Canceled (or context.DeadlineExceeded) when
// ctx ends and errdefs.ErrAborted when p's pod is deleted; the backend call is cancelled only
// when no caller waits for it any more, and keeps its slot until it has returned.
func (g *Governor) Do(ctx context.Context, p Pull, fn PullFunc) (*runtimeapi.PullImageResponse, error) {
	resp, leader, err := g.do(ctx, p, func(ctx context.Context) (any, error) { return fn(ctx) })
	if err != nil {
		return nil, err
	}
	r, _ := resp.(*runtimeapi.PullImageResponse) // an image pull's flight makes only these
	if leader {
		// The leader's response is the backend's own: the proxy forwards its bytes as they were.
		return r, nil
	}
	return proto.CloneOf(r), nil
}

// do runs fn for p, a pull of any kind, as Do describes, and returns fn's answer and whether the
// caller led the flight (its own fn made the call).
func (g *Governor) do(ctx context.Context, p Pull, fn flightCall) (any, bool, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	arrived := g.now()
	w := &waiter{cancel: cancel, arrived: arrived, pull: p}
	// The span of the wait for a slot; a caller that joins a running pull waits for nothing.
	_, wait := spanTracer(ctx).Start(ctx, "image pull: wait for a slot", oteltrace.WithAttributes(
		attribute.String("image", p.Image), attribute.String("registry", p.Registry), attribute.String("pod", p.Pod.String())))
	g.mu.Lock()
	g.addWaiter(p.PodUID, w)
	f, leader := g.join(ctx, p, fn)
	w.flight, w.leads = f, leader
	joined := Event{Kind: EventJoined, Pull: p, Leader: f.pod, Started: !f.started.IsZero()}
	g.mu.Unlock()
	defer g.removeWaiter(p.PodUID, w)
	if !leader && g.observer != nil {
		g.observer.PullEvent(joined)
	}
	wait.SetAttributes(attribute.Bool("shared", !leader))

	select {
	case <-f.running:
	case <-f.done: // left the queue without running: every caller gave up
	case <-ctx.Done():
	}
	wait.End()
	select {
	case <-f.done:
	case <-ctx.Done():
		select {
		case <-f.done: // finished at the same moment: the result wins
		default:
			return nil, false, g.leave(ctx, f, p, arrived)
		}
	}
	// A caller that joined a pull already running waited for nothing.
	g.metrics.wait[p.Kind].Observe(max(0, f.started.Sub(arrived).Seconds()))
	if g.observer != nil {
		g.observer.PullEvent(Event{Kind: EventFinished, Pull: p, Leader: f.pod, Started: true, Err: f.err})
	}
	if f.err != nil {
		return nil, false, f.err
	}
	return f.resp, leader, nil
}

// tracerName names podgate's image pull spans.
const tracerName = "github.com/podgate/podgate/cri/imagepull"

// spanTracer is the tracer of the call's trace: the provider that made the span of the CRI call in
// ctx, a no-op one when tracing is off.
func spanTracer(ctx context.Context) oteltrace.Tracer {
	return oteltrace.SpanFromContext(ctx).TracerProvider().Tracer(tracerName)
}

// join adds a caller to the flight of p's key, or makes a new flight and queues it. It reports
// whether the caller leads the flight (its fn makes the backend call). g.mu is held.
func (g *Governor) join(ctx context.Context, p Pull, fn flightCall) (*flight, bool) {
	logger := klog.FromContext(ctx).WithValues("image", p.Image, "pod", p.Pod, "priority", p.Priority)
	if f := g.flights[p.key]; f != nil {
		f.waiters++
		g.metrics.deduplicated[p.Kind].Inc()
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
		ctx: fctx, cancel: fcancel, done: make(chan struct{}), running: make(chan struct{}),
		prio: p.Priority, seq: g.seq, waiters: 1, pod: p.Pod, hold: hold{queuedAt: g.now()},
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
	g.metrics.cancelled[p.Kind].WithLabelValues(reason).Inc()
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
		if started.IsZero() || g.keep == nil || f.key.kind != KindImage {
			f.cancel(cause) // queued: its fn never runs; running: the backend call ends
		} else {
			defer func() { g.keep(f.image); f.cancel(cause) }() // what it fetched is kept first
		}
	}
	shared := f.waiters > 0
	g.traceEvent("left", f)
	g.mu.Unlock()

	if started.IsZero() {
		g.metrics.wait[p.Kind].Observe(g.now().Sub(arrived).Seconds())
	}
	logger.Info("Image pull abandoned", "reason", reason, "cause", cause.Error(),
		"started", !started.IsZero(), "sharedWithOthers", shared)
	if reason == reasonPodDeleted && g.observer != nil {
		g.observer.PullEvent(Event{Kind: EventPodDeleted, Pull: p, Started: !started.IsZero()})
	}
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
// is full, cools down or has spent its budget is passed over. g.mu is held.
func (g *Governor) dispatch() {
	g.expire(g.now())
	for g.limits.MaxParallel == 0 || g.inFlight < g.limits.MaxParallel {
		f := g.queue.first(g.mayStart)
		if f == nil {
			break
		}
		g.start(f)
	}
	g.arm(g.now())
}

func (g *Governor) registryFree(registry string) bool {
	limit, ok := g.limits.PerRegistry[registry]
	return !ok || g.regInFlight[registry] < limit
}

// RegistryLabel is the label podgate's metrics give registry: the host itself when it has a
// cap or a budget of its own (imagePulls.perRegistry, perRegistryRate), "other" for the rest.
func (g *Governor) RegistryLabel(registry string) string { return g.registryLabel(registry) }

// registryLabel is the registry's metric label: its host when it has a cap of its own, "other"
// for the rest, whose names come from pod specs and must not grow the label set.
func (g *Governor) registryLabel(registry string) string {
	if _, ok := g.limits.PerRegistry[registry]; ok {
		return registry
	}
	if _, ok := g.limits.PerRegistryRate[registry]; ok {
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
	select {
	case <-f.running: // tried again after its registry pushed back
	default:
		close(f.running)
	}
	g.startHold(f)
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
	ctx, span := spanTracer(f.ctx).Start(f.ctx, "image pull", oteltrace.WithAttributes(
		attribute.String("image", f.image), attribute.String("registry", f.registry)))
	resp, err := f.fn(ctx)
	if err != nil {
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
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
	g.metrics.duration[f.key.kind].WithLabelValues(result).Observe(g.now().Sub(f.started).Seconds())
	if err != nil && f.stall != nil {
		err = f.stall // the backend says "cancelled"; the callers learn why
	}
	if g.requeue(f, err) { // its registry pushed back: it waits for the next try
		g.dispatch()
		return
	}
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
		g.anonymous[w] = struct{}{}
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
	g.mu.Lock()
	defer g.mu.Unlock()
	if uid == "" {
		delete(g.anonymous, w)
		return
	}
	delete(g.pods[uid], w)
	if len(g.pods[uid]) == 0 {
		delete(g.pods, uid)
	}
}
