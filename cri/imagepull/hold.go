package imagepull

// The governor's side of cool-downs (registries that push back) and request budgets
// (imagePulls.perRegistryRate): which queued pull may start, the pull that met a push-back put
// back in the queue, the held pulls given their registry's error when their time is up, and
// the timer that wakes the queue when a cool-down ends or a token comes.

import (
	"net/http"
	"strconv"
	"time"

	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
)

// WithCoolDown holds the pulls of a registry that pushes back, as c says (see [CoolDown]).
// Without it, or with c.RetryFor 0, a push-back fails its pull as any other error does.
func WithCoolDown(c CoolDown) Option {
	return func(g *Governor) {
		if c.On() {
			g.cool = newCoolDowns(c, nil)
		}
	}
}

// withClock gives the governor's cool-downs, budgets and their timer the clock c (tests).
func withClock(c clock.WithDelayedExecution) Option {
	return func(g *Governor) { g.clock, g.now = c, c.Now }
}

// holds is what the governor keeps of cool-downs and budgets; guarded by Governor.mu but for
// the fields set by New.
type holds struct {
	clock clock.WithDelayedExecution
	// cool is nil when cool-downs are off (WithCoolDown).
	cool   *coolDowns
	budget budgets
	hm     *holdMetrics
	// timer wakes the queue at wakeAt, the next moment a held pull may start or give up.
	timer  clock.Timer
	wakeAt time.Time
}

// hold is a flight's part in cool-downs; guarded by Governor.mu.
type hold struct {
	// queuedAt is when the flight was made.
	queuedAt time.Time
	// heldSince starts the flight's hold: the first push-back it met, or, for a pull that
	// started because its hold ran out, when its registry's cool-down began to hold it.
	heldSince time.Time
	// probe numbers this run when it is its registry's probe; 0 when it is not.
	probe uint64
	// pushBacks counts the push-backs it met; lastErr is the last one's error, what its callers
	// get when their time is up.
	pushBacks int
	lastErr   error
}

// initHolds completes New: the budgets, on the governor's clock.
func (g *Governor) initHolds() {
	if g.clock == nil {
		g.clock = clock.RealClock{}
	}
	g.budget = newBudgets(g.limits.PerRegistryRate, g.now())
}

// holding tells whether anything but the caps may hold a pull now: a registry cools down, or
// has a budget. g.mu is held.
func (g *Governor) holding() bool {
	return g.cool != nil && len(g.cool.reg) > 0 || len(g.budget.buckets) > 0
}

// mayStart tells whether the queued flight f may start now: its registry has a free slot, is
// not cooling down (or f's hold has run out) and has a token. g.mu is held.
func (g *Governor) mayStart(f *flight) bool {
	if !g.registryFree(f.registry) {
		return false
	}
	if !g.holding() {
		return true
	}
	now := g.now()
	if g.cool != nil && !g.cool.mayStart(f.registry, g.holdOver(f, now), now) {
		return false
	}
	return g.budget.mayStart(f.registry, now)
}

// holdStart is when f's hold by its registry's cool-down began; zero when the registry is not
// cooling and f met no push-back. g.mu is held.
func (g *Governor) holdStart(f *flight) time.Time {
	if !f.heldSince.IsZero() {
		return f.heldSince
	}
	if s := g.cool.state(f.registry); s != nil {
		return laterOf(f.queuedAt, s.since)
	}
	return time.Time{}
}

// holdOver tells whether f, which never met a push-back, has been held by its registry's
// cool-down for RetryFor: it may then try the registry (one pull at a time still), and the
// registry's answer, whatever it is, goes to its callers. g.mu is held.
func (g *Governor) holdOver(f *flight, now time.Time) bool {
	start := g.holdStart(f)
	return f.lastErr == nil && !start.IsZero() && !now.Before(start.Add(g.cool.RetryFor))
}

