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

// session is one client connection and the upstream connections its calls go to. Lock order:
// mu, then the Server's mu (a charge over the process's budget), then an endpoint's wmu; never
// mu while holding either. Neither is held across a write to a
// connection: only an endpoint's writer writes.
type session struct {
	srv  *Server
	ctx  context.Context
	down *endpoint

	self *endpoint // the side of the answers Unary targets give

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
	shedding atomic.Bool  // closed to free the process's budget
	logged   sync.Once    // the session's one log line
	peer     peer         // the client's process
	frames   atomic.Uint64
	watch    watchState
}

// half is one direction of a stream: what src sends, on its way to dst.
type half struct {
	// send is dst's window for this stream as it was when SETTINGS_INITIAL_WINDOW_SIZE was
	// sendBase (sendSize).
	send     window
	sendBase int64
	recv     window // what src may still send on this stream
	q        queue  // what waits for dst's window
	done     bool   // src ended its side (END_STREAM received)
	sentEnd  bool   // that end went out to dst
	// listed says the stream is on dst's waiting list (listLocked); moved is when bytes of
	// q last left, or began to wait: an answer whose client's window stays shut past
	// Limits.WindowTimeout is reset.
	listed bool
	moved  time.Time
}

// item is a frame waiting for dst's window: data, or a header block.
type item struct {
	data    []byte
	headers []hpack.HeaderField
	end     bool
}

// stream is one call the relay carries, whatever its kind.
type stream struct {
	path         string
	downID, upID uint32 // the client's id (0 for a forwarded call, which has none), the server's
	up           *upstream
	kind         streamKind
	// req and ans are the ways the request and the answer take, set as the stream begins: from
	// the client (or a handler, Forward) to a server (or a handler, Unary), and back.
	req, ans     dir
	toUp, toDown half
	token        any
	observed     bool // the observer's Begin saw the call: its End will
	code         codes.Code
	headersSent  bool // the client has the response headers
	removed      bool
	// held is what s holds against the budget (chargeLocked); timer ends s at its deadline or
	// RequestTimeout, expired says it did.
	held    int64
	timer   *time.Timer
	expired bool
}

// dir is one direction of forwarding: from src to dst.
type dir struct {
	src, dst *endpoint
	toUp     bool
}

func (d dir) half(s *stream) *half {
	if d.toUp {
		return &s.toUp
	}
	return &s.toDown
}

func (d dir) dstID(s *stream) uint32 {
	if d.toUp {
		return s.upID
	}
	return s.downID
}

func (d dir) srcID(s *stream) uint32 {
	if d.toUp {
		return s.downID
	}
	return s.upID
}

// connError ends a connection with a GOAWAY.
type connError struct {
	code   http2.ErrCode
	reason string
}

func (e connError) Error() string { return fmt.Sprintf("HTTP/2 %v: %s", e.code, e.reason) }

// readClient reads the client's frames until its connection ends.
func (ss *session) readClient() error {
	for {
		ss.down.throttle()
		f, err := ss.down.fr.ReadFrame()
		ss.frames.Add(1)
		var se http2.StreamError
		switch {
		case errors.As(err, &se):
			ss.reset(ss.streamByDown(se.StreamID), se.Code, true)
			ss.rstClient(se.StreamID, se.Code)
		case err != nil:
			if code, ok := goAwayCode(err); ok {
				ss.down.goAway(ss.lastIDLocked(), code)
			}
			return err
		default:
			if err := ss.clientFrame(f); err != nil {
				if code, ok := goAwayCode(err); ok {
					ss.down.goAway(ss.lastIDLocked(), code)
				}
				return err
			}
		}
		if !ss.down.frameBuffered() {
			ss.startClocks()
			ss.flushAll()
			ss.closeIfDrained()
		}
	}
}

// goAwayCode is the GOAWAY code a failure to read a peer's frames ends its connection with:
// none when the connection itself broke.
func goAwayCode(err error) (http2.ErrCode, bool) {
	var ce http2.ConnectionError
	var own connError
	switch {
	case errors.As(err, &own):
		return own.code, true
	case errors.As(err, &ce):
		return http2.ErrCode(ce), true
	case errors.Is(err, http2.ErrFrameTooLarge):
		return http2.ErrCodeFrameSize, true
	}
	return 0, false
}

