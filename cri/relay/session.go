package relay

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// session is one client connection and the upstream connections its calls go to. mu guards
// its calls and the state of its connections; see doc.go for the locks and their order.
type session struct {
	srv  *Server
	ctx  context.Context
	down *conn

	mu        sync.Mutex
	streams   map[uint32]*stream     // by the client's stream id
	ups       map[*Target]*upstream  // the connection new calls to a target take
	upConns   map[*upstream]struct{} // every upstream connection still open
	resets    [32]uint32             // the client streams podgate reset last: their frames are ignored
	nreset    int
	started   bool   // the session's SETTINGS went out
	lastID    uint32 // the client's highest stream id so far
	closed    bool
	draining  bool // Shutdown: no new calls; the connection closes when the last one ends
	upReaders sync.WaitGroup
	// closedIDs are the client streams that ended lately after the client's END_STREAM or
	// RST_STREAM: a frame on one is a STREAM_CLOSED error (RFC 9113 §5.1).
	closedIDs [32]uint32
	nclosed   int
	idleSince time.Time // when the last call ended: IdleTimeout counts from it
	clocks    []clock   // the calls begun in the frames read since the last flush

	held     atomic.Int64 // the bytes the session's calls hold (Limits.ConnectionBytes)
	partial  atomic.Int64 // of them, those of requests not whole yet: they wait on the client
	shedding atomic.Bool  // closed to free the process's budget
	logged   sync.Once    // the session's one log line
	peer     peer         // the client's process
	frames   atomic.Uint64
	watch    watchState
	pings    pingPolicy // the reader's
}

// stream is one call the relay carries, whatever its kind. Under the session's mu.
type stream struct {
	path         string
	downID, upID uint32 // the client's id (0 for a forwarded call, which has none), the server's
	up           *upstream
	kind         streamKind
	// req and ans are the request's way and the answer's, set as the stream begins: from the
	// client (or a handler, Forward) to a server (or a handler, Unary), and back.
	req, ans    way
	token       any
	observed    bool // the observer's Begin saw the call: its End will
	code        codes.Code
	headersSent bool // the client has the response headers
	removed     bool
	// held is what s holds against the budget (chargeLocked); timer ends s at its deadline or
	// RequestTimeout, expired says it did.
	held    int64
	partial int64 // of held, what its request holds until it is whole
	timer   *time.Timer
	expired bool
	// The ways' windows and their streams at the senders live in the stream: one allocation
	// a call (req's at 0, ans's at 1).
	wins [2]recvWindow
	outs [2]sendStream
}

// recvWin is the window of the way i (0 the request's, 1 the answer's), opened at n.
func (s *stream) recvWin(i int, n int64) *recvWindow {
	w := &s.wins[i]
	w.n.Store(n)
	return w
}

// sendOn is the stream at out of the way i, for newSendStream's arguments.
func (s *stream) sendOn(i int, out *sender, id uint32, from creditTo, peerOpened bool) *sendStream {
	return s.outs[i].init(out, id, s, from, peerOpened)
}

// way is one direction of a call: where its bytes come from and where they go.
type way struct {
	from   *conn       // the connection they come from; nil for a handler
	fromID uint32      // the stream's id there
	recv   *recvWindow // what from may still send on the stream
	to     *sendStream // the stream at the sender they go to; nil when a handler takes them
	done   bool        // from ended it
	closed bool        // its end reached where it goes: the sender wrote it, the handler took it
}

// credit is where the way's bytes are given back to as they leave.
func (w *way) credit() creditTo { return creditTo{c: w.from, id: w.fromID, w: w.recv} }

// item is a frame's worth a stream's queue holds: bytes, or a header block.
type item struct {
	data    []byte
	headers []hpack.HeaderField
	end     bool
	held    int64 // what a header block was charged
}

// connError ends a connection with a GOAWAY.
type connError struct {
	code   http2.ErrCode
	reason string
}

func (e connError) Error() string { return fmt.Sprintf("HTTP/2 %v: %s", e.code, e.reason) }

// readClient reads the client's frames until its connection ends.
func (ss *session) readClient() error {
	c := ss.down
	defer c.flush()
	for {
		if !c.safe() {
			ss.flushRead(c)
			c.out.throttle()
		}
		f, d, isData, err := c.next()
		ss.frames.Add(1)
		var se http2.StreamError
		switch {
		case errors.As(err, &se):
			ss.reset(ss.streamByDown(se.StreamID), se.Code, true)
			ss.rstClient(se.StreamID, se.Code)
			err = nil
		case err != nil:
		case isData:
			err = ss.data(c, nil, d)
		default:
			err = ss.clientFrame(f)
		}
		if err != nil {
			if code, ok := goAwayCode(err); ok {
				ss.goAway(code)
			}
			return err
		}
	}
}

// flushRead ends a read of c: its frames leave (conn.flush), the clocks of the calls they began
// start, a draining session whose last call ended closes.
func (ss *session) flushRead(c *conn) {
	c.flush()
	if c == ss.down {
		ss.startClocks()
	}
	ss.closeIfDrained()
}

