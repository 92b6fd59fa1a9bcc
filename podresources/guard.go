package podresources

// What one client may take of the socket: connections (a cap), calls (a token bucket each,
// counted as a call's stream opens), and what it is told, once, in the log when it is refused.

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

// Refusal reasons, the label of podgate_podresources_refusals_total.
const (
	reasonRateLimit   = "rate_limit"
	reasonConnections = "connections"
)

// clients is the rate limit per client: a token bucket each, keyed by its peerID.
type clients struct {
	qps   float64
	burst int
	max   int
	now   func() time.Time

	mu       sync.Mutex
	m        map[peerID]*bucket
	overflow *bucket // the newcomers' while the table is full
}

type bucket struct {
	lim  *rate.Limiter
	used time.Time
}

func newClients(qps float64, burst, maxClients int, now func() time.Time) *clients {
	c := &clients{qps: qps, burst: burst, max: maxClients, now: now, m: map[peerID]*bucket{}}
	c.overflow = c.newBucket()
	return c
}

func (c *clients) newBucket() *bucket {
	return &bucket{lim: rate.NewLimiter(rate.Limit(c.qps), c.burst)}
}

// allow takes a token of p's bucket, saying whether there was one.
func (c *clients) allow(p peerID) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.now()
	b := c.m[p]
	if b == nil {
		b = c.overflow
		if p.pid != 0 && (len(c.m) < c.max || c.evictIdle(now)) {
			b = c.newBucket()
			c.m[p] = b
		}
	}
	b.used = now
	return b.lim.AllowN(now, 1)
}

// evictIdle forgets the clients whose bucket has refilled (a new one would be the same) and
// says whether there is room now. mu is held.
func (c *clients) evictIdle(now time.Time) bool {
	refill := time.Duration(float64(c.burst) / c.qps * float64(time.Second))
	for p, b := range c.m {
		if now.Sub(b.used) >= refill {
			delete(c.m, p)
		}
	}
	return len(c.m) < c.max
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
// did, answer what podgate did about it.
func (r *refusals) refuse(p peerID, reason, did, answer string) {
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
	r.logger.Info("Refused a PodResources client", "pid", p.pid, "uid", p.uid, "reason", reason,
		"client", did, "podgate", answer, "refused", refused, "nextLineAfter", logEvery)
}

// tapLimit takes a token of the caller's bucket as the call's stream opens, before its
// request is read: a stream that never sends one counts as a call does. The health check is
// exempt (a probe must not fail because a client is noisy).
func (g *guard) tapLimit(ctx context.Context, info *tap.Info) (context.Context, error) {
	if strings.HasPrefix(info.FullMethodName, "/grpc.health.v1.Health/") {
		return ctx, nil
	}
	p := peerOf(ctx)
	if g.clients.allow(p) {
		return ctx, nil
	}
	g.requests.WithLabelValues(info.FullMethodName, codes.ResourceExhausted.String()).Inc()
	err := status.Errorf(codes.ResourceExhausted, "rejected by rate limit: podResources.qps %v, podResources.burst %d", g.clients.qps, g.clients.burst)
	g.refusals.refuse(p, reasonRateLimit, "called "+info.FullMethodName+" over its rate limit", "answered ResourceExhausted")
	return ctx, err
}

// guard is what the socket holds its clients to.
type guard struct {
	clients  *clients
	refusals *refusals
	requests *prometheus.CounterVec
	maxConns int
}

// listen wraps l: each connection carries its client's credentials, and past maxConns open
// ones a new connection is closed at once.
func (g *guard) listen(l net.Listener) net.Listener {
	return &capListener{Listener: l, g: g, slots: make(chan struct{}, g.maxConns)}
}

// capListener is the socket's listener under the connection cap.
type capListener struct {
	net.Listener
	g     *guard
	slots chan struct{} // one per open connection
}

// Accept returns the next connection within the cap, closing those over it.
func (l *capListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		p := readPeer(c)
		select {
		case l.slots <- struct{}{}:
			return &peerConn{Conn: &slotConn{Conn: c, slots: l.slots}, peer: p}, nil
		default:
			// Told before the client sees its connection end.
			l.g.refusals.refuse(p, reasonConnections, "opened a connection over the cap",
				fmt.Sprintf("closed it: podResources.maxConnections %d are open", cap(l.slots)))
			_ = c.Close()
		}
	}
}

// slotConn gives its slot back when it closes.
type slotConn struct {
	net.Conn
	once  sync.Once
	slots chan struct{}
}

func (c *slotConn) Close() error {
	c.once.Do(func() { <-c.slots })
	return c.Conn.Close()
}