func (ss *session) lastIDLocked() uint32 {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return ss.lastID
}

func (ss *session) streamByDown(id uint32) *stream {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return ss.streams[id]
}

// flushAll writes what is buffered for every connection of the session: frames that arrived
// together leave together, in one write.
func (ss *session) flushAll() {
	var buf [4]*endpoint
	for _, e := range ss.endpoints(buf[:0]) {
		ss.flush(e)
	}
}

// endpoints appends the session's connections to eps: the client's, and its upstreams.
func (ss *session) endpoints(eps []*endpoint) []*endpoint {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	eps = append(eps, ss.down)
	for u := range ss.upConns {
		eps = append(eps, u.ep)
	}
	return eps
}

// flush encodes e's queued WINDOW_UPDATEs and wakes e's writer.
func (ss *session) flush(e *endpoint) {
	ss.mu.Lock()
	if len(e.updates) > 0 {
		_ = e.encode(func() error {
			for _, u := range e.updates {
				if err := e.fr.WriteWindowUpdate(u.id, u.inc); err != nil {
					return err
				}
			}
			return nil
		})
		e.updates = e.updates[:0]
	}
	ss.mu.Unlock()
	e.flush()
}

func (ss *session) clientFrame(f http2.Frame) error {
	switch f := f.(type) {
	case *http2.MetaHeadersFrame:
		return ss.clientHeaders(f)
	case *http2.DataFrame:
		ss.mu.Lock()
		t, err := ss.dataLocked(dir{src: ss.down, toUp: true}, ss.streams[f.StreamID], f)
		ss.unlock(t)
		return err
	case *http2.SettingsFrame:
		return ss.settings(ss.down, nil, f)
	case *http2.WindowUpdateFrame:
		return ss.windowUpdate(ss.down, nil, f)
	case *http2.PingFrame:
		ss.down.pong(f)
	case *http2.RSTStreamFrame:
		ss.reset(ss.streamByDown(f.StreamID), f.ErrCode, true)
		ss.mu.Lock()
		if f.StreamID <= ss.lastID && !ss.wasClosed(f.StreamID) {
			ss.noteClosedLocked(f.StreamID)
		}
		ss.mu.Unlock()
	case *http2.PushPromiseFrame:
		return connError{http2.ErrCodeProtocol, "a client sent PUSH_PROMISE"}
	}
	// GOAWAY: the client opens no more streams and closes the connection when it is done.
	// PRIORITY and frames of unknown types are ignored, as HTTP/2 says.
	return nil
}

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
	if !s.removed && !s.toUp.done {
		ss.clocks = append(ss.clocks, clock{s, arrived, timeout, ok})
	}
	ss.mu.Unlock()
	return err
}