// clientLastID is the client's highest stream id so far.
func (ss *session) clientLastID() uint32 {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return ss.lastID
}

func (ss *session) streamByDown(id uint32) *stream {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return ss.streams[id]
}

func (ss *session) clientFrame(f http2.Frame) error {
	switch f := f.(type) {
	case *http2.MetaHeadersFrame:
		return ss.clientHeaders(f)
	case *http2.SettingsFrame:
		return ss.peerSettings(ss.down, nil, f)
	case *http2.WindowUpdateFrame:
		ss.down.out.put(event{kind: evWindow, id: f.StreamID, inc: f.Increment})
		ss.down.touch(ss.down.out)
	case *http2.PingFrame:
		if !f.IsAck() && ss.pings.strike(ss.down.out, time.Now()) {
			ss.report(refusal{ReasonTooManyPings, fmt.Sprintf("sent PINGs less than %s apart, %d times, while podgate sent it nothing", minPingInterval, maxPingStrikes+1), "GOAWAY ENHANCE_YOUR_CALM, closed the connection"})
			ss.down.out.put(event{kind: evGoAway, id: ss.clientLastID(), code: http2.ErrCodeEnhanceYourCalm, held: goAwaySize})
			ss.down.out.closeAfterFlush(closeGrace)
			return nil
		}
		ss.pong(ss.down, f)
	case *http2.RSTStreamFrame:
		ss.clientReset(f)
	case *http2.PushPromiseFrame:
		return connError{http2.ErrCodeProtocol, "a client sent PUSH_PROMISE"}
	}
	// GOAWAY: the client opens no more streams and closes the connection when it is done.
	// PRIORITY and frames of unknown types are ignored, as HTTP/2 says.
	return nil
}

// pong answers a peer's PING; it leaves with the reader's next flush.
func (ss *session) pong(c *conn, f *http2.PingFrame) {
	if !f.IsAck() {
		c.out.put(event{kind: evPing, ack: true, ping: f.Data, response: true, held: pingSize})
		c.touch(c.out)
	}
}

// pingSize is a PING frame's size, what an answer is charged while it waits.
const pingSize = 17

// A client may send PINGs as often as it likes while podgate sends it DATA or header blocks
// (grpc-go's BDP estimator pings as data arrives), and otherwise one every minPingInterval —
// grpc-go's client keeps its keepalive at least this far apart — with maxPingStrikes to spare;
// past them its connection is closed with GOAWAY ENHANCE_YOUR_CALM, as grpc-go's server does
// (its EnforcementPolicy, whose MinTime is 5 minutes). A PING costs podgate an answer: a flood
// of them from clients that do not read would take the CPU the kubelet's calls need.
const (
	minPingInterval = 10 * time.Second
	maxPingStrikes  = 2
)

// pingPolicy is what the client's reader keeps of its PINGs.
type pingPolicy struct {
	last    time.Time
	strikes int
}

// strike counts a PING the client sent at now; it says whether the client went over the policy.
// out is the client's sender, which says whether podgate sent it DATA or a header block since
// the last PING.
func (p *pingPolicy) strike(out *sender, now time.Time) bool {
	if out.sentStream.Swap(false) {
		p.last, p.strikes = time.Time{}, 0
	}
	if !p.last.IsZero() && now.Sub(p.last) < minPingInterval {
		p.strikes++
	}
	p.last = now
	return p.strikes > maxPingStrikes
}

// clientReset takes the client's RST_STREAM.
func (ss *session) clientReset(f *http2.RSTStreamFrame) {
	ss.reset(ss.streamByDown(f.StreamID), f.ErrCode, true)
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if f.StreamID <= ss.lastID && !ss.wasClosed(f.StreamID) {
		ss.noteClosedLocked(f.StreamID)
	}
}

// peerSettings applies a peer's SETTINGS: what concerns the session here, what concerns what
// podgate sends (windows, HPACK, header list) at c's sender, which acknowledges them once it
// applied them. u is the upstream c belongs to, nil for the client.
func (ss *session) peerSettings(c *conn, u *upstream, f *http2.SettingsFrame) error {
	if f.IsAck() {
		return nil
	}
	var sends []http2.Setting
	err := f.ForeachSetting(func(st http2.Setting) error {
		if err := st.Valid(); err != nil {
			code := http2.ErrCodeProtocol
			var ce http2.ConnectionError
			if errors.As(err, &ce) {
				code = http2.ErrCode(ce)
			}
			return connError{code, fmt.Sprintf("setting %v: %v", st, err)}
		}
		switch st.ID {
		case http2.SettingMaxConcurrentStreams:
			if u != nil {
				ss.mu.Lock()
				u.maxStreams = st.Val
				ss.mu.Unlock()
			}
		case http2.SettingInitialWindowSize, http2.SettingHeaderTableSize, http2.SettingMaxHeaderListSize:
			sends = append(sends, st)
		}
		return nil
	})
	if err != nil {
		return err
	}
	c.out.put(event{kind: evSettings, settings: sends, response: true, held: settingsAckSize})
	c.touch(c.out)
	return nil
}

