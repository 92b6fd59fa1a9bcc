package podresources

// What one client may take of the socket: connections, open calls and watches (slots per
// process and per user inside the socket's totals, slots.go), calls (a token bucket per
// process and one per user, counted as a call's stream opens), a connection's first call
// within the header timeout, and what it is told, once, in the log when it is refused.

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"
	"k8s.io/klog/v2"

	pb "github.com/podgate/podgate/podresources/api/v1alpha1"
)

const (
	// maxClients bounds the table of clients' buckets; past it, and while no client in it is
	// idle, the newcomers share one bucket.
	maxClients = 1024
	// logEvery is the least time between two log lines about one client and one reason.
	logEvery = time.Minute
	// logQPS and logBurst bound the refusal lines of all clients together.
	logQPS   = 1
	logBurst = 10
)

// Refusal reasons, the label of podgate_podresources_refusals_total. Besides these, a slot
// refused over a quota is its kind, with _per_process or _per_user when the process's or the
// user's quota refused it (holder.reason).
const (
	reasonRateLimit     = "rate_limit"
	reasonRateLimitUser = "rate_limit_per_user"
	reasonHeaderTimeout = "header_timeout"
	reasonWatchStalled  = "watch_stalled"
)

// clients is the rate limit per client: a token bucket per process, keyed by its peerID,
// and one per user, keyed by its uid, which every call of the user's processes takes from
// too, so that forking does not multiply the user's rate.
type clients struct {
	procs table[peerID]
	users table[uint32]
	now   func() time.Time

	mu sync.Mutex
}

// table is a bounded table of token buckets.
type table[K comparable] struct {
	qps   float64
	burst int
	max   int

	m        map[K]*bucket
	overflow *bucket // the newcomers' while the table is full
}

type bucket struct {
	lim  *rate.Limiter
	used time.Time
}

func newTable[K comparable](qps float64, burst, maxKeys int) table[K] {
	t := table[K]{qps: qps, burst: burst, max: maxKeys, m: map[K]*bucket{}}
	t.overflow = t.newBucket()
	return t
}

func newClients(qps float64, burst int, userQPS float64, userBurst, maxClients int, now func() time.Time) *clients {
	return &clients{procs: newTable[peerID](qps, burst, maxClients), users: newTable[uint32](userQPS, userBurst, maxClients), now: now}
}

func (t *table[K]) newBucket() *bucket {
	return &bucket{lim: rate.NewLimiter(rate.Limit(t.qps), t.burst)}
}

// allow takes a token of p's bucket and of its user's, saying whether there were both, and
// when not, which refused. A token of p's is given back when its user's bucket refuses: the
// call was not made.
func (c *clients) allow(p peerID) (refusedBy scope, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.now()
	r := c.procs.get(p, p.pid != 0, now).lim.ReserveN(now, 1)
	if !r.OK() || r.DelayFrom(now) > 0 {
		r.CancelAt(now)
		return scopeProcess, false
	}
	if p.pid == 0 { // credentials not read: no user to charge
		return 0, true
	}
	if !c.users.get(p.uid, true, now).lim.AllowN(now, 1) {
		r.CancelAt(now)
		return scopeUser, false
	}
	return 0, true
}

// get is k's bucket, made when own and there is room, else the overflow bucket. c.mu is held.
func (t *table[K]) get(k K, own bool, now time.Time) *bucket {
	b := t.m[k]
	if b == nil {
		b = t.overflow
		if own && (len(t.m) < t.max || t.evictIdle(now)) {
			b = t.newBucket()
			t.m[k] = b
		}
	}
	b.used = now
	return b
}

// evictIdle forgets the keys whose bucket has refilled (a new one would be the same) and
// says whether there is room now.
func (t *table[K]) evictIdle(now time.Time) bool {
	refill := time.Duration(float64(t.burst) / t.qps * float64(time.Second))
	for k, b := range t.m {
		if now.Sub(b.used) >= refill {
			delete(t.m, k)
		}
	}
	return len(t.m) < t.max
}

// refusals tells of what podgate refused its clients: a counter by reason, and a log line
// per client and reason at most every logEvery (saying how many were refused since), within
// a budget of lines for all clients together, so that no client can flood the log.
type refusals struct {
	logger  klog.Logger
	counter *prometheus.CounterVec
	lines   *rate.Limiter

	mu   sync.Mutex
	told map[toldKey]*told
}

type toldKey struct {
	peer   peerID
	reason string
}

type told struct {
	at      time.Time
	refused int // since the last line
}

func newRefusals(logger klog.Logger, counter *prometheus.CounterVec) *refusals {
	return &refusals{logger: logger, counter: counter, lines: rate.NewLimiter(logQPS, logBurst), told: map[toldKey]*told{}}
}

// refuse counts a refusal of p and logs it unless p was told of lately: did is what the client
// did, answer what podgate did about it, and more key/value pairs, such as who holds the
// slots p was refused, go on the line.
func (r *refusals) refuse(p peerID, reason, did, answer string, more ...any) {
	r.counter.WithLabelValues(reason).Inc()
	now := time.Now()
	r.mu.Lock()
	k := toldKey{p, reason}
	t := r.told[k]
	if t == nil {
		if len(r.told) >= maxClients {
			for k, t := range r.told {
				if now.Sub(t.at) >= logEvery {
					delete(r.told, k)
				}
			}
		}
		t = &told{}
		if len(r.told) < maxClients {
			r.told[k] = t
		}
	}
	t.refused++
	if !t.at.IsZero() && now.Sub(t.at) < logEvery || !r.lines.AllowN(now, 1) {
		r.mu.Unlock()
		return
	}
	refused := t.refused
	t.at, t.refused = now, 0
	r.mu.Unlock()
	kv := append([]any{"pid", p.pid, "uid", p.uid, "reason", reason, "client", did, "podgate", answer}, more...)
	r.logger.Info("Refused a PodResources client", append(kv, "refused", refused, "nextLineAfter", logEvery)...)
}

