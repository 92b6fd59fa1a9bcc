package relay

// What one client may make the relay hold, and for how long: the memory budget, the
// connections' limits, and the report of a client that went over them.

import (
	"cmp"
	"fmt"
	"slices"
	"sync"
	"time"

	"golang.org/x/net/http2"
	"k8s.io/klog/v2"
)

// Limits bound what clients can make the relay hold and for how long. A zero field takes its
// default (DefaultLimits), which a kubelet never reaches: its largest request is a few KiB, its
// header blocks a few hundred bytes, and it calls the runtime every second or so.
type Limits struct {
	// ConnectionBytes bounds the bytes one client connection makes the relay hold for requests
	// it has not yet handed on: intercepted requests' bodies until their end, the decoded
	// header blocks of its open calls, request bytes that wait for the runtime's window. A call
	// that would go over it is refused.
	ConnectionBytes int64
	// TotalBytes bounds the same over every connection, and what podgate holds for them to
	// read. Over it, the connections whose bytes wait on their client without moving are
	// closed (the requests they have not finished sending, the answers they have not taken
	// for a second), the most such bytes first; a call of a connection that holds more than a
	// little is refused meanwhile. A connection whose client reads is never closed for it.
	TotalBytes int64
	// MaxConnections bounds the client connections open at once; a connection over it is closed
	// as soon as it is accepted.
	MaxConnections int
	// MaxHeaderList is the SETTINGS_MAX_HEADER_LIST_SIZE the relay announces and holds a
	// client's header block to, counted as HPACK decodes it.
	MaxHeaderList uint32
	// IdleTimeout closes a connection that has had no call open for so long (GOAWAY, then the
	// close); its client reconnects at its next call.
	IdleTimeout time.Duration
	// KeepaliveTime is how long a client may send nothing before the relay sends it a PING;
	// KeepaliveTimeout how long it then has to answer before its connection is closed.
	KeepaliveTime, KeepaliveTimeout time.Duration
	// RequestTimeout bounds how long a call without a grpc-timeout may take to send its whole
	// request; a call with one gets its grpc-timeout, from the moment its headers arrive.
	RequestTimeout time.Duration
	// WriteTimeout closes a connection whose client took no byte of what podgate wrote to it
	// for so long: it stopped reading its socket.
	WriteTimeout time.Duration
	// WindowTimeout resets a call whose answer waited so long on the client's flow-control
	// window without a byte leaving: the client reads its socket but opens no window.
	WindowTimeout time.Duration
}

// DefaultLimits are the limits a zero Limits field takes.
var DefaultLimits = Limits{
	ConnectionBytes:  64 << 20,
	TotalBytes:       256 << 20,
	MaxConnections:   4096,
	MaxHeaderList:    64 << 10,
	IdleTimeout:      5 * time.Minute,
	KeepaliveTime:    2 * time.Minute,
	KeepaliveTimeout: 20 * time.Second,
	RequestTimeout:   2 * time.Minute,
	WriteTimeout:     20 * time.Second,
	WindowTimeout:    time.Minute,
}

// withDefaults is l with every zero field set to its default.
func (l Limits) withDefaults() Limits {
	d := DefaultLimits
	pick := func(v, def time.Duration) time.Duration {
		if v > 0 {
			return v
		}
		return def
	}
	if l.ConnectionBytes <= 0 {
		l.ConnectionBytes = d.ConnectionBytes
	}
	if l.TotalBytes <= 0 {
		l.TotalBytes = d.TotalBytes
	}
	if l.MaxConnections <= 0 {
		l.MaxConnections = d.MaxConnections
	}
	if l.MaxHeaderList == 0 {
		l.MaxHeaderList = d.MaxHeaderList
	}
	l.IdleTimeout = pick(l.IdleTimeout, d.IdleTimeout)
	l.KeepaliveTime = pick(l.KeepaliveTime, d.KeepaliveTime)
	l.KeepaliveTimeout = pick(l.KeepaliveTimeout, d.KeepaliveTimeout)
	l.RequestTimeout = pick(l.RequestTimeout, d.RequestTimeout)
	l.WriteTimeout = pick(l.WriteTimeout, d.WriteTimeout)
	l.WindowTimeout = pick(l.WindowTimeout, d.WindowTimeout)
	return l
}

