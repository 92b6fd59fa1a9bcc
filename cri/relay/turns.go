package relay

// What the owner of a sender decides: the events put to it, the streams' windows and queues,
// and whose turn it is. Control frames go first, as they come; each stream with bytes and a
// window then takes a turn of at most turnSize bytes, in order, so that a small answer never
// waits for the whole of a big one on the same connection (grpc-go's writer takes the same
// 16 KiB turns).

import (
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// turnSize is the most of one stream's DATA a turn sends.
const turnSize = 16 << 10

// evKind is what an event asks of the owner.
type evKind uint8

const (
	evOpen     evKind = iota // st begins: its window counts from now
	evHeaders                // a header block of st (fields, end)
	evData                   // bytes of st (chunk, end)
	evReset                  // st ends: what waits is dropped; RST_STREAM code when rst
	evRST                    // RST_STREAM id code, for a stream the sender does not know
	evWindow                 // the peer's WINDOW_UPDATE id inc
	evCredit                 // podgate's WINDOW_UPDATE id inc: the peer may send more
	evSettings               // the peer's SETTINGS, to apply and acknowledge
	evPreface                // podgate's first frames (preface: the client preface too)
	evPing                   // PING data (ack: the answer to the peer's)
	evGoAway                 // GOAWAY id code
	evClose                  // close once what came before is written
)

// event is one thing put to a sender.
type event struct {
	kind     evKind
	end      bool
	ack      bool // evPing: an answer; evPreface: with the client preface
	rst      bool // evReset: tell the peer
	response bool // it answers something the peer sent: counted for the reader's throttle
	code     http2.ErrCode
	id, inc  uint32
	st       *sendStream
	chunk    *[]byte // evData: the bytes, in a chunk of the pool the event owns
	fields   []hpack.HeaderField
	settings []http2.Setting
	ping     [8]byte
	held     int64 // what it was charged against the budget
}

// discard drops an event a dead sender will never take: its bytes go back where they came from.
func (ev *event) discard() {
	if ev.kind == evData && ev.chunk != nil {
		ev.st.credit.drop(int64(len(*ev.chunk)))
		release([]*[]byte{ev.chunk})
	}
}

// sendStream is one stream's direction toward the sender's peer, as its owner keeps it.
type sendStream struct {
	id  uint32
	out *sender // the sender it belongs to
	s   *stream // the session's call, for the hooks
	// credit is where its DATA came from: their windows get it back as it leaves.
	credit creditTo
	// Under the owner alone:
	window  window // the peer's window for the stream, as SETTINGS_INITIAL_WINDOW_SIZE was base
	base    int64
	q       queue
	known   bool // opened at the owner
	wire    bool // the peer knows the stream: it opened it, or its HEADERS went out
	ready   bool // on the ring
	waits   bool // on the waiting list
	done    bool // its end went out, or it was reset: forgotten
	rstSent bool
	held    int64 // what its queue was charged
	// waitingSince is when bytes of it began to wait on a shut window, 0 when none wait so
	// (unix nanoseconds): the session resets an answer whose client keeps its window shut for
	// Limits.WindowTimeout.
	waitingSince atomicTime
}

// newSendStream is the direction toward out's peer of a call that peerOpened or podgate opens.
func newSendStream(out *sender, id uint32, s *stream, from creditTo, peerOpened bool) *sendStream {
	return new(sendStream).init(out, id, s, from, peerOpened)
}

// init makes st newSendStream's, in place (a stream keeps its two in itself: one allocation a
// call, not three).
func (st *sendStream) init(out *sender, id uint32, s *stream, from creditTo, peerOpened bool) *sendStream {
	st.id, st.out, st.s, st.credit, st.wire = id, out, s, from, peerOpened
	return st
}

// sendSize is what the peer lets st send now: its window, moved by every change of the peer's
// SETTINGS_INITIAL_WINDOW_SIZE since st began (RFC 9113 §6.9.2), which SETTINGS records once,
// in the owner, rather than in each of up to MaxStreams streams.
func (st *sendStream) sendSize(o *owner) int64 {
	return st.window.size() + o.initWindow - st.base
}

// take applies ev; from now on what it was charged is the owner's to give back.
func (s *sender) take(ev *event) {
	o := &s.o
	o.held += ev.held
	switch ev.kind {
	case evOpen:
		s.open(ev.st)
	case evHeaders:
		st := ev.st
		s.open(st)
		switch {
		case st.done:
			s.unheld(ev.held)
			if ev.response {
				s.responses.Add(-1)
			}
		case st.q.empty():
			s.headers(st, ev.fields, ev.end, ev.held, ev.response)
		default: // trailers, after the bytes that wait
			st.q.push(item{headers: ev.fields, end: ev.end, held: ev.held})
			st.held += ev.held
			if ev.response {
				s.responses.Add(-1) // it waits for the stream's window, not for the reader
			}
			s.ready(st)
		}
	case evData:
		st := ev.st
		s.open(st)
		if st.done {
			s.unheld(ev.held)
			ev.discard()
			return
		}
		st.q.pushChunk(ev.chunk, ev.end)
		st.held += ev.held
		s.ready(st)
	case evReset:
		s.end1(ev)
	case evWindow:
		s.unheld(ev.held)
		s.peerWindow(ev.id, ev.inc)
	case evSettings:
		s.settings(ev.settings)
		_ = o.fr.WriteSettingsAck()
		o.b.control(ev.held, ev.response)
	case evClose:
		s.unheld(ev.held)
		o.closing = true
	default:
		s.control(ev)
	}
}

// control encodes a control frame: it goes before the streams' turns.
func (s *sender) control(ev *event) {
	o := &s.o
	switch ev.kind {
	case evRST:
		_ = o.fr.WriteRSTStream(ev.id, ev.code)
	case evCredit:
		_ = o.fr.WriteWindowUpdate(ev.id, ev.inc)
	case evPreface:
		if ev.ack {
			o.b.appendEncoded([]byte(http2.ClientPreface))
		}
		_ = o.fr.WriteSettings(ev.settings...)
		_ = o.fr.WriteWindowUpdate(0, connWindow-initialWindow)
	case evPing:
		_ = o.fr.WritePing(ev.ack, ev.ping)
	case evGoAway:
		_ = o.fr.WriteGoAway(ev.id, ev.code, nil)
	}
	o.b.control(ev.held, ev.response)
}

// drop lets an event go untaken (after evClose, or at the end): its bytes go back.
func (s *sender) drop(ev *event) {
	if ev.response {
		s.responses.Add(-1)
	}
	s.charge(-ev.held)
	ev.discard()
}

// unheld gives back n bytes the owner took charge of and will not write.
func (s *sender) unheld(n int64) {
	if n != 0 {
		s.o.held -= n
		s.charge(-n)
	}
}

// open starts st's window at the owner, once.
func (s *sender) open(st *sendStream) {
	if st.known {
		return
	}
	st.known = true
	st.window, st.base = newWindow(s.o.initWindow), s.o.initWindow
	s.o.streams[st.id] = st
}

// headers encodes a header block of st, unless it is larger than the peer's
// SETTINGS_MAX_HEADER_LIST_SIZE: then st is reset (INTERNAL_ERROR, as gRPC's server does) and
// the session told.
func (s *sender) headers(st *sendStream, fields []hpack.HeaderField, end bool, held int64, response bool) {
	o := &s.o
	if o.maxHeaderList > 0 && headerListSize(fields) > int64(o.maxHeaderList) {
		s.unheld(held)
		if response {
			s.responses.Add(-1)
		}
		s.fail(st, http2.ErrCodeInternal)
		return
	}
	o.hbuf.Reset()
	for _, f := range fields {
		_ = o.henc.WriteField(f)
	}
	block := o.hbuf.Bytes()
	maxFrame := maxFrame // the smallest SETTINGS_MAX_FRAME_SIZE a peer may have
	for first := true; first || len(block) > 0; first = false {
		n := min(len(block), maxFrame)
		frag := block[:n]
		block = block[n:]
		if first {
			_ = o.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: st.id, BlockFragment: frag, EndStream: end, EndHeaders: len(block) == 0})
		} else {
			_ = o.fr.WriteContinuation(st.id, len(block) == 0, frag)
		}
	}
	o.b.control(held, response)
	st.wire = true
	s.sentStream.Store(true)
	if end {
		s.finish(st)
	}
}

