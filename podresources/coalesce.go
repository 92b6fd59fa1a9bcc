package podresources

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"k8s.io/klog/v2"
	v1 "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// Waits of a v1 call for the kubelet's answer.
const (
	// maxKubeletWait bounds how long a v1 call waits for the kubelet's answer (queued behind
	// another call, throttled, retried) when its caller gives it longer or no deadline at all
	// (grpcurl): multus gives its whole List 10 s.
	maxKubeletWait = 10 * time.Second
	// A caller with a deadline is answered Unavailable a tenth of its time before it, between
	// minReplyMargin and maxReplyMargin, so that it reads why rather than its own
	// DeadlineExceeded, even on a busy node.
	minReplyMargin = 250 * time.Millisecond
	maxReplyMargin = time.Second
	// minRetryDelay and maxRetryDelay space the calls after the kubelet failed: doubled at each
	// failure in a row. The kubelet's bucket gains a token every 10 ms, and a restarted kubelet
	// is back within seconds.
	minRetryDelay = 50 * time.Millisecond
	maxRetryDelay = time.Second
)

// errNobodyWaits cancels a call that every v1 call waiting for it has given up on.
var errNobodyWaits = errors.New("every caller gave up")

// flightGroup coalesces the v1 calls that need the same answer of the kubelet (its List, its
// Get of one pod, its GetAllocatableResources) into as few calls to the kubelet as freshness
// allows. The rule: a v1 call is answered only by a kubelet call sent after the v1 call
// arrived. A v1 call joins the group's pending kubelet call for its key — the one not sent yet
// — or makes one; a pending call is sent once the key's call in flight has ended and
// podgate's own token bucket gives it a token, and from then on nobody joins it. So a pod the
// kubelet admitted before a CNI plugin asked is in the answer that plugin gets, and a burst of
// N identical calls costs the kubelet two calls, not N.
type flightGroup[K comparable, T any] struct {
	k      *kubeletClient
	method string
	call   func(ctx context.Context, key K) (T, error)

	mu      sync.Mutex
	pending map[K]*flight[T] // per key, the call not sent yet, which arrivals join
	running map[K]*flight[T] // per key, the call sent to the kubelet
}

// flight is one call to the kubelet and the v1 calls waiting for it.
type flight[T any] struct {
	ctx    context.Context
	cancel context.CancelCauseFunc
	done   chan struct{} // closed once result and err are set

	// Guarded by the group's mu.
	waiters int
	sent    bool
	phase   string // what the call waits for, for a caller that gives up

	result T
	err    error
}

func newFlightGroup[K comparable, T any](k *kubeletClient, method string, call func(context.Context, K) (T, error)) *flightGroup[K, T] {
	return &flightGroup[K, T]{k: k, method: method, call: call, pending: map[K]*flight[T]{}, running: map[K]*flight[T]{}}
}

// do returns the answer of a kubelet call sent after do was called, waiting within ctx's
// deadline less replyMargin and at most the client's maxWait. It tries again after a failure
// that may pass (the kubelet over its rate limit, restarting, slow); another failure, or no
// kubelet socket at all, ends it at once. When the wait ends first, the error is a
// *kubeletWaitError saying what the call was waiting for, or ctx's error if ctx ended.
func (g *flightGroup[K, T]) do(ctx context.Context, key K) (T, error) {
	return g.doUntil(ctx, key, nil)
}

// doUntil is do that also ends at once on a failure for which stop is true.
func (g *flightGroup[K, T]) doUntil(ctx context.Context, key K, stop func(error) bool) (T, error) {
	var zero T
	start := time.Now()
	wctx, cancel := context.WithTimeout(ctx, g.k.waitBudget(ctx))
	defer cancel()
	defer func() { g.k.metrics.kubeletWait.WithLabelValues(g.method).Observe(time.Since(start).Seconds()) }()
	var last error
	attempts, counted := 0, false
	for {
		f, shared := g.join(ctx, key)
		if shared && !counted {
			// Once per v1 call: a caller that tries again after a failure and shares again
			// is still one call that shared.
			g.k.metrics.kubeletCoalesced.WithLabelValues(g.method).Inc()
			counted = true
		}
		select {
		case <-f.done:
			if f.err == nil || !retryable(f.err) || (stop != nil && stop(f.err)) {
				return f.result, f.err
			}
			last = f.err
			attempts++
		case <-wctx.Done():
			phase := g.leave(key, f)
			if ctx.Err() != nil {
				return zero, ctx.Err()
			}
			if last == nil {
				// Its own calls never failed (it waited behind others): why they did.
				_, last = g.k.retryDelay()
			}
			return zero, &kubeletWaitError{
				socket: g.k.socket, method: g.method, waited: time.Since(start), phase: phase, attempts: attempts, last: last,
			}
		}
	}
}