// startHold records f's start at f.started with its registry's budget and cool-down. g.mu is
// held.
func (g *Governor) startHold(f *flight) {
	g.budget.take(f.registry, f.started)
	if g.cool == nil {
		return
	}
	if s := g.cool.state(f.registry); s != nil && f.heldSince.IsZero() && f.started.Before(s.until) {
		f.heldSince = g.holdStart(f) // it goes because its hold ran out: no retry after this try
	}
	f.probe = g.cool.started(f.registry, f.started)
	if f.pushBacks > 0 {
		g.hm.retries.WithLabelValues(g.registryLabel(f.registry)).Inc()
	}
}

// requeue tells the cool-down how f's backend call ended (err), and puts f back in the queue,
// and among the flights new callers join, when its registry pushed back and f may wait for its
// next try: the cool-down ends before f's hold does. It reports whether it did. run has freed
// f's slots, recorded its call's duration and taken it out of the flights. g.mu is held.
func (g *Governor) requeue(f *flight, err error) bool {
	if g.cool == nil {
		return false
	}
	now := g.now()
	probe := f.probe
	f.probe = 0
	pb, pushed := pushBackOf(err)
	switch {
	case f.abandoned:
		g.cool.abandoned(f.registry, probe)
		return false
	case !pushed || f.stall != nil:
		g.cool.answered(f.registry, f.started, probe)
		return false
	}
	until := g.cool.pushedBack(f.registry, f.started, now, pb, probe)
	label := g.registryLabel(f.registry)
	g.hm.pushBacks.WithLabelValues(label, strconv.Itoa(pb.code)).Inc()
	f.pushBacks++
	if f.heldSince.IsZero() {
		f.heldSince = now
	}
	logger := klog.FromContext(f.ctx).WithValues("image", f.image, "registry", f.registry, "status", pb.code,
		"retryAfter", pb.retryAfter, "pushBacks", f.pushBacks, "coolDownUntil", until)
	if giveUp := f.heldSince.Add(g.cool.RetryFor); !until.Before(giveUp) {
		g.hm.gaveUp.WithLabelValues(label).Inc()
		logger.Info("Image pull pushed back by its registry; its callers get the registry's error", "heldSince", f.heldSince,
			"retryFor", g.cool.RetryFor)
		return false
	}
	f.lastErr, f.started = err, time.Time{}
	g.seq++
	f.seq = g.seq // behind the registry's other waiting pulls: the next try is another's
	g.queue.push(f)
	g.flights[f.key] = f // neither abandoned nor stalled: run took it out, and nothing since
	g.metrics.queueLength.Set(float64(g.queue.len))
	logger.Info("Image pull pushed back by its registry; it waits for the registry's cool-down", "waiters", f.waiters,
		"giveUpAt", f.heldSince.Add(g.cool.RetryFor))
	g.traceEvent("pushed back", f)
	return true
}

// expire gives the callers of each queued flight whose hold has run out the registry's last
// push-back error, unchanged. g.mu is held.
func (g *Governor) expire(now time.Time) {
	if g.cool == nil || g.queue.len == 0 {
		return
	}
	var over []*flight
	for f := range g.queue.all() {
		// A pull whose registry answered another meanwhile waits for its slot as any other.
		if f.lastErr != nil && !now.Before(f.heldSince.Add(g.cool.RetryFor)) && g.cool.state(f.registry).cooling(now) {
			over = append(over, f)
		}
	}
	for _, f := range over {
		g.queue.remove(f)
		if g.flights[f.key] == f {
			delete(g.flights, f.key)
		}
		g.hm.gaveUp.WithLabelValues(g.registryLabel(f.registry)).Inc()
		klog.FromContext(f.ctx).Info("Image pull held for its registry's cool-down too long; its callers get the registry's error",
			"image", f.image, "registry", f.registry, "heldSince", f.heldSince, "retryFor", g.cool.RetryFor, "pushBacks", f.pushBacks)
		// Its callers waited until now: for them the pull starts and ends with its error.
		f.err, f.started = f.lastErr, now
		f.cancel(nil)
		close(f.done)
		g.traceEvent("done", f)
	}
	if len(over) > 0 {
		g.metrics.queueLength.Set(float64(g.queue.len))
	}
	g.cool.forget(now)
}