// Reasons a client's call or connection is refused or ended, the values Server.Refused is told
// and the relay's log lines name.
const (
	ReasonConnectionBudget = "connection_budget"     // the connection held ConnectionBytes
	ReasonTotalBudget      = "total_budget"          // every connection together held TotalBytes
	ReasonMessageTooLarge  = "message_too_large"     // a length prefix over the message limit
	ReasonHeaderList       = "header_list_too_large" // a header block over MaxHeaderList
	ReasonDeadline         = "deadline"              // a request not whole at its grpc-timeout
	ReasonRequestTimeout   = "request_timeout"       // a request not whole after RequestTimeout
	ReasonConnectionCap    = "connection_cap"        // MaxConnections open already
	ReasonIdle             = "idle_timeout"          // no call open for IdleTimeout
	ReasonKeepalive        = "keepalive_timeout"     // no answer to a PING
	ReasonPreface          = "preface"               // no HTTP/2 client preface
	ReasonProtocol         = "protocol_error"        // a frame that breaks HTTP/2: GOAWAY
	ReasonWriteTimeout     = "write_timeout"         // took nothing podgate wrote for WriteTimeout
	ReasonWindowTimeout    = "window_timeout"        // an answer waited on a shut window for WindowTimeout
	ReasonListTooLong      = "list_too_long"         // an intercepted request lists more than any kubelet sends (UnaryCall.Report)
	ReasonTooManyPings     = "too_many_pings"        // PINGs more often than minPingInterval while podgate sent nothing
)

// Reasons lists every reason, for a metric's label values made up front.
var Reasons = []string{ReasonConnectionBudget, ReasonTotalBudget, ReasonMessageTooLarge, ReasonHeaderList,
	ReasonDeadline, ReasonRequestTimeout, ReasonConnectionCap, ReasonIdle, ReasonKeepalive, ReasonPreface, ReasonProtocol,
	ReasonWriteTimeout, ReasonWindowTimeout, ReasonListTooLong, ReasonTooManyPings}

// quietReasons are the reasons that are no misbehaviour (a client that stays away): logged at
// verbosity 2 rather than always.
var quietReasons = map[string]bool{ReasonIdle: true}

// logInterval is how often a reason may be logged at most: a client cannot flood the log, and
// the lines it was refused say how many were left out.
const logInterval = time.Second

// logLimiter lets one log line per reason through per logInterval and counts the others.
type logLimiter struct {
	mu         sync.Mutex
	last       map[string]time.Time
	suppressed map[string]int
}

// allow says whether a line of reason may be logged now, and how many were left out since the
// last one.
func (l *logLimiter) allow(reason string, now time.Time) (bool, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.last == nil {
		l.last, l.suppressed = map[string]time.Time{}, map[string]int{}
	}
	if now.Sub(l.last[reason]) < logInterval {
		l.suppressed[reason]++
		return false, 0
	}
	l.last[reason] = now
	n := l.suppressed[reason]
	l.suppressed[reason] = 0
	return true, n
}

// peer is the process at the other end of a client's connection, as the kernel says
// (SO_PEERCRED): read as the connection is accepted, for the log line of a client that
// misbehaves; -1 when unknown.
type peer struct{ pid, uid int64 }

// refusal is what the relay did about a client, for its one log line and the metric.
type refusal struct {
	reason string
	did    string // what the client did
	action string // what podgate did
}

// report counts r and logs it, once per connection and within the log's rate: the peer's pid
// and uid, what it did, what podgate did.
func (ss *session) report(r refusal) {
	ss.srv.reportRefusal(ss.peer, &ss.logged, r)
}