// refuseSlot tells of a slot refused to p, naming who holds the quota's slots.
func (r *refusals) refuseSlot(p peerID, h *holder, did, answer string) {
	r.refuse(p, h.reason(), did, answer, h.keyValues()...)
}

// tap admits a call as its stream opens, before its request is read: it takes a token of the
// caller's buckets (a stream that never sends its request counts as a call does) and a slot
// of its process's and user's open calls, and of their watches for a Watch, given back when
// the stream ends. The health check is exempt (a probe must not fail because a client is
// noisy).
func (g *guard) tap(ctx context.Context, info *tap.Info) (context.Context, error) {
	pi := peerInfoOf(ctx)
	if pi.conn != nil {
		pi.conn.called()
	}
	if strings.HasPrefix(info.FullMethodName, "/grpc.health.v1.Health/") {
		return ctx, nil
	}
	p := pi.peer
	if err := g.limit(p, info.FullMethodName); err != nil {
		return ctx, err
	}
	release, h := g.slots.acquire(p, kindStreams)
	if h != nil {
		return ctx, g.refuseCall(p, h, info.FullMethodName)
	}
	if info.FullMethodName != pb.PodResources_Watch_FullMethodName {
		context.AfterFunc(ctx, release)
		return ctx, nil
	}
	releaseWatch, h := g.slots.acquire(p, kindWatches)
	if h != nil {
		release()
		return ctx, g.refuseCall(p, h, info.FullMethodName)
	}
	// The watch's own cancel: canceling it ends a send blocked on a client that does not
	// read (grpc-go's write quota waits on the stream's context).
	ctx, cancel := context.WithCancel(ctx)
	context.AfterFunc(ctx, func() {
		releaseWatch()
		release()
	})
	return withWatchCancel(ctx, cancel), nil
}

// limit takes a token of p's buckets, or refuses the call.
func (g *guard) limit(p peerID, method string) error {
	by, ok := g.clients.allow(p)
	if ok {
		return nil
	}
	g.requests.WithLabelValues(method, codes.ResourceExhausted.String()).Inc()
	if by == scopeUser {
		g.refusals.refuse(p, reasonRateLimitUser, "called "+method+" over its user's rate limit", "answered ResourceExhausted",
			"quota", fmt.Sprintf("podResources.qpsPerUser %v, podResources.burstPerUser %d", g.clients.users.qps, g.clients.users.burst))
		return status.Errorf(codes.ResourceExhausted, "rejected by rate limit of uid %d: podResources.qpsPerUser %v, podResources.burstPerUser %d", p.uid, g.clients.users.qps, g.clients.users.burst)
	}
	g.refusals.refuse(p, reasonRateLimit, "called "+method+" over its rate limit", "answered ResourceExhausted")
	return status.Errorf(codes.ResourceExhausted, "rejected by rate limit: podResources.qps %v, podResources.burst %d", g.clients.procs.qps, g.clients.procs.burst)
}

// refuseCall counts, logs and returns the refusal of a call over a slot quota.
func (g *guard) refuseCall(p peerID, h *holder, method string) error {
	g.requests.WithLabelValues(method, codes.ResourceExhausted.String()).Inc()
	g.refusals.refuseSlot(p, h, "opened a call of "+method, "answered ResourceExhausted")
	return status.Errorf(codes.ResourceExhausted, "%s %d are open (pid %d holds %d)", h.key, h.limit, h.peer.pid, h.held)
}

// stalled tells of a watch ended because its client read nothing for watchSendTimeout.
func (g *guard) stalled(ctx context.Context) {
	g.watchersDropped.Inc()
	g.refusals.refuse(peerOf(ctx), reasonWatchStalled, fmt.Sprintf("read nothing of its Watch for podResources.watchSendTimeout %s", g.watchSendTimeout), "ended the watch")
}

// guard is what the socket holds its clients to.
type guard struct {
	clients          *clients
	slots            *slots
	refusals         *refusals
	requests         *prometheus.CounterVec
	watchersDropped  prometheus.Counter
	headerTimeout    time.Duration
	watchSendTimeout time.Duration
}

// listen wraps l: each connection carries its client's credentials, holds a slot of its
// process's, its user's and the socket's connections (one over a quota is closed at once),
// and is closed when it opened no call within headerTimeout.
func (g *guard) listen(l net.Listener) net.Listener {
	return &capListener{Listener: l, g: g}
}

// capListener is the socket's listener under the connection quotas.
type capListener struct {
	net.Listener
	g *guard
}

// Accept returns the next connection within the quotas, closing those over them.
func (l *capListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		p := readPeer(c)
		release, h := l.g.slots.acquire(p, kindConnections)
		if h != nil {
			// Told before the client sees its connection end.
			l.g.refusals.refuseSlot(p, h, "opened a connection", "closed it")
			_ = c.Close()
			continue
		}
		pc := &peerConn{Conn: c, peer: p, release: release}
		pc.header.Store(time.AfterFunc(l.g.headerTimeout, func() { l.g.headerTimedOut(pc) }))
		return pc, nil
	}
}

// headerTimedOut closes c unless it opened a call: a connection that has not said HTTP/2's
// preface and a call's headers within headerTimeout is half-open, and gives its slot back.
func (g *guard) headerTimedOut(c *peerConn) {
	if !c.state.CompareAndSwap(connWaiting, connTimedOut) {
		return
	}
	g.refusals.refuse(c.peer, reasonHeaderTimeout, "opened no call within podResources.headerTimeout "+g.headerTimeout.String(), "closed the connection")
	_ = c.Close()
}