// finish forgets st once its end went out, and tells the session.
func (s *sender) finish(st *sendStream) {
	st.done = true
	st.waitingSince.clear()
	delete(s.o.streams, st.id)
	s.o.notes = append(s.o.notes, note{st: st})
}

// end1 ends ev.st as the session says: what waits is dropped (its bytes go back to where they
// came from), then the peer is told — with a header block ending the stream (ev.fields: a
// status), or a RST_STREAM (ev.rst) — when it knows the stream.
func (s *sender) end1(ev *event) {
	st := ev.st
	s.open(st)
	st.credit.drop(st.q.drop())
	s.unheld(st.held)
	st.held = 0
	switch {
	case ev.fields != nil && !st.done:
		s.headers(st, ev.fields, true, ev.held, false)
	default:
		// After the end went out too: a server still answering is told the call is over.
		s.reset(st, ev.rst, ev.code, ev.held)
	}
}

// reset forgets st: what waits is dropped (its bytes go back to where they came from), and the
// peer is told with a RST_STREAM when rst and it knows the stream.
func (s *sender) reset(st *sendStream, rst bool, code http2.ErrCode, held int64) {
	s.open(st)
	if rst && st.wire && !st.rstSent {
		st.rstSent = true
		_ = s.o.fr.WriteRSTStream(st.id, code)
		s.o.b.control(held, false)
	} else {
		s.unheld(held)
	}
	s.forget(st)
}

// forget drops what st has queued and forgets it.
func (s *sender) forget(st *sendStream) {
	o := &s.o
	st.credit.drop(st.q.drop())
	s.unheld(st.held)
	st.held = 0
	st.done = true
	st.waitingSince.clear()
	delete(o.streams, st.id)
}

