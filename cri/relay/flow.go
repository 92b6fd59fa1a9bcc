package relay

// Passing frames between the sides: HTTP/2 flow control both ways, the queues of what waits for
// a window, and a stream's end.

import (
	"errors"
	"fmt"

	"golang.org/x/net/http2"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// dataLocked handles a DATA frame from d.src on s (nil when the stream is unknown or gone);
// called with mu held, it releases it.
func (ss *session) dataLocked(d dir, s *stream, f *http2.DataFrame) error {
	n := int64(f.Header().Length)
	payload := f.Data()
	if d.src.recv.receive(n) != http2.ErrCodeNo {
		ss.mu.Unlock()
		return connError{http2.ErrCodeFlowControl, "sent more than the connection's window"}
	}
	if s == nil || s.removed {
		// A stream that ended (or was reset): the bytes go back to the connection's window.
		ss.credit(d, nil, n)
		ss.mu.Unlock()
		return nil
	}
	h := d.half(s)
	if h.recv.receive(n) != http2.ErrCodeNo || h.done {
		ss.credit(d, nil, n)
		ss.mu.Unlock()
		ss.resetAndTell(s, http2.ErrCodeFlowControl)
		return nil
	}
	// Padding is not passed on: it goes back at once.
	ss.credit(d, s, n-int64(len(payload)))
	h.done = f.StreamEnded()
	if s.unary != nil && d.toUp {
		return ss.unaryDataLocked(d, s, payload, h.done)
	}
	if len(payload) == 0 && !h.done {
		// Nothing to pass on.
		ss.mu.Unlock()
		return nil
	}
	if s.local || (d.toUp && s.dropUp) {
		ss.credit(d, s, int64(len(payload)))
		if h.done {
			h.sentEnd = true
			ss.endLocked(s)
			return nil
		}
		ss.mu.Unlock()
		return nil
	}
	return ss.sendLocked(d, s, item{data: payload, end: h.done})
}

// sendLocked sends it to d.dst as far as the windows allow and queues the rest (copied: the
// framer reuses its buffers). Called with mu held, it releases it.
func (ss *session) sendLocked(d dir, s *stream, it item) error {
	if s.fwd != nil && !d.toUp {
		return ss.collectLocked(d, s, it)
	}
	h := d.half(s)
	if h.q.empty() {
		n := int64(len(it.data))
		if it.headers != nil || (n <= h.send.size() && n <= d.dst.send.size()) {
			// The usual case: all of it goes now, from the framer's buffer.
			if it.headers == nil {
				h.send.spend(n)
				d.dst.send.spend(n)
				ss.credit(d, s, n)
			}
			one := [1]item{it}
			return ss.writeLocked(d, s, one[:], nil)
		}
	}
	h.q.push(it)
	out, done := ss.takeLocked(d, s)
	return ss.writeLocked(d, s, out, done)
}

// takeLocked takes from s's queue toward d.dst what the windows allow; the chunks it returns
// go back to the pool once written. mu is held.
func (ss *session) takeLocked(d dir, s *stream) ([]item, []*[]byte) {
	h := d.half(s)
	n := max(min(h.send.size(), d.dst.send.size()), 0)
	before := h.q.size
	out, done := h.q.take(n)
	sent := before - h.q.size
	h.send.spend(sent)
	d.dst.send.spend(sent)
	ss.credit(d, s, sent)
	return out, done
}

// writeLocked writes out to d.dst and then gives done back to the pool. Called with mu held,
// it takes dst's write lock before it lets mu go, so that frames leave in the order their
// windows were counted.
func (ss *session) writeLocked(d dir, s *stream, out []item, done []*[]byte) error {
	defer release(done)
	if len(out) == 0 {
		ss.mu.Unlock()
		return nil
	}
	h := d.half(s)
	for _, it := range out {
		if it.end {
			h.sentEnd = true
		}
	}
	ended := ss.removeIfDone(s)
	id := d.dstID(s)
	d.dst.wmu.Lock()
	maxFrame := d.dst.peerMaxFrame
	ss.mu.Unlock()
	var err error
	for _, it := range out {
		if it.headers != nil {
			err = d.dst.writeHeaders(id, it.headers, it.end, maxFrame)
		} else {
			err = d.dst.fr.WriteData(id, it.end, it.data)
		}
		if err != nil {
			break
		}
	}
	d.dst.wmu.Unlock()
	if ended {
		ss.observeEnd(s)
	}
	if err != nil && d.toUp {
		ss.upstreamFailed(s.up, err)
	}
	// A client that cannot be written to shows in the client's reader, which ends the session.
	return nil
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

// endLocked is removeIfDone followed by the observer's End; called with mu held, it releases
// it.
func (ss *session) endLocked(s *stream) {
	ended := ss.removeIfDone(s)
	ss.mu.Unlock()
	if ended {
		ss.observeEnd(s)
	}
}

// removeLocked forgets s; what it still held in its queues goes back to the connections'
// windows. mu is held.
func (ss *session) removeLocked(s *stream) {
	if s.unary != nil && s.unary.cancel != nil {
		s.unary.cancel() // the handler's call ends with it
	}
	s.removed = true
	if ss.streams[s.downID] == s {
		delete(ss.streams, s.downID)
	}
	if s.up == nil {
		// Answered in the process: what it still held goes back to the pool.
		s.toDown.q.drop()
		return
	}
	if s.up.streams[s.upID] == s {
		delete(s.up.streams, s.upID)
	}
	ss.credit(dir{src: ss.fromClient(s)}, nil, s.toUp.q.drop())
	ss.credit(dir{src: s.up.ep}, nil, s.toDown.q.drop())
	if s.up.gone && len(s.up.streams) == 0 {
		ss.closeUpstreamLocked(s.up)
	}
}

// fromClient is where what s sends to its server comes from: the client, or for a forwarded
// call the handler, whose bytes have no window to give back.
func (ss *session) fromClient(s *stream) *endpoint {
	if s.fwd != nil {
		return ss.self
	}
	return ss.down
}

func (ss *session) observeEnd(s *stream) {
	if ss.srv.Observer != nil && s.fwd == nil { // a forwarded call is its handler's to count
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
	if !s.toDown.done {
		s.code = resetCode(code)
	}
	ss.removeLocked(s)
	up := s.up
	ss.mu.Unlock()
	if s.fwd != nil {
		s.fwd.end(status.Errorf(resetCode(code), "stream terminated by RST_STREAM with error code: %v", code))
		toClient = false // it has none
	}
	if toClient {
		ss.rstClient(s.downID, code)
	}
	if toUp && up != nil {
		up.ep.writeRST(s.upID, upCode)
	}
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
		switch st.ID {
		case http2.SettingInitialWindowSize:
			ss.mu.Lock()
			delta := int64(st.Val) - e.peerInitWindow
			e.peerInitWindow = int64(st.Val)
			for _, s := range ss.streamsToward(e, u) {
				h := ss.halfToward(s, u)
				if code := h.send.shift(delta); code != http2.ErrCodeNo {
					ss.mu.Unlock()
					return connError{code, "window above 2^31-1"}
				}
			}
			ss.mu.Unlock()
			grow = grow || delta > 0
		case http2.SettingMaxConcurrentStreams:
			if u != nil {
				ss.mu.Lock()
				u.maxStreams = st.Val
				ss.mu.Unlock()
			}
		case http2.SettingMaxFrameSize:
			ss.mu.Lock()
			e.peerMaxFrame = st.Val
			ss.mu.Unlock()
		case http2.SettingHeaderTableSize:
			e.wmu.Lock()
			e.henc.SetMaxDynamicTableSize(st.Val)
			e.wmu.Unlock()
		}
		return nil
	})
	if err != nil {
		return err
	}
	e.wmu.Lock()
	err = e.fr.WriteSettingsAck()
	e.wmu.Unlock()
	if err != nil {
		return err
	}
	if grow {
		ss.sendPending(e, u, 0)
	}
	return nil
}

// windowUpdate applies a peer's WINDOW_UPDATE and sends what waited for it.
func (ss *session) windowUpdate(e *endpoint, u *upstream, f *http2.WindowUpdateFrame) error {
	ss.mu.Lock()
	if f.StreamID == 0 {
		if code := e.send.update(f.Increment); code != http2.ErrCodeNo {
			ss.mu.Unlock()
			return connError{code, "connection window above 2^31-1"}
		}
		ss.mu.Unlock()
		ss.sendPending(e, u, 0)
		return nil
	}
	s := ss.streams[f.StreamID]
	if u != nil {
		s = u.streams[f.StreamID]
	}
	if s == nil {
		ss.mu.Unlock()
		return nil
	}
	h := ss.halfToward(s, u)
	if code := h.send.update(f.Increment); code != http2.ErrCodeNo {
		ss.mu.Unlock()
		ss.resetAndTell(s, code)
		return nil
	}
	ss.mu.Unlock()
	ss.sendPending(e, u, f.StreamID)
	return nil
}

// sendPending sends what waits for e's windows: on the stream id (e's own id), or on every
// stream when id is 0.
func (ss *session) sendPending(e *endpoint, u *upstream, id uint32) {
	ss.mu.Lock()
	var ids []*stream
	if id != 0 {
		if s := ss.lookupToward(u, id); s != nil {
			ids = append(ids, s)
		}
	} else {
		ids = ss.streamsToward(e, u)
	}
	ss.mu.Unlock()
	for _, s := range ids {
		ss.mu.Lock()
		if s.removed {
			ss.mu.Unlock()
			continue
		}
		d := dir{dst: e, toUp: u != nil}
		switch {
		case u != nil:
			d.src = ss.fromClient(s)
		case s.up != nil:
			d.src = s.up.ep
		case s.unary != nil:
			d.src = ss.self
		default:
			ss.mu.Unlock()
			continue
		}
		out, done := ss.takeLocked(d, s)
		_ = ss.writeLocked(d, s, out, done) // a broken connection shows in its reader
	}
}

func (ss *session) lookupToward(u *upstream, id uint32) *stream {
	if u != nil {
		return u.streams[id]
	}
	return ss.streams[id]
}

// streamsToward lists the streams whose data goes to e (the client when u is nil). mu is held.
func (ss *session) streamsToward(e *endpoint, u *upstream) []*stream {
	m := ss.streams
	if u != nil {
		m = u.streams
	}
	out := make([]*stream, 0, len(m))
	for _, s := range m {
		out = append(out, s)
	}
	return out
}

func (ss *session) halfToward(s *stream, u *upstream) *half {
	if u != nil {
		return &s.toUp
	}
	return &s.toDown
}