// settingsAckSize is a SETTINGS acknowledgement's size, what it is charged while it waits.
const settingsAckSize = 9

// start routes the client's new call s, whose headers f arrived at arrived, and starts its
// clock.
func (ss *session) start(s *stream, f *http2.MetaHeadersFrame, arrived time.Time) error {
	target := ss.srv.Route(s.path)
	fields := f.Fields
	if ss.srv.Observer != nil {
		call := &Call{Path: s.path, Target: target, Header: f.Fields}
		s.token, s.observed = ss.srv.Observer.Begin(call), true
		fields = call.forwarded()
	}
	err := ss.route(s, f, target, fields)
	timeout, ok := grpcTimeout(f.Fields)
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if !s.removed && !s.req.done {
		ss.clocks = append(ss.clocks, clock{s, arrived, timeout, ok})
	}
	return err
}

// route starts s where its target says: answered at once, answered in the process, or passed
// to a server.
func (ss *session) route(s *stream, f *http2.MetaHeadersFrame, target *Target, fields []hpack.HeaderField) error {
	switch {
	case target == nil:
		ss.answerLocal(s, codes.Unimplemented, "unknown method "+clip(s.path))
		return nil
	case target.Refuse != nil:
		st := status.Convert(target.Refuse(s.path))
		ss.answerLocal(s, st.Code(), st.Message())
		return nil
	case target.Unary != nil:
		ss.startUnary(s, f, target)
		return nil
	}
	if target.Unavailable != nil {
		if err := target.Unavailable(); err != nil {
			ss.answerLocal(s, codes.Unavailable, status.Convert(err).Message())
			return nil
		}
	}
	var a after
	err := ss.onUpstream(target, func(up *upstream) {
		a = ss.passLocked(s, up, fields)
	})
	if err != nil {
		ss.answerLocal(s, codes.Unavailable, status.Convert(err).Message())
		return nil
	}
	ss.after(ss.down, a)
	return nil
}

// passLocked opens s on up, the connection to its server, and sends the client's header block
// on. mu is held.
func (ss *session) passLocked(s *stream, up *upstream, fields []hpack.HeaderField) after {
	switch {
	case ss.closed:
		s.kind = answered{}
		ss.removeLocked(s, noRST, noRST)
		return after{ended: s}
	case up.maxStreams > 0 && uint32(len(up.streams)) >= up.maxStreams:
		return ss.answerLocalLocked(s, codes.Unavailable, fmt.Sprintf("%s allows %d calls at once on a connection", up.target.Name, up.maxStreams))
	case ss.draining && ss.srv.LongLived != nil && ss.srv.LongLived(s.path):
		// Shutdown began while the call was routed: it ends as drain ends the others.
		return ss.answerLocalLocked(s, codes.Unavailable, ss.srv.ShutdownMessage)
	}
	s.kind, s.up, s.upID = passthrough{}, up, up.nextID
	up.nextID += 2
	s.req.to = s.sendOn(0, up.c.out, s.upID, s.req.credit(), false)
	s.ans = way{from: up.c, fromID: s.upID, recv: s.recvWin(1, streamWindow)}
	s.ans.to = s.sendOn(1, ss.down.out, s.downID, s.ans.credit(), true)
	ss.streams[s.downID] = s
	up.streams[s.upID] = s
	// In order of their ids: HTTP/2 wants a connection's new streams to.
	ss.down.out.put(event{kind: evOpen, st: s.ans.to})
	up.c.out.put(event{kind: evHeaders, st: s.req.to, fields: fields, end: s.req.done, held: headerListSize(fields)})
	var a after
	a.kick(up.c.out)
	return a
}

// answerLocal answers a call with a gRPC status and no message; what the client still sends
// on it is dropped.
func (ss *session) answerLocal(s *stream, code codes.Code, msg string) {
	ss.mu.Lock()
	a := ss.answerLocalLocked(s, code, msg)
	ss.mu.Unlock()
	ss.after(ss.down, a)
}

// answerLocalLocked is answerLocal under mu.
func (ss *session) answerLocalLocked(s *stream, code codes.Code, msg string) after {
	s.kind, s.code, s.headersSent = answered{}, code, true
	if s.ans.to == nil {
		s.ans.to = s.sendOn(1, ss.down.out, s.downID, creditTo{}, true)
	}
	s.ans.done = true
	s.req.closed = s.req.done // a request whole already: nothing more comes to drop
	fields := grpcStatus(code, msg, true)
	ss.down.out.put(event{kind: evHeaders, st: s.ans.to, fields: fields, end: true, response: true, held: headerListSize(fields)})
	ss.streams[s.downID] = s
	var a after
	a.kick(ss.down.out)
	return a
}

func headerValue(fields []hpack.HeaderField, name string) string {
	for _, f := range fields {
		if f.Name == name {
			return f.Value
		}
	}
	return ""
}