// join returns the pending call for key, made and started if there is none; shared is true
// when the call was there already.
func (g *flightGroup[K, T]) join(ctx context.Context, key K) (f *flight[T], shared bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if f := g.pending[key]; f != nil {
		f.waiters++
		return f, true
	}
	f = &flight[T]{done: make(chan struct{}), waiters: 1}
	// The call outlives the caller that made it (others share it): it takes its logger, not
	// its cancellation.
	f.ctx, f.cancel = context.WithCancelCause(klog.NewContext(g.k.ctx, klog.FromContext(ctx)))
	if !g.k.startFlight() {
		f.err = errKubeletClosed
		close(f.done)
		return f, false
	}
	g.pending[key] = f
	go g.run(key, f, g.running[key])
	return f, false
}

// leave takes a caller that gave up off f; a call nobody waits for any more is dropped if it
// was not sent yet. It returns what f was waiting for.
func (g *flightGroup[K, T]) leave(key K, f *flight[T]) (phase string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	f.waiters--
	if f.waiters == 0 && !f.sent {
		f.cancel(errNobodyWaits)
		if g.pending[key] == f {
			delete(g.pending, key)
		}
	}
	return f.phase
}

func (g *flightGroup[K, T]) run(key K, f *flight[T], prev *flight[T]) {
	defer g.k.wg.Done()
	f.result, f.err = g.fly(key, f, prev)
	g.mu.Lock()
	if g.running[key] == f {
		delete(g.running, key)
	}
	if g.pending[key] == f {
		delete(g.pending, key)
	}
	g.mu.Unlock()
	f.cancel(nil)
	close(f.done)
}

// fly waits for the key's previous call, for the delay after a failure and for a token, then
// sends the call.
func (g *flightGroup[K, T]) fly(key K, f *flight[T], prev *flight[T]) (T, error) {
	var zero T
	k := g.k
	if prev != nil {
		g.setPhase(f, "waiting for the kubelet to answer the previous "+g.method)
		select {
		case <-prev.done:
		case <-f.ctx.Done():
			return zero, context.Cause(f.ctx)
		}
	}
	if d, last := k.retryDelay(); d > 0 {
		g.setPhase(f, fmt.Sprintf("waiting %s before asking again, after: %v", d.Round(time.Millisecond), last))
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-f.ctx.Done():
			t.Stop()
			return zero, context.Cause(f.ctx)
		}
	}
	// No socket, no kubelet: nothing to wait for, and no token to spend.
	if err := k.present(f.ctx, g.method); err != nil {
		return zero, err
	}
	g.setPhase(f, fmt.Sprintf("waiting for podgate's own rate limit on the kubelet's socket (podResources.kubeletQPS %v, podResources.kubeletBurst %d)", k.qps, k.burst))
	start := time.Now()
	release, err := k.throttle(f.ctx)
	if err != nil {
		return zero, err
	}
	defer release()
	k.metrics.kubeletThrottle.Observe(time.Since(start).Seconds())
	g.mu.Lock()
	if err := context.Cause(f.ctx); err != nil {
		g.mu.Unlock()
		return zero, err
	}
	f.sent = true
	f.phase = "sent, not answered yet"
	if g.pending[key] == f {
		delete(g.pending, key)
	}
	g.running[key] = f
	g.mu.Unlock()
	return g.call(f.ctx, key)
}

func (g *flightGroup[K, T]) setPhase(f *flight[T], phase string) {
	g.mu.Lock()
	f.phase = phase
	g.mu.Unlock()
}

// waitBudget is how long a v1 call may wait for the kubelet: up to a margin before its
// caller's deadline, at most maxWait.
func (k *kubeletClient) waitBudget(ctx context.Context) time.Duration {
	budget := k.maxWait
	if deadline, ok := ctx.Deadline(); ok {
		left := time.Until(deadline)
		if margin := min(max(left/10, minReplyMargin), maxReplyMargin); left > 2*margin {
			left -= margin
		}
		budget = min(budget, left)
	}
	return budget
}

// kubeletWaitError is a v1 call's wait for the kubelet that ended before an answer came.
type kubeletWaitError struct {
	socket, method string
	waited         time.Duration
	phase          string // what the call it waited for was waiting for
	attempts       int    // calls that failed while it waited
	last           error  // the last of them, or the kubelet's last failure before
}

func (e *kubeletWaitError) Error() string {
	msg := fmt.Sprintf("no answer to %s from the kubelet's PodResources socket %s within %s", e.method, e.socket, e.waited.Round(time.Millisecond))
	if e.phase != "" {
		msg += " (" + e.phase + ")"
	}
	if e.last != nil {
		last := e.last
		if ce, ok := errors.AsType[*kubeletCallError](last); ok {
			last = ce.err // without the socket and method said above
		}
		if e.attempts > 0 {
			msg += fmt.Sprintf(": %d calls failed, the last: %v", e.attempts, last)
		} else {
			msg += fmt.Sprintf(": the kubelet's last failure: %v", last)
		}
	}
	return msg
}

func (e *kubeletWaitError) Unwrap() error { return e.last }

// podKey is the key of the kubelet's Get.
type podKey struct{ namespace, name string }

// getResult is the kubelet's Get answer; found is false when the kubelet does not know the pod.
type getResult struct {
	pod   *v1.PodResources
	found bool
}