// arm sets the governor's timer to the next moment a queued pull may start, or must give up,
// without a pull ending: a cool-down ends, a hold runs out, a token comes. g.mu is held.
func (g *Governor) arm(now time.Time) {
	if !g.holding() {
		return
	}
	var next time.Time
	for f := range g.queue.all() {
		if g.registryFree(f.registry) { // else the end of a pull of its registry wakes it
			next = earliest(next, g.wakeOf(f, now))
		}
	}
	if next.Equal(g.wakeAt) {
		return
	}
	if g.timer != nil {
		g.timer.Stop()
		g.timer = nil
	}
	g.wakeAt = next
	if next.IsZero() {
		return
	}
	// A fake clock calls its timers' functions with its own lock held: the queue is woken
	// from a goroutine of its own.
	g.timer = g.clock.AfterFunc(next.Sub(now), func() { go g.wake() })
}

// wakeOf is the next moment after now at which f may start or give up by itself; zero when it
// waits only for a pull to end. g.mu is held.
func (g *Governor) wakeOf(f *flight, now time.Time) time.Time {
	next := g.budget.next(f.registry, now)
	if g.cool == nil || g.cool.state(f.registry) == nil {
		return next
	}
	next = earliest(next, g.cool.wake(f.registry, now))
	if start := g.holdStart(f); !start.IsZero() {
		next = earliest(next, afterOrZero(start.Add(g.cool.RetryFor), now))
	}
	return next
}

// wake dispatches the queue when the timer fires.
func (g *Governor) wake() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.wakeAt = time.Time{}
	g.timer = nil
	g.dispatch()
}

// held describes what holds the queued flight f besides the caps, into s. g.mu is held.
func (g *Governor) held(f *flight, s *PullStatus) {
	if !g.holding() || f.elem == nil {
		return
	}
	now := g.now()
	s.PushBacks = f.pushBacks
	if g.cool != nil {
		if st := g.cool.state(f.registry); st.cooling(now) {
			s.Waiting, s.CoolingSince, s.PushBackCode = WaitingCoolDown, st.since, st.code
			s.Probing = !st.probe.IsZero()
			if !s.Probing {
				s.NextTry = st.until
			}
			if start := g.holdStart(f); !start.IsZero() {
				s.HeldUntil = start.Add(g.cool.RetryFor)
			}
			return
		}
	}
	if g.registryFree(f.registry) && !g.budget.mayStart(f.registry, now) {
		s.Waiting, s.NextTry = WaitingRate, g.budget.next(f.registry, now)
		s.Rate = g.budget.rates[f.registry]
	}
}

// Why a pull waits, besides the caps.
const (
	// WaitingCoolDown: the pull's registry pushed back and cools down (imagePulls.coolDown).
	WaitingCoolDown Waiting = "cool-down"
	// WaitingRate: the request budget of the pull's registry is spent
	// (imagePulls.perRegistryRate).
	WaitingRate Waiting = "rate"
)

// CoolDownStatus is what holds a queued pull besides the caps: its registry's cool-down
// (Waiting WaitingCoolDown) or request budget (WaitingRate).
type CoolDownStatus struct {
	// CoolingSince is the first push-back of the registry's cool-down, PushBackCode its last
	// push-back's HTTP status (429, 503).
	CoolingSince time.Time
	PushBackCode int
	// NextTry is when the registry is tried again (by this pull or another), or when its
	// budget next has a token; zero while a probe runs (Probing).
	NextTry time.Time
	Probing bool
	// PushBacks counts the push-backs this pull met; HeldUntil is when its callers get the
	// registry's own error if it still refuses.
	PushBacks int
	HeldUntil time.Time
	// Rate is the registry's budget (WaitingRate).
	Rate Rate
}

// pushBackStatus is the text of an HTTP status a registry pushes back with.
func pushBackStatus(code int) string { return strconv.Itoa(code) + " " + http.StatusText(code) }
