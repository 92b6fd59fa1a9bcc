package relay

// The kinds of stream the relay carries, and what a step taken under the session's mu leaves
// for after it.

import (
	"errors"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// streamKind is what differs between the kinds of stream: where a call's request goes and
// where its answer comes from. The flow functions hand a stream's frames to its kind, so that
// none of them tests which kind of stream it holds.
type streamKind interface {
	// request takes it on its way to s's server (along s.req). mu is held.
	request(ss *session, s *stream, it item) todo
	// answer takes it on its way to s's client (along s.ans). mu is held.
	answer(ss *session, s *stream, it item) todo
	// stop is the kind s becomes when its server answered whole and reset the request: the
	// answer still goes out, what comes for the server does not. mu is held.
	stop() streamKind
	// removed is told that s is forgotten. mu is held.
	removed()
	// abort tells whoever waits for s's answer that s ended without it, with err (a gRPC
	// status); it says whether that is the client, for the caller to tell on the client's
	// stream. mu is held.
	abort(err error) (client bool)
}

// relayed is what the kinds do unless they do otherwise: pass each direction on within the
// windows, and nothing more when the stream ends. The kinds embed it.
type relayed struct{}

func (relayed) request(ss *session, s *stream, it item) todo { return ss.sendLocked(s.req, s, it) }
func (relayed) answer(ss *session, s *stream, it item) todo  { return ss.sendLocked(s.ans, s, it) }
func (relayed) removed()                                     {}
func (relayed) abort(error) bool                             { return true }

// passthrough is a call the relay passes between the client and a server, both ways, frame by
// frame: the relay's usual call.
type passthrough struct{ relayed }

func (passthrough) stop() streamKind { return answered{} }

// answered is a call whose answer is settled while the client may still send: the relay
// answered it itself (a status), or its server answered whole and reset the request. What the
// client still sends is dropped, and its window given back at once, as a server does.
type answered struct{ relayed }

func (answered) request(ss *session, s *stream, it item) todo { return ss.dropLocked(s, it) }
func (answered) stop() streamKind                             { return answered{} }

// request takes the request's bytes of a call answered in the process, and runs the handler
// once they are all there.
func (u *unaryCall) request(ss *session, s *stream, it item) todo {
	return ss.unaryRequestLocked(s, u, it)
}
func (u *unaryCall) stop() streamKind { return u }
func (u *unaryCall) removed() {
	if u.cancel != nil {
		u.cancel() // the handler's call ends with it
	}
}

// answer takes the answer of a forwarded call for the handler that waits for it.
func (fw *forwarded) answer(ss *session, s *stream, it item) todo {
	return ss.collectLocked(s, fw, it)
}
func (fw *forwarded) stop() streamKind { return fw }

// abort ends the handler's wait: a forwarded call has no client stream of its own.
func (fw *forwarded) abort(err error) bool {
	fw.end(err)
	return false
}

// todo is what a step taken under the session's mu leaves for after mu is let go: frames to
// write, and what the stream's end sets off. The steps return it rather than let mu go
// themselves, so that each is a plain function under the lock, and the one place that hands
// mu over to an endpoint's write lock is unlock.
type todo struct {
	dst *endpoint // where the frames go, nil when there are none
	id  uint32    // dst's stream id
	// one is the usual case, one frame written straight from the framer's buffer (no slice
	// to hold it); out the frames taken from a queue, with done their chunks.
	one    item
	hasOne bool
	out    []item
	done   []*[]byte
	ended  *stream // the stream the step forgot: the observer's End
	// handler is a Unary target's call, run in a goroutine of its own after the End.
	handler func()
	// reset is reset on both sides, last, with code: an error in what a side sent.
	reset *stream
	code  http2.ErrCode
	// rstID is a client stream reset with rstCode after the frames: one that has gone, or
	// one the relay answered before the client ended it, as gRPC's server does.
	rstID   uint32
	rstCode http2.ErrCode
	// note is what the client did that the step refused, to report.
	note *refusal
}

func (t todo) frame(dst *endpoint, id uint32, it item) todo {
	t.dst, t.id, t.one, t.hasOne = dst, id, it, true
	return t
}

// unlock encodes t's frames for their endpoint (in memory: nothing waits for a peer), lets
// mu go and then does the rest of t. Frames are encoded under mu, so that they leave in the
// order their windows were counted.
func (ss *session) unlock(t todo) {
	if t.note != nil {
		// Under mu, before the client learns of it: a rare line, rate-limited.
		ss.report(*t.note)
	}
	var err error
	if t.dst != nil {
		err = t.dst.writeTodo(&t)
	}
	ss.mu.Unlock()
	if t.rstID != 0 {
		ss.rstClient(t.rstID, t.rstCode)
	}
	if t.ended != nil {
		ss.observeEnd(t.ended)
	}
	if errors.Is(err, errHeaderListTooLarge) {
		ss.headerListTooLarge(t.dst, t.id)
	}
	release(t.done)
	if t.handler != nil {
		ss.srv.handlers.Go(t.handler)
	}
	if t.reset != nil {
		ss.resetAndTell(t.reset, t.code)
	}
}

// writeTodo encodes t's frames for e. The session's mu is held: the peer's limits are read
// under it.
func (e *endpoint) writeTodo(t *todo) error {
	maxFrame, maxList := e.peerMaxFrame, e.peerMaxHeaderList
	e.wmu.Lock()
	defer e.wmu.Unlock()
	if e.dead {
		return nil
	}
	if t.hasOne {
		if err := e.writeItem(t.id, t.one, maxFrame, maxList); err != nil {
			return err
		}
	}
	for _, it := range t.out {
		if err := e.writeItem(t.id, it, maxFrame, maxList); err != nil {
			return err
		}
	}
	return nil
}

// errHeaderListTooLarge is a header block larger than its peer's SETTINGS_MAX_HEADER_LIST_SIZE:
// not sent; its stream is reset instead.
var errHeaderListTooLarge = errors.New("header list larger than the peer's SETTINGS_MAX_HEADER_LIST_SIZE")

// writeItem writes it on stream id, unless it is a header block larger than maxList (0: no
// limit); the caller holds wmu.
func (e *endpoint) writeItem(id uint32, it item, maxFrame, maxList uint32) error {
	if it.headers != nil {
		if maxList > 0 && headerListSize(it.headers) > int64(maxList) {
			return errHeaderListTooLarge
		}
		return e.writeHeaders(id, it.headers, it.end, maxFrame)
	}
	e.out.data += int64(len(it.data))
	return e.fr.WriteData(id, it.end, it.data)
}

// headerListSize is a header block's size as SETTINGS_MAX_HEADER_LIST_SIZE counts it (RFC 9113
// §6.5.2): each field's name and value and 32 bytes.
func headerListSize(fields []hpack.HeaderField) int64 {
	var n int64
	for _, f := range fields {
		n += int64(f.Size())
	}
	return n
}

// headerListTooLarge resets the stream whose header block was too large for dst to take, as
// gRPC's server does: RST_STREAM INTERNAL_ERROR, and CANCEL to the other side.
func (ss *session) headerListTooLarge(dst *endpoint, id uint32) {
	if dst != ss.down {
		ss.mu.Lock()
		var s *stream
		for u := range ss.upConns {
			if u.ep == dst {
				s = u.streams[id]
			}
		}
		ss.mu.Unlock()
		ss.resetStream(s, http2.ErrCodeInternal, true, true, http2.ErrCodeInternal)
		return
	}
	s := ss.streamByDown(id)
	ss.rstClient(id, http2.ErrCodeInternal)
	ss.resetStream(s, http2.ErrCodeInternal, false, true, http2.ErrCodeCancel)
}