// reportRefusal is report for a connection that has no session (refused at accept).
func (s *Server) reportRefusal(p peer, logged *sync.Once, r refusal) {
	if s.Refused != nil {
		s.Refused(r.reason)
	}
	logged.Do(func() {
		ok, left := s.logs.allow(r.reason, time.Now())
		if !ok {
			return
		}
		l := s.logger()
		if quietReasons[r.reason] {
			l = l.V(2)
		}
		l.Info("A CRI client misbehaved", "reason", r.reason, "pid", p.pid, "uid", p.uid,
			"did", r.did, "podgate", r.action, "suppressed", left)
	})
}

// logger is the Server's logger, klog's global one when none was set.
func (s *Server) logger() klog.Logger {
	if s.Logger.GetSink() == nil {
		return klog.Background()
	}
	return s.Logger
}

// chargeLocked counts n more bytes that s holds for its client's request. When they do not fit
// it counts none and says why; over the process's budget, the connections that are stuck are
// closed to make room (makeRoom). mu is held.
func (ss *session) chargeLocked(s *stream, n int64) string {
	lim := &ss.srv.lim
	switch {
	case ss.shedding.Load():
		return ReasonTotalBudget
	case ss.held.Load()+n > lim.ConnectionBytes:
		return ReasonConnectionBudget
	case ss.srv.held.Load()+n > lim.TotalBytes && !ss.srv.makeRoom(ss, n):
		return ReasonTotalBudget
	}
	s.held += n
	if !s.req.done {
		s.partial += n
		ss.partial.Add(n)
	}
	ss.srv.held.Add(n)
	ss.held.Add(n)
	return ""
}

// wholeLocked notes that s's request is whole: what it holds no longer waits on its client.
// mu is held.
func (ss *session) wholeLocked(s *stream) {
	s.req.done = true
	if s.partial != 0 {
		ss.partial.Add(-s.partial)
		s.partial = 0
	}
}

// hold counts n more (or, negative, fewer) bytes held for the session's connections — what
// their senders hold until written — toward its budget and the process's. Over the process's
// budget, the connections that are stuck are closed to make room: these bytes have arrived
// already (the windows bound them), so they are counted whatever the budget says.
func (ss *session) hold(n int64) {
	ss.held.Add(n)
	if total := ss.srv.held.Add(n); n > 0 && total > ss.srv.lim.TotalBytes {
		ss.srv.shedStuck(total-ss.srv.lim.TotalBytes, ss)
	}
}

// releaseLocked gives back n of the bytes s held. mu is held.
func (ss *session) releaseLocked(s *stream, n int64) {
	if n <= 0 {
		return
	}
	s.held -= n
	if s.partial != 0 {
		ss.partial.Add(-s.partial)
		s.partial = 0
	}
	ss.held.Add(-n)
	ss.srv.held.Add(-n)
}

// makeRoom is called when n more bytes of a request of ss would go over the process's budget:
// the connections that are stuck are closed (shed) to make room. Their bytes count until their
// calls have ended, which closing them sets off: until then, only a connection that holds
// little (within reserve) and is not stuck itself still gets its n bytes, so that a kubelet's
// call is not refused because other clients filled the budget. It says whether n fits.
func (s *Server) makeRoom(ss *session, n int64) bool {
	over := s.held.Load() + n - s.lim.TotalBytes
	leaving := s.shedStuck(over, ss)
	waited, _, answers := ss.stuck(time.Now())
	small := ss.held.Load()+n <= s.lim.TotalBytes/smallShare
	return small && (answers == 0 || waited < minStuck) && (leaving >= over || over <= s.lim.TotalBytes/reserveShare)
}

// A connection that holds at most 1/smallShare of the process's budget (a kubelet's) gets its
// calls over the budget while stuck connections are being shed, and otherwise within
// 1/reserveShare of it.
const (
	smallShare   = 256
	reserveShare = 16
)

// minStuck is how long the answers a client has not taken must have waited, with no byte of
// them leaving, for its connection to be shed: a client that reads — a kubelet taking a large
// list, a byte leaving every few milliseconds — is never shed, however full the budget is.
const minStuck = 100 * time.Millisecond

