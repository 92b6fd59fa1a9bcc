package relay

// Passing a call's frames between its sides: DATA and header blocks to where the stream's kind
// sends them, and the stream's end. The steps that decide run under the session's mu and
// return what is left to do once it is let go (after); what goes to a connection is put to its
// sender, whose owner writes it.

import (
	"slices"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// after is what a step taken under the session's mu leaves for once mu is let go: none of it
// may run under mu, because it writes (kicks a sender), calls out (the observer, the log) or
// takes the lock again (a reset).
type after struct {
	kicks   [3]*sender // senders put events to; a call has two sides
	more    []*sender  // and beyond the three, should a step ever put to more
	ended   *stream    // the stream the step forgot: the observer's End
	handler func()     // a Unary target's call, run in a goroutine of its own
	// reset is reset on both sides with code: an error in what a side sent.
	reset *stream
	code  http2.ErrCode
	note  *refusal // what the client did that the step refused, to report
}

// kick notes that s was put events.
func (a *after) kick(s *sender) {
	if s == nil || slices.Contains(a.kicks[:], s) || slices.Contains(a.more, s) {
		return
	}
	if i := slices.Index(a.kicks[:], nil); i >= 0 {
		a.kicks[i] = s
		return
	}
	a.more = append(a.more, s)
}

// merge adds b's kicks to a's.
func (a *after) merge(b after) {
	for _, k := range b.kicks {
		a.kick(k)
	}
	for _, k := range b.more {
		a.kick(k)
	}
}

// after does a, once mu is let go. The kicks of a reader's step (c, the connection it reads)
// wait for its flush, so that the frames of one read leave in one write; nil kicks now.
func (ss *session) after(c *conn, a after) {
	if a.note != nil {
		ss.report(*a.note) // counted before the client learns of it
	}
	for _, k := range append(a.kicks[:], a.more...) {
		switch {
		case k == nil:
		case c != nil:
			c.touch(k)
		default:
			k.kick()
		}
	}
	if a.ended != nil {
		ss.observeEnd(a.ended)
	}
	if a.handler != nil {
		ss.srv.handlers.Go(a.handler)
	}
	if a.reset != nil {
		ss.resetAndTell(a.reset, a.code)
	}
}

// data takes a DATA frame from c, the client's connection (up nil) or up's, its payload lent
// from c's read buffer.
func (ss *session) data(c *conn, up *upstream, d dataFrame) error {
	if !c.recv.receive(d.length) {
		return connError{http2.ErrCodeFlowControl, "sent more than the connection's window"}
	}
	ss.mu.Lock()
	to, a := ss.dataLocked(c, up, d)
	ss.mu.Unlock()
	if to != nil {
		c.lend(to, d.payload, d.end)
	}
	ss.after(c, a)
	return nil
}

// dataLocked decides where d goes: the stream it is lent to, or nil when its stream's kind took
// it, or it was dropped (unknown or ended stream). mu is held.
func (ss *session) dataLocked(c *conn, up *upstream, d dataFrame) (*sendStream, after) {
	var a after
	s := ss.streams[d.id]
	if up != nil {
		s = up.streams[d.id]
	}
	if s == nil || s.removed {
		// A stream that ended (or was reset): the bytes go back to the connection's window.
		a.kick(c.give(0, nil, d.length))
		if up == nil && !ss.wasReset(d.id) && ss.wasClosed(d.id) {
			// Closed by the client's END_STREAM or RST_STREAM (RFC 9113 §5.1).
			ss.rstClientLocked(d.id, http2.ErrCodeStreamClosed)
			a.kick(c.out)
		}
		return nil, a
	}
	w := &s.ans
	if up == nil {
		w = &s.req
	}
	switch {
	case w.done:
		// Half-closed (remote): its sender ended it (RFC 9113 §5.1).
		a.kick(c.give(0, nil, d.length))
		a.reset, a.code = s, http2.ErrCodeStreamClosed
		return nil, a
	case !w.recv.receive(d.length):
		a.kick(c.give(0, nil, d.length))
		a.reset, a.code = s, http2.ErrCodeFlowControl
		return nil, a
	}
	// Padding is not passed on: it goes back at once.
	a.kick(c.give(w.fromID, w.recv, d.length-int64(len(d.payload))))
	if d.end {
		w.done = true
		w.recv.shut.Store(true)
		if w == &s.req {
			ss.wholeLocked(s)
		}
	}
	if len(d.payload) == 0 && !d.end {
		return nil, a
	}
	to, b := s.kind.data(ss, s, w, d.payload, d.end)
	b.merge(a)
	return to, b
}

// dropLocked drops bytes, from the client, of a stream that wants no more of the request: its
// window goes back at once, and its end ends the stream's request. mu is held.
func (ss *session) dropLocked(s *stream, n int64, end bool) after {
	var a after
	a.kick(s.req.from.give(s.req.fromID, s.req.recv, n))
	if end {
		s.req.closed = true
		ss.endLocked(s, &a)
	}
	return a
}

// headersLocked puts a header block of s on its way w, to w's sender. mu is held.
func (ss *session) headersLocked(w *way, fields []hpack.HeaderField, end bool) after {
	var a after
	w.to.out.put(event{kind: evHeaders, st: w.to, fields: fields, end: end, held: headerListSize(fields)})
	a.kick(w.to.out)
	return a
}

// send puts data and header blocks of s, from a handler, on its way w (a Unary answer, a
// Forward request) unless s has gone: it says whether s is still there. The items go with one
// kick, so that an answer's headers, message and trailers leave in one write.
func (ss *session) send(s *stream, w *way, items ...item) bool {
	ss.mu.Lock()
	there := !s.removed
	if there {
		for _, it := range items {
			if w == &s.ans && it.headers != nil && !it.end {
				s.headersSent = true
			}
			if it.end {
				w.done = true
			}
			if it.headers != nil {
				w.to.out.put(event{kind: evHeaders, st: w.to, fields: it.headers, end: it.end, held: headerListSize(it.headers)})
			} else {
				w.to.out.putOwned(w.to, it.data, it.end)
			}
		}
	}
	ss.mu.Unlock()
	w.to.out.kick()
	return there
}

// putOwned puts DATA of st from bytes the caller will not touch again.
func (s *sender) putOwned(st *sendStream, p []byte, end bool) { s.putCopy(st, p, end) }

// wayEnded is the senders' hook: the end of st's way went out. s is forgotten once both its
// ways have ended.
func (ss *session) wayEnded(st *sendStream) {
	s := st.s
	if s == nil {
		return // a stream answered before it became a call (notPost)
	}
	var a after
	ss.mu.Lock()
	if s.req.to == st {
		s.req.closed = true
	} else {
		s.ans.closed = true
	}
	ss.endLocked(s, &a)
	ss.mu.Unlock()
	ss.after(nil, a)
}

// endLocked forgets s once both its ways have ended: the observer's End follows. mu is held.
func (ss *session) endLocked(s *stream, a *after) {
	if s.removed || !s.req.closed || !s.ans.closed {
		return
	}
	ss.removeLocked(s, noRST, noRST)
	a.ended = s
}

// rstCode is the RST_STREAM a stream's removal sends to one side, if any.
type rstCode struct {
	send bool
	code http2.ErrCode
}

var noRST rstCode

func rst(code http2.ErrCode) rstCode { return rstCode{true, code} }

// removeLocked forgets s: what its senders still hold of it is dropped (and given back to the
// windows of where it came from), and down and up are the RST_STREAMs its client and its
// server are told. mu is held.
func (ss *session) removeLocked(s *stream, down, up rstCode) {
	s.kind.removed()
	s.removed = true
	if s.timer != nil {
		s.timer.Stop()
	}
	if s.downID != 0 && s.req.done {
		ss.noteClosedLocked(s.downID)
	}
	if ss.streams[s.downID] == s {
		delete(ss.streams, s.downID)
		if len(ss.streams) == 0 {
			ss.idleSince = time.Now()
		}
	}
	for _, w := range []*way{&s.req, &s.ans} {
		if w.recv != nil {
			w.recv.shut.Store(true)
		}
	}
	// The answer's way goes to the client; the request's to the server.
	dropSend(s.ans.to, s.ans.closed, down)
	dropSend(s.req.to, s.req.closed, up)
	ss.releaseLocked(s, s.held)
	if s.up == nil {
		return
	}
	if s.up.streams[s.upID] == s {
		delete(s.up.streams, s.upID)
	}
	if s.up.gone && len(s.up.streams) == 0 {
		ss.closeUpstreamLocked(s.up)
	}
}

// dropSend tells st's sender that its way ended without its end (closed: it did), and to reset
// it on the peer when r says so. The caller kicks the sender.
func dropSend(st *sendStream, closed bool, r rstCode) {
	if st == nil || (closed && !r.send) {
		return
	}
	held := int64(0)
	if r.send {
		held = rstSize
	}
	st.out.put(event{kind: evReset, st: st, rst: r.send, code: r.code, held: held})
	st.out.kickSoon()
}

// rstSize is a RST_STREAM frame's size, what it is charged while it waits.
const rstSize = 13

func (ss *session) observeEnd(s *stream) {
	if s.observed {
		ss.srv.Observer.End(s.token, s.code)
	}
}

// reset ends s after a RST_STREAM from one side and passes it on to the other.
func (ss *session) reset(s *stream, code http2.ErrCode, fromClient bool) {
	ss.resetStream(s, code, !fromClient, fromClient, code)
}

// resetAndTell resets s on both sides after an error found in what one side sent.
func (ss *session) resetAndTell(s *stream, code http2.ErrCode) {
	ss.resetStream(s, code, true, true, http2.ErrCodeCancel)
}

// resetStream ends s with code: the client is told when toClient, the server (with upCode)
// when toUp. A call whose answer came whole keeps the answer's code.
func (ss *session) resetStream(s *stream, code http2.ErrCode, toClient, toUp bool, upCode http2.ErrCode) {
	if s == nil {
		return
	}
	ss.mu.Lock()
	if s.removed {
		ss.mu.Unlock()
		return
	}
	if !s.ans.done {
		s.code = deadlineCode(s, resetCode(code))
	}
	client := s.kind.abort(status.Errorf(resetCode(code), "stream terminated by RST_STREAM with error code: %v", code))
	down, up := noRST, noRST
	if toClient && client {
		down = rst(code)
		ss.noteResetLocked(s.downID)
	}
	if toUp && s.up != nil {
		up = rst(upCode)
	}
	ss.removeLocked(s, down, up)
	ss.mu.Unlock()
	ss.observeEnd(s)
}

// resetCode is the gRPC code a client sees for a stream reset with code.
func resetCode(code http2.ErrCode) codes.Code {
	switch code {
	case http2.ErrCodeCancel:
		return codes.Canceled
	case http2.ErrCodeRefusedStream:
		return codes.Unavailable
	case http2.ErrCodeEnhanceYourCalm:
		return codes.ResourceExhausted
	}
	return codes.Internal
}

// failStream ends s with a gRPC status, dropping what it still held: the client is told unless
// its answer went out whole already, and the server with a RST_STREAM CANCEL when rstUp.
func (ss *session) failStream(s *stream, code codes.Code, msg string, rstUp bool) {
	ss.mu.Lock()
	a := ss.failLocked(s, code, msg, rstUp)
	ss.mu.Unlock()
	ss.after(nil, a)
}

// failLocked is failStream under mu.
func (ss *session) failLocked(s *stream, code codes.Code, msg string, rstUp bool) after {
	if s.removed {
		return after{}
	}
	trailersOnly, answered := !s.headersSent, s.ans.done
	s.code = code
	tell := s.kind.abort(status.Error(code, msg)) && !answered
	up := noRST
	if rstUp && s.up != nil {
		up = rst(http2.ErrCodeCancel)
	}
	a := after{ended: s}
	if tell {
		// What waits of the answer is dropped; the status ends it.
		fields := grpcStatus(code, msg, trailersOnly)
		s.ans.done, s.ans.closed = true, true
		s.ans.to.out.put(event{kind: evReset, st: s.ans.to, fields: fields, held: headerListSize(fields)})
		a.kick(s.ans.to.out)
	}
	ss.removeLocked(s, noRST, up)
	return a
}

// streamReset is the senders' hook: a sender reset st on its peer with code (a header block
// over the peer's limit, a window past 2^31-1); the other side is told, as gRPC's server does.
func (ss *session) streamReset(st *sendStream, code http2.ErrCode) {
	s := st.s
	if st.out == ss.down.out {
		ss.noteReset(s.downID)
		ss.resetStream(s, code, false, true, http2.ErrCodeCancel)
		return
	}
	ss.resetStream(s, code, true, false, code)
}