// route starts s where its target says: answered at once, answered in the process, or passed
// to a server.
func (ss *session) route(s *stream, f *http2.MetaHeadersFrame, target *Target, fields []hpack.HeaderField) error {
	switch {
	case target == nil:
		ss.answerLocal(s, codes.Unimplemented, "unknown method "+s.path)
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
	up, err := ss.lockUpstream(target)
	if err != nil {
		ss.answerLocal(s, codes.Unavailable, status.Convert(err).Message())
		return nil
	}
	t, err := ss.passLocked(s, up, fields)
	ss.unlock(t)
	return err
}

// passLocked opens s on up, the connection to its server, and sends the client's header block
// on. mu is held.
func (ss *session) passLocked(s *stream, up *upstream, fields []hpack.HeaderField) (todo, error) {
	switch {
	case ss.closed:
		s.kind = answered{}
		ss.removeLocked(s)
		return todo{ended: s}, errors.New("session closed")
	case up.maxStreams > 0 && uint32(len(up.streams)) >= up.maxStreams:
		return ss.answerLocalLocked(s, codes.Unavailable, fmt.Sprintf("%s allows %d calls at once on a connection", up.target.Name, up.maxStreams)), nil
	case ss.draining && ss.srv.LongLived != nil && ss.srv.LongLived(s.path):
		// Shutdown began while the call was routed: it ends as drain ends the others.
		return ss.answerLocalLocked(s, codes.Unavailable, ss.srv.ShutdownMessage), nil
	}
	s.kind, s.up, s.upID = passthrough{}, up, up.nextID
	up.nextID += 2
	s.req.dst, s.ans.src = up.ep, up.ep
	s.toUp.openSend(up.ep)
	s.toDown.openSend(ss.down)
	s.toUp.sentEnd = s.toUp.done
	ss.streams[s.downID] = s
	up.streams[s.upID] = s
	return todo{}.frame(up.ep, s.upID, item{headers: fields, end: s.toUp.done}), nil
}

// answerLocal answers a call with a gRPC status and no message; what the client still sends
// on it is dropped.
func (ss *session) answerLocal(s *stream, code codes.Code, msg string) {
	ss.mu.Lock()
	ss.unlock(ss.answerLocalLocked(s, code, msg))
}

// answerLocalLocked is answerLocal under mu.
func (ss *session) answerLocalLocked(s *stream, code codes.Code, msg string) todo {
	s.kind, s.code, s.headersSent = answered{}, code, true
	s.toDown.done, s.toDown.sentEnd = true, true
	s.toUp.sentEnd = s.toUp.done
	t := todo{}.frame(ss.down, s.downID, item{headers: grpcStatus(code, msg, true), end: true})
	if s.toUp.done {
		ss.removeLocked(s)
		t.ended = s
	} else {
		ss.streams[s.downID] = s
	}
	return t
}

// drain starts the session's end for Shutdown: the client is told to open no more calls, the
// long-lived ones end with Unavailable, and the connection closes once the last call ended.
func (ss *session) drain() {
	last, long, started := ss.beginDrain()
	if !started {
		// Not past the preface yet: there is nothing to tell it.
		ss.down.close()
		return
	}
	ss.down.goAway(last, http2.ErrCodeNo)
	for _, s := range long {
		ss.failStream(s, codes.Unavailable, ss.srv.ShutdownMessage)
		if s.up != nil {
			s.up.ep.writeRST(s.upID, http2.ErrCodeCancel)
		}
	}
	ss.flushAll()
	ss.closeIfDrained()
}

// beginDrain marks the session draining and returns the client's last stream id and the
// long-lived calls, unless the client's preface has not come yet (started false).
func (ss *session) beginDrain() (last uint32, long []*stream, started bool) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	ss.draining = true
	if !ss.started {
		return 0, nil, false
	}
	for _, s := range ss.streams {
		if ss.srv.LongLived != nil && ss.srv.LongLived(s.path) {
			long = append(long, s)
		}
	}
	return ss.lastID, long, true
}

// closeIfDrained closes the client's connection once a draining session has no call left; its
// reader then ends the session. Called after a flush, so the last answers are out.
func (ss *session) closeIfDrained() {
	ss.mu.Lock()
	done := ss.draining && len(ss.streams) == 0
	ss.mu.Unlock()
	if done {
		// What the last calls' answers left in out goes first.
		ss.down.closeAfterFlush(closeGrace)
	}
}

// close ends the session: every upstream connection closes, and the calls still open end.
func (ss *session) close() {
	ss.down.shutdown() // a GOAWAY the reader wrote last leaves first, within closeGrace
	ss.mu.Lock()
	ss.closed = true
	if ss.watch.timer != nil {
		ss.watch.timer.Stop()
	}
	var open []*stream
	for _, s := range ss.streams {
		open = append(open, s)
		s.code = codes.Canceled
		ss.removeLocked(s)
	}
	for u := range ss.upConns {
		ss.closeUpstreamLocked(u)
	}
	ss.mu.Unlock()
	ss.upReaders.Wait()
	for _, s := range open {
		ss.observeEnd(s)
	}
}

func headerValue(fields []hpack.HeaderField, name string) string {
	for _, f := range fields {
		if f.Name == name {
			return f.Value
		}
	}
	return ""
}