// stuck is what the session holds that waits on its client: the requests its client has not
// finished sending (partial), and the answers it has not taken, which have waited without a
// byte leaving for waited.
func (ss *session) stuck(now time.Time) (waited time.Duration, partial, answers int64) {
	return ss.down.out.stuckFor(now), ss.partial.Load(), ss.down.out.held.Load()
}

// shedStuck closes the connections that are stuck — what they hold waits on their client and
// does not move: requests it has not finished sending, answers it has not taken for minStuck —
// the longest stuck first, until those being closed hold at least over bytes; a connection that
// is not stuck is never closed, nor except. It returns what the connections being closed still
// hold.
func (s *Server) shedStuck(over int64, except *session) (leaving int64) {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if now.Sub(s.lastShedLook) < shedLookInterval {
		return s.leaving // looked a moment ago
	}
	s.lastShedLook = now
	for o := range s.sessions {
		if o.shedding.Load() {
			leaving += o.held.Load()
		}
	}
	type candidate struct {
		ss    *session
		for_  time.Duration
		bytes int64
	}
	var cands []candidate
	for o := range s.sessions {
		d, partial, answers := o.stuck(now)
		if d < minStuck {
			answers = 0
		}
		if b := partial + answers; b > 0 && o != except && !o.shedding.Load() {
			cands = append(cands, candidate{o, d, b})
		}
	}
	// The longest stuck first; of requests not finished, the most bytes first.
	slices.SortFunc(cands, func(a, b candidate) int {
		if c := cmp.Compare(b.for_, a.for_); c != 0 {
			return c
		}
		return cmp.Compare(b.bytes, a.bytes)
	})
	for _, c := range cands {
		if leaving >= over {
			break
		}
		if !c.ss.shedding.CompareAndSwap(false, true) {
			continue
		}
		leaving += c.ss.held.Load()
		go c.ss.shed(c.for_, c.bytes)
	}
	s.leaving = leaving
	if leaving < over && !s.relooking {
		// Answers that are not yet stuck long enough may be by then: the budget stays over
		// until they are shed, whether or not another byte is charged.
		s.relooking = true
		time.AfterFunc(minStuck, s.relook)
	}
	return leaving
}

// relook looks for stuck connections again while the process's budget is over.
func (s *Server) relook() {
	s.mu.Lock()
	s.relooking = false
	s.lastShedLook = time.Time{}
	s.mu.Unlock()
	if over := s.held.Load() - s.lim.TotalBytes; over > 0 {
		s.shedStuck(over, nil)
	}
}

// shedLookInterval is how often, at most, the connections are looked through for stuck ones
// while the budget stays over: not at every byte charged.
const shedLookInterval = 10 * time.Millisecond

// shed closes the connection, stuck when the process's budget ran out: GOAWAY
// ENHANCE_YOUR_CALM, and the close, which does not wait for a client that does not read; its
// calls end then, which gives their bytes back.
func (ss *session) shed(waited time.Duration, stuck int64) {
	did := fmt.Sprintf("held %d bytes, %d of them waiting on it (requests it had not finished sending, answers it had not taken: none left for %s), when all connections together reached %d",
		ss.held.Load(), stuck, waited.Round(time.Millisecond), ss.srv.lim.TotalBytes)
	ss.report(refusal{ReasonTotalBudget, did, "closed the connection"})
	ss.down.out.put(event{kind: evGoAway, id: ss.clientLastID(), code: http2.ErrCodeEnhanceYourCalm, held: goAwaySize})
	ss.down.out.closeAfterFlush(shedGrace)
}

// shedGrace bounds how long a shed connection's GOAWAY may take to leave: what it holds counts
// until it is closed.
const shedGrace = 100 * time.Millisecond

// stalled reports a client that took nothing podgate wrote for WriteTimeout; its connection
// closes.
func (ss *session) stalled() {
	ss.report(refusal{ReasonWriteTimeout, fmt.Sprintf("took no byte of what podgate wrote for %s", ss.srv.lim.WriteTimeout), "closed the connection"})
}

// Held is how many bytes the relay holds now for requests it has not handed on, over every
// connection: what Limits.TotalBytes bounds.
func (s *Server) Held() int64 { return s.held.Load() }
