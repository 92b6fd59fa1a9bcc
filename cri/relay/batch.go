package relay

// What a sender writes in one go: the frames it encoded (control frames, header blocks, DATA
// frames' 9-byte headers) in an arena of pooled buffers, and DATA payloads where they already
// are — a stream's queue, or the reader's buffer that lent them — gathered by one writev, so a
// payload is never copied into an output buffer.

import (
	"encoding/binary"
	"sync"

	"golang.org/x/net/http2"
)

const (
	// maxBatch bounds the bytes one batch gathers while the socket takes what it is given:
	// enough that a large answer leaves in few writes, little enough that when the socket
	// stops taking it (the rest goes to the writer goroutine) the bytes already gathered,
	// which every stream's next turn waits behind, are few.
	maxBatch = 64 << 10
	// slowBatch bounds the writer goroutine's batches, to a peer that reads slower than it is
	// sent to: grpc-go's write buffer. A small answer that comes then waits behind this and
	// the socket's buffer, not behind a big answer's bytes (issue 47, F3).
	slowBatch = 32 << 10
	// maxIovecs bounds a batch's buffers: one writev takes at most IOV_MAX (1024) of them.
	maxIovecs = 512
	// arenaSize is the size of the arena's buffers.
	arenaSize = 16 << 10
)

var arenas = sync.Pool{New: func() any { b := make([]byte, 0, arenaSize); return &b }}

// batch is what a sender is writing: its buffers in order, and a mark at the end of each frame
// that says what the frame's leaving sets off. Only the sender's owner touches it.
type batch struct {
	iov []([]byte) // the buffers, in order
	// next is the first buffer not all written, off the bytes of it written.
	next, off int
	// marks are the frames in order, by the offset where each ends; those up to written have
	// left (left).
	marks   []mark
	gone    int   // marks[:gone] have left
	written int64 // bytes of the batch written so far
	size    int64 // bytes of the batch in all
	arena   []*[]byte
	// tail is where the last buffer of iov begins in the last arena buffer, -1 when the last
	// buffer is not the arena's: encoded frames that follow one another join it.
	tail   int
	chunks []*[]byte // queue chunks the payloads point into: back to the pool once written
	// lent says iov holds bytes a reader lent (sender.lend): they are copied before the
	// lender gets control back unless they were written (keepLent).
	lent bool
}

// mark is one frame of a batch, and what its leaving sets off.
type mark struct {
	end int64 // the batch's offset where the frame ends
	// st and n: n bytes of st's DATA, given back to the connection they came from once they
	// have left.
	st *sendStream
	n  int64
	// held is what the frame was charged against the budget; response says it answers
	// something the peer sent (the reader's throttle counts those).
	held     int64
	response bool
	// lent is the index in iov of a payload a reader lent, -1 for none.
	lent int
}

func (b *batch) empty() bool { return b.size == b.written }

// Write appends p, one encoded frame (the framer writes each frame with one call), to the
// arena; it never fails.
func (b *batch) Write(p []byte) (int, error) {
	b.appendEncoded(p)
	return len(p), nil
}

// appendEncoded copies p to the arena and adds it to iov, joining the last buffer when that is
// the arena bytes just before.
func (b *batch) appendEncoded(p []byte) {
	n := len(p)
	k := len(b.arena)
	if k == 0 || cap(*b.arena[k-1])-len(*b.arena[k-1]) < n {
		a := arenas.Get().(*[]byte)
		if cap(*a) < n {
			arenas.Put(a)
			big := make([]byte, 0, n)
			a = &big
		}
		b.arena = append(b.arena, a)
		b.tail = -1
	}
	a := b.arena[len(b.arena)-1]
	start := len(*a)
	*a = append(*a, p...)
	if b.tail >= 0 && len(b.iov) > 0 {
		b.iov[len(b.iov)-1] = (*a)[b.tail:len(*a):len(*a)]
	} else {
		b.iov = append(b.iov, (*a)[start:len(*a):len(*a)])
		b.tail = start
	}
	b.size += int64(n)
}

// control ends the frame just encoded: what it was charged, and whether it answers the peer.
func (b *batch) control(held int64, response bool) {
	b.marks = append(b.marks, mark{end: b.size, held: held, response: response, lent: -1})
}

// data adds a DATA frame of st carrying payload, which stays where it is until written.
func (b *batch) data(st *sendStream, payload []byte, end bool, held int64, lent bool) {
	var h [9]byte
	h[0], h[1], h[2] = byte(len(payload)>>16), byte(len(payload)>>8), byte(len(payload))
	h[3] = byte(http2.FrameData)
	if end {
		h[4] = byte(http2.FlagDataEndStream)
	}
	binary.BigEndian.PutUint32(h[5:], st.id)
	b.appendEncoded(h[:])
	m := mark{st: st, n: int64(len(payload)), held: held, lent: -1}
	if len(payload) > 0 {
		if lent {
			m.lent = len(b.iov)
			b.lent = true
		}
		b.iov = append(b.iov, payload)
		b.tail = -1
		b.size += int64(len(payload))
	}
	m.end = b.size
	b.marks = append(b.marks, m)
}

// full says the batch gathered enough for one write of at most limit bytes.
func (b *batch) full(limit int64) bool {
	return b.size-b.written >= limit || len(b.iov)-b.next >= maxIovecs
}

// pending is what is left to write: the buffers from next, the first without its written part.
func (b *batch) pending(yield func([]byte) bool) {
	for i := b.next; i < len(b.iov); i++ {
		p := b.iov[i]
		if i == b.next {
			p = p[b.off:]
		}
		if !yield(p) {
			return
		}
	}
}

// advance counts n more bytes written.
func (b *batch) advance(n int) {
	b.written += int64(n)
	for n > 0 {
		if rest := len(b.iov[b.next]) - b.off; rest > n {
			b.off += n
			return
		} else {
			n -= rest
		}
		b.next++
		b.off = 0
	}
}

// left is the frames whose last byte has been written since the last call: they have left.
func (b *batch) left() []mark {
	i := b.gone
	for i < len(b.marks) && b.marks[i].end <= b.written {
		i++
	}
	done := b.marks[b.gone:i]
	b.gone = i
	return done
}

// keepLent copies what is left of lent payloads, so that the lender may reuse its buffer:
// called before the lender gets control back with the batch not all written.
func (b *batch) keepLent() {
	if !b.lent {
		return
	}
	b.lent = false
	for i := b.gone; i < len(b.marks); i++ {
		m := &b.marks[i]
		if m.lent < 0 {
			continue
		}
		if k := m.lent; k >= b.next {
			// A payload is a frame's at most, a chunk of the queues' pool: back to it with the
			// batch's own.
			c := chunks.Get().(*[]byte)
			*c = append((*c)[:0], b.iov[k]...)
			b.iov[k] = *c
			b.chunks = append(b.chunks, c)
		}
		m.lent = -1
	}
}

// reset gives back what the batch borrowed, once it is all written.
func (b *batch) reset() {
	for _, a := range b.arena {
		if cap(*a) == arenaSize {
			*a = (*a)[:0]
			arenas.Put(a)
		}
	}
	release(b.chunks)
	clear(b.iov)
	clear(b.arena)
	clear(b.chunks)
	clear(b.marks)
	*b = batch{iov: b.iov[:0], marks: b.marks[:0], arena: b.arena[:0], chunks: b.chunks[:0], tail: -1}
}