// fail resets st on the peer with code, for the owner's own reason, and tells the session.
func (s *sender) fail(st *sendStream, code http2.ErrCode) {
	s.reset(st, true, code, 0)
	s.o.notes = append(s.o.notes, note{st: st, code: code, reset: true})
}

// ready puts st on the ring, once.
func (s *sender) ready(st *sendStream) {
	if !st.ready && !st.done {
		st.ready = true
		s.o.ring = append(s.o.ring, st)
	}
}

// fill gathers the next batch, of at most limit bytes: the streams take their turns, in order,
// while the batch has room.
func (s *sender) fill(limit int64) {
	o := &s.o
	for !o.b.full(limit) && o.head < len(o.ring) {
		st := o.ring[o.head]
		o.ring[o.head] = nil
		o.head++
		st.ready = false
		if !st.done && s.turn(st) {
			s.ready(st)
		}
	}
	if o.head == len(o.ring) {
		o.ring, o.head = o.ring[:0], 0
	} else if o.head > len(o.ring)/2 {
		n := copy(o.ring, o.ring[o.head:])
		clear(o.ring[n:])
		o.ring, o.head = o.ring[:n], 0
	}
}

// turn sends st's next slice: up to turnSize bytes of its DATA as the windows allow, and its
// trailers or end once no byte waits before them. It says whether st may send more now.
func (s *sender) turn(st *sendStream) bool {
	o := &s.o
	n := max(min(turnSize, st.sendSize(o), o.window.size()), 0)
	before := st.q.size
	items, done := st.q.take(n)
	o.b.chunks = append(o.b.chunks, done...)
	if sent := before - st.q.size; sent > 0 {
		st.window.spend(sent)
		o.window.spend(sent)
		st.held -= sent // the batch's now, until written
		st.waitingSince.clear()
	}
	for _, it := range items {
		if it.headers != nil {
			st.held -= it.held
			s.headers(st, it.headers, it.end, it.held, false)
			continue
		}
		o.b.data(st, it.data, it.end, int64(len(it.data)), false)
		s.sentStream.Store(true)
		if it.end {
			s.finish(st)
		}
	}
	if st.done || st.q.empty() {
		return false
	}
	if st.q.size > 0 && (st.sendSize(o) <= 0 || o.window.size() <= 0) {
		// Its bytes wait for a window: a WINDOW_UPDATE or SETTINGS puts it back.
		st.waitingSince.setIfZero(time.Now())
		if !st.waits {
			st.waits = true
			o.waiting = append(o.waiting, st)
		}
		return false
	}
	return true
}

// borrow takes DATA of st whose bytes a reader lends (conn.lend): written from where they are
// when st's turn is now, else copied into st's queue.
func (s *sender) borrow(st *sendStream, p []byte, end bool) {
	o := &s.o
	s.open(st)
	n := int64(len(p))
	switch {
	case st.done:
		st.credit.drop(n)
		return
	case st.q.empty() && o.head == len(o.ring) && n <= st.sendSize(o) && n <= o.window.size() &&
		(!o.b.full(maxBatch) || s.drain()):
		// Its turn is now (nothing waits before it, the windows take it), and the batch has
		// room, or makes room by being written.
		st.window.spend(n)
		o.window.spend(n)
		o.b.data(st, p, end, 0, true)
		s.sentStream.Store(true)
		if end {
			s.finish(st)
		}
		return
	}
	for first := true; first || len(p) > 0; first = false {
		c := chunks.Get().(*[]byte)
		k := min(len(p), chunkSize)
		*c = append((*c)[:0], p[:k]...)
		p = p[k:]
		st.q.pushChunk(c, end && len(p) == 0)
	}
	o.held += n
	st.held += n
	s.charge(n)
	s.ready(st)
}

// broke ends the connection for a rule of HTTP/2 the peer broke: the session sends the GOAWAY.
func (s *sender) broke(code http2.ErrCode, reason string) {
	s.o.notes = append(s.o.notes, note{code: code, reason: reason})
}

// atomicTime is a moment the owner sets and others read: unix nanoseconds, 0 for none.
type atomicTime struct{ ns atomic.Int64 }

func (t *atomicTime) setIfZero(now time.Time) { t.ns.CompareAndSwap(0, now.UnixNano()) }
func (t *atomicTime) clear()                  { t.ns.Store(0) }

// since is how long ago it was set, false when it is not.
func (t *atomicTime) since(now time.Time) (time.Duration, bool) {
	ns := t.ns.Load()
	if ns == 0 {
		return 0, false
	}
	return now.Sub(time.Unix(0, ns)), true
}

// headerListSize is a header block's size as SETTINGS_MAX_HEADER_LIST_SIZE counts it (RFC 9113
// §6.5.2): each field's name and value and 32 bytes. What a header block waits with is charged
// this (its encoding is no larger).
func headerListSize(fields []hpack.HeaderField) int64 {
	var n int64
	for _, f := range fields {
		n += int64(f.Size())
	}
	return n
}
