package relay

// Passing frames between the sides: HTTP/2 flow control both ways, the queues of what waits for
// a window, and a stream's end. The steps here run under the session's mu and return what is
// left to do once it is let go (a todo, for ss.unlock).

import (
	"errors"
	"fmt"
	"time"

	"golang.org/x/net/http2"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// dataLocked takes a DATA frame from d.src (d.toUp when it is the client's) on s, nil when the
// stream is unknown or gone. mu is held.
func (ss *session) dataLocked(d dir, s *stream, f *http2.DataFrame) (todo, error) {
	n := int64(f.Header().Length)
	payload := f.Data()
	if d.src.recv.receive(n) != http2.ErrCodeNo {
		return todo{}, connError{http2.ErrCodeFlowControl, "sent more than the connection's window"}
	}
	if s == nil || s.removed {
		// A stream that ended (or was reset): the bytes go back to the connection's window.
		ss.credit(d, nil, n)
		if id := f.StreamID; d.toUp && !ss.wasReset(id) && ss.wasClosed(id) {
			// Closed by the client's END_STREAM or RST_STREAM (RFC 9113 §5.1).
			return todo{rstID: id, rstCode: http2.ErrCodeStreamClosed}, nil
		}
		return todo{}, nil
	}
	h := d.half(s)
	if h.done {
		// Half-closed (remote): its sender ended it (RFC 9113 §5.1).
		ss.credit(d, nil, n)
		return todo{reset: s, code: http2.ErrCodeStreamClosed}, nil
	}
	if h.recv.receive(n) != http2.ErrCodeNo {
		ss.credit(d, nil, n)
		return todo{reset: s, code: http2.ErrCodeFlowControl}, nil
	}
	// Padding is not passed on: it goes back at once.
	ss.credit(d, s, n-int64(len(payload)))
	h.done = f.StreamEnded()
	if len(payload) == 0 && !h.done {
		return todo{}, nil // nothing to pass on
	}
	it := item{data: payload, end: h.done}
	if d.toUp {
		return s.kind.request(ss, s, it), nil
	}
	return s.kind.answer(ss, s, it), nil
}

// dropLocked drops it, from the client, on a stream that wants no more of the request: its
// window goes back at once, and its end ends the stream's request. mu is held.
func (ss *session) dropLocked(s *stream, it item) todo {
	ss.credit(s.req, s, int64(len(it.data)))
	if !it.end {
		return todo{}
	}
	s.toUp.sentEnd = true
	return ss.endLocked(s)
}

// sendLocked sends it to d.dst as far as the windows allow and queues the rest (copied: the
// framer reuses its buffers). What waits counts against the budget, whichever way it goes: a
// client's request the server has no window for, an answer the client has none for. mu is
// held.
func (ss *session) sendLocked(d dir, s *stream, it item) todo {
	h := d.half(s)
	if h.q.empty() {
		n := int64(len(it.data))
		if it.headers != nil || (n <= h.sendSize(d.dst) && n <= d.dst.send.size() && n <= d.dst.room()) {
			// The usual case: all of it goes now, from the framer's buffer.
			if it.headers == nil {
				ss.spendLocked(d, s, n)
			}
			return ss.writeLocked(d, s, todo{one: it, hasOne: true})
		}
	}
	ss.forceChargeLocked(s, int64(len(it.data)))
	if h.q.empty() {
		h.moved = time.Now() // it begins to wait
	}
	h.q.push(it)
	out, done := ss.takeLocked(d, s)
	t := ss.writeLocked(d, s, todo{out: out, done: done})
	ss.listLocked(d, s)
	return t
}

// spendLocked counts n bytes of s going to d.dst now: out of the windows, into the endpoint's
// out until written, and back to d.src's windows. mu is held.
func (ss *session) spendLocked(d dir, s *stream, n int64) {
	d.half(s).send.spend(n)
	d.dst.send.spend(n)
	if d.dst.w != nil {
		d.dst.w.commit(n)
	}
	ss.credit(d, s, n)
}

// takeLocked takes from s's queue toward d.dst what the windows and the endpoint's room allow;
// the chunks it returns go back to the pool once written. mu is held.
func (ss *session) takeLocked(d dir, s *stream) ([]item, []*[]byte) {
	h := d.half(s)
	room := d.dst.room()
	n := max(min(h.sendSize(d.dst), d.dst.send.size(), room), 0)
	before := h.q.size
	out, done := h.q.take(n)
	sent := before - h.q.size
	if sent > 0 {
		ss.spendLocked(d, s, sent)
		ss.releaseLocked(s, sent)
		h.moved = time.Now()
	}
	if h.q.size > 0 && room <= n && d.dst.w != nil {
		d.dst.w.starved.Store(true) // the writer lets the rest go once it has made room
	}
	return out, done
}

// listLocked puts s on d.dst's waiting list while bytes of it wait toward d.dst. mu is held.
func (ss *session) listLocked(d dir, s *stream) {
	h := d.half(s)
	if h.listed || h.q.empty() || s.removed {
		return
	}
	h.listed = true
	d.dst.waiting = append(d.dst.waiting, s)
}

// writeLocked readies t's frames to go to d.dst on s: the ends they carry count as sent, and
// s is forgotten once both its directions have ended. mu is held; ss.unlock writes them.
func (ss *session) writeLocked(d dir, s *stream, t todo) todo {
	if !t.hasOne && len(t.out) == 0 {
		return t
	}
	h := d.half(s)
	if t.one.end {
		h.sentEnd = true
	}
	for _, it := range t.out {
		if it.end {
			h.sentEnd = true
		}
	}
	if ss.removeIfDone(s) {
		t.ended = s
	}
	t.dst, t.id = d.dst, d.dstID(s)
	return t
}

// credit gives n bytes back to d.src's windows: the connection's, and s's stream's when s is
// set and src may still send on it, once enough have been passed on to be worth a
// WINDOW_UPDATE (written at the next flush). mu is held.
func (ss *session) credit(d dir, s *stream, n int64) {
	if n <= 0 || d.src.conn == nil {
		return // nothing to give back to the answers of a Unary target
	}
	src := d.src
	if inc := src.recv.credit(n, connWindow/4); inc > 0 {
		src.updates = append(src.updates, windowUpdate{0, inc})
	}
	if s == nil {
		return
	}
	h := d.half(s)
	if h.done {
		return
	}
	if inc := h.recv.credit(n, streamWindow/4); inc > 0 {
		src.updates = append(src.updates, windowUpdate{d.srcID(s), inc})
	}
}

// removeIfDone forgets s once both its directions have ended; it says whether it did. mu is
// held.
func (ss *session) removeIfDone(s *stream) bool {
	if s.removed || !s.toUp.sentEnd || !s.toDown.sentEnd {
		return false
	}
	ss.removeLocked(s)
	return true
}

// endLocked is removeIfDone, with the observer's End to follow. mu is held.
func (ss *session) endLocked(s *stream) todo {
	if ss.removeIfDone(s) {
		return todo{ended: s}
	}
	return todo{}
}

// removeLocked forgets s; what it still held in its queues goes back to the windows of where
// it came from. mu is held.
func (ss *session) removeLocked(s *stream) {
	s.kind.removed()
	s.removed = true
	if s.timer != nil {
		s.timer.Stop()
	}
	if s.downID != 0 && s.toUp.done {
		ss.noteClosedLocked(s.downID)
	}
	if ss.streams[s.downID] == s {
		delete(ss.streams, s.downID)
		if len(ss.streams) == 0 {
			ss.idleSince = time.Now()
		}
	}
	ss.credit(s.req, nil, s.toUp.q.drop())
	ss.credit(s.ans, nil, s.toDown.q.drop())
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
	client, ok := ss.endReset(s, code)
	if !ok {
		return
	}
	if toClient && client {
		ss.rstClient(s.downID, code)
	}
	if toUp && s.up != nil {
		s.up.ep.writeRST(s.upID, upCode)
	}
	ss.observeEnd(s)
}

// endReset forgets s, reset with code; it says whether s was still there, and whether its
// client has a stream to be told.
func (ss *session) endReset(s *stream, code http2.ErrCode) (client, ok bool) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if s.removed {
		return false, false
	}
	if !s.toDown.done {
		s.code = deadlineCode(s, resetCode(code))
	}
	ss.removeLocked(s)
	return s.kind.abort(status.Errorf(resetCode(code), "stream terminated by RST_STREAM with error code: %v", code)), true
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

// settings applies a peer's SETTINGS. u is the upstream e belongs to, nil for the client.
func (ss *session) settings(e *endpoint, u *upstream, f *http2.SettingsFrame) error {
	if f.IsAck() {
		return nil
	}
	var grow bool
	err := f.ForeachSetting(func(st http2.Setting) error {
		if err := st.Valid(); err != nil {
			code := http2.ErrCodeProtocol
			var ce http2.ConnectionError
			if errors.As(err, &ce) {
				code = http2.ErrCode(ce)
			}
			return connError{code, fmt.Sprintf("setting %v: %v", st, err)}
		}
		if st.ID == http2.SettingHeaderTableSize {
			e.wmu.Lock()
			defer e.wmu.Unlock()
			e.henc.SetMaxDynamicTableSize(st.Val)
			return nil
		}
		ss.mu.Lock()
		defer ss.mu.Unlock()
		more, err := ss.settingLocked(e, u, st)
		grow = grow || more
		return err
	})
	if err != nil {
		return err
	}
	if err := e.encode(e.fr.WriteSettingsAck); err != nil { // leaves with the reader's next flush
		return err
	}
	if grow {
		ss.sendPending(e)
	}
	return nil
}

// settingLocked applies one of the peer's settings that the session's state holds; it says
// whether the streams' windows grew. mu is held.
func (ss *session) settingLocked(e *endpoint, u *upstream, st http2.Setting) (grow bool, err error) {
	switch st.ID {
	case http2.SettingInitialWindowSize:
		delta := int64(st.Val) - e.peerInitWindow
		e.peerInitWindow = int64(st.Val)
		if delta == 0 {
			return false, nil
		}
		// RFC 9113 §6.9.2: every open stream's window moves by the difference, which
		// sendSize reads from e; only a window that might pass 2^31-1 is looked for.
		if e.sendMost+e.peerInitWindow > maxWindow && ss.windowOverLocked(e, u) {
			return false, connError{http2.ErrCodeFlowControl, "window above 2^31-1"}
		}
		return delta > 0, nil
	case http2.SettingMaxConcurrentStreams:
		if u != nil {
			u.maxStreams = st.Val
		}
	case http2.SettingMaxFrameSize:
		e.peerMaxFrame = st.Val
	case http2.SettingMaxHeaderListSize:
		e.peerMaxHeaderList = st.Val
	}
	return false, nil
}

// windowUpdate applies a peer's WINDOW_UPDATE and sends what waited for it.
func (ss *session) windowUpdate(e *endpoint, u *upstream, f *http2.WindowUpdateFrame) error {
	ss.mu.Lock()
	if f.StreamID == 0 {
		code := e.send.update(f.Increment)
		waiting := len(e.waiting) > 0
		ss.mu.Unlock()
		if code != http2.ErrCodeNo {
			return connError{code, "connection window above 2^31-1"}
		}
		if waiting {
			ss.sendPending(e)
		}
		return nil
	}
	ss.unlock(ss.streamUpdateLocked(e, u, f))
	return nil
}

// streamUpdateLocked applies a WINDOW_UPDATE of a stream toward u (the client when nil) and
// takes what waited for it. mu is held.
func (ss *session) streamUpdateLocked(e *endpoint, u *upstream, f *http2.WindowUpdateFrame) todo {
	s := ss.streams[f.StreamID]
	if u != nil {
		s = u.streams[f.StreamID]
	}
	if s == nil {
		return todo{}
	}
	if code := ss.halfToward(s, u).updateSend(e, f.Increment); code != http2.ErrCodeNo {
		return todo{reset: s, code: code}
	}
	return ss.pendingLocked(s, u != nil)
}

// sendPending sends what waits toward e as far as the windows and e's room allow now. It
// walks e's waiting list, the streams with bytes queued toward e, not every stream: a
// WINDOW_UPDATE or SETTINGS costs what it lets go.
func (ss *session) sendPending(e *endpoint) {
	var ended []*stream
	var tooLarge []uint32
	ss.mu.Lock()
	list := e.waiting
	e.waiting = nil
	for _, s := range list {
		d := s.ans
		if s.req.dst == e {
			d = s.req
		}
		d.half(s).listed = false
		if s.removed {
			continue
		}
		out, done := ss.takeLocked(d, s)
		t := ss.writeLocked(d, s, todo{out: out, done: done})
		if t.dst != nil && errors.Is(t.dst.writeTodo(&t), errHeaderListTooLarge) {
			tooLarge = append(tooLarge, t.id)
		}
		release(done)
		if t.ended != nil {
			ended = append(ended, t.ended)
		}
		ss.listLocked(d, s)
	}
	ss.mu.Unlock()
	e.flush()
	for _, s := range ended {
		ss.observeEnd(s)
	}
	for _, id := range tooLarge {
		ss.headerListTooLarge(e, id)
	}
}

// pendingLocked takes what waits on s toward its server (toUp) or its client, as far as the
// windows allow. mu is held.
func (ss *session) pendingLocked(s *stream, toUp bool) todo {
	if s.removed {
		return todo{}
	}
	d := s.ans
	if toUp {
		d = s.req
	}
	out, done := ss.takeLocked(d, s)
	t := ss.writeLocked(d, s, todo{out: out, done: done})
	ss.listLocked(d, s)
	return t
}

// windowOverLocked says whether a stream's window toward e (u's, or the client's when u is
// nil) is above 2^31-1. mu is held.
func (ss *session) windowOverLocked(e *endpoint, u *upstream) bool {
	streams := ss.streams
	if u != nil {
		streams = u.streams
	}
	for _, s := range streams {
		if ss.halfToward(s, u).sendSize(e) > maxWindow {
			return true
		}
	}
	return false
}

// openSend opens the half's window toward dst at dst's SETTINGS_INITIAL_WINDOW_SIZE.
func (h *half) openSend(dst *endpoint) {
	h.send, h.sendBase = newWindow(dst.peerInitWindow), dst.peerInitWindow
}

// sendSize is what dst lets the half send now: its window, moved by every change of dst's
// SETTINGS_INITIAL_WINDOW_SIZE since the stream began (RFC 9113 §6.9.2). SETTINGS records the
// change once, in dst, rather than in each of up to MaxStreams streams. mu is held.
func (h *half) sendSize(dst *endpoint) int64 {
	return h.send.size() + dst.peerInitWindow - h.sendBase
}

// updateSend applies a WINDOW_UPDATE of the half's stream from dst. mu is held.
func (h *half) updateSend(dst *endpoint, inc uint32) http2.ErrCode {
	if code := h.send.update(inc); code != http2.ErrCodeNo {
		return code
	}
	if h.sendSize(dst) > maxWindow {
		return http2.ErrCodeFlowControl
	}
	dst.sendMost = max(dst.sendMost, h.send.size()-h.sendBase)
	return http2.ErrCodeNo
}

func (ss *session) halfToward(s *stream, u *upstream) *half {
	if u != nil {
		return &s.toUp
	}
	return &s.toDown
}
