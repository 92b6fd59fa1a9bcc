package relay

import (
	"encoding/binary"
	"net"
	"slices"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// conn is one HTTP/2 connection of a session: the client's, or one to a target. Its reader
// goroutine alone reads its frames (next) and uses held and touched; its sender owns
// everything written to it.
type conn struct {
	nc   net.Conn
	rb   *readBuf
	fr   *http2.Framer // reads only
	recv *recvWindow   // what the peer may still send on the connection
	out  *sender

	// held are the senders the reader owns for the frames of this read, to lend them DATA
	// from its buffer (lend); flush lets them write and go. touched are the senders it put
	// events to; flush kicks them, so that the frames of one read leave in one write.
	held    []*sender
	touched []*sender
	// framed says a DATA frame came through the framer's buffer: it is lent until the flush.
	framed bool
}

func newConn(nc net.Conn, maxHeaderList uint32, grow bool, hooks senderHooks) *conn {
	c := &conn{nc: nc, rb: newReadBuf(nc, readBuffer, grow), recv: newRecvWindow(connWindow), out: newSender(nc, hooks)}
	c.fr = http2.NewFramer(nil, c.rb)
	c.fr.SetMaxReadFrameSize(maxFrame)
	c.fr.SetReuseFrames() // a frame is handled before the next is read
	// HPACK's decoder counts the header list as it decodes it and keeps nothing past the limit.
	c.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	c.fr.MaxHeaderListSize = maxHeaderList
	return c
}

// give gives n bytes the peer sent back to its windows — the connection's, and the stream id's
// (w) unless nil — once they were passed on, consumed or dropped. It returns the sender it put
// WINDOW_UPDATEs to, for the caller to kick, nil when the bytes wait for more (batched) or
// the peer ended the stream.
func (c *conn) give(id uint32, w *recvWindow, n int64) *sender {
	var put bool
	if inc := c.recv.credit(n, connWindow/4); inc > 0 {
		c.out.put(event{kind: evCredit, inc: inc, held: windowUpdateSize})
		put = true
	}
	if w != nil {
		if inc := w.credit(n, streamWindow/4); inc > 0 {
			c.out.put(event{kind: evCredit, id: id, inc: inc, held: windowUpdateSize})
			put = true
		}
	}
	if put {
		return c.out
	}
	return nil
}

// windowUpdateSize is a WINDOW_UPDATE frame's size, what it is charged while it waits.
const windowUpdateSize = 13

// dataFrame is a DATA frame whose payload is still in the connection's read buffer.
type dataFrame struct {
	id      uint32
	length  int64 // the frame's length, padding included: what flow control counts
	payload []byte
	end     bool
}

// next reads the connection's next frame. A DATA frame comes as d (isData), its payload where it
// is — in the read buffer when the frame was whole there, else in the framer's — valid until
// the next frame is read into the same place, which the reader's flush comes before (safe).
// Any other frame comes as f, through the framer.
func (c *conn) next() (f http2.Frame, d dataFrame, isData bool, err error) {
	if d, ok, err := c.peekData(); ok || err != nil {
		return nil, d, true, err
	}
	f, err = c.fr.ReadFrame()
	if df, ok := f.(*http2.DataFrame); ok && err == nil {
		// Not whole in the buffer when the read began: the framer's buffer holds it until the
		// framer reads the next frame, which the flush comes before too.
		c.framed = true
		return nil, dataFrame{id: df.StreamID, length: int64(df.Length), payload: df.Data(), end: df.StreamEnded()}, true, nil
	}
	return f, dataFrame{}, false, err
}

// peekData takes the next frame if it is a DATA frame whole in the read buffer, checked as the
// framer checks one (RFC 9113 §6.1).
func (c *conn) peekData() (dataFrame, bool, error) {
	h, length, ok := c.peekHeader()
	if !ok || http2.FrameType(h[3]) != http2.FrameData || length > maxFrame || c.rb.buffered() < 9+length {
		return dataFrame{}, false, nil // the framer's (a frame too large is its error)
	}
	flags := http2.Flags(h[4])
	id := binary.BigEndian.Uint32(h[5:9]) & (1<<31 - 1)
	payload := c.rb.peek(9 + length)[9:]
	if id == 0 {
		return dataFrame{}, false, connError{http2.ErrCodeProtocol, "DATA frame with stream ID 0"}
	}
	if flags.Has(http2.FlagDataPadded) {
		if length == 0 || int(payload[0]) > length-1 {
			return dataFrame{}, false, connError{http2.ErrCodeProtocol, "pad size larger than the DATA frame"}
		}
		payload = payload[1 : length-int(payload[0])]
	}
	c.rb.take(9 + length)
	return dataFrame{id: id, length: int64(length), payload: payload, end: flags.Has(http2.FlagDataEndStream)}, true, nil
}

// peekHeader is the next frame's header and length when it is in the read buffer.
func (c *conn) peekHeader() ([]byte, int, bool) {
	if c.rb.buffered() < 9 {
		return nil, 0, false
	}
	h := c.rb.peek(9)
	return h, int(h[0])<<16 | int(h[1])<<8 | int(h[2]), true
}

// safe says whether the next frame can be read without reading into the buffer (it is whole
// there, and so is its header block: a HEADERS frame that ends it) nor into the framer's while
// it holds a frame's bytes that are lent.
func (c *conn) safe() bool {
	if c.framed {
		return false
	}
	h, length, ok := c.peekHeader()
	for !ok || c.rb.buffered() < 9+length {
		// A frame begun and not whole, on a connection to a target: what the socket already
		// holds comes first, so that the frames of several of the target's writes leave in
		// one — unless its answers wait (the reader's throttle comes first then).
		if c.rb.buffered() == 0 || c.out.responses.Load() > maxResponses || !c.rb.more() {
			return false
		}
		h, length, ok = c.peekHeader()
	}
	switch http2.FrameType(h[3]) {
	case http2.FrameHeaders, http2.FramePushPromise:
		return http2.Flags(h[4]).Has(http2.FlagHeadersEndHeaders)
	}
	return true
}

// lend hands st's sender DATA read from this connection, its bytes lent from the read buffer.
// The reader becomes the sender's owner for the rest of this read when it can: the bytes then
// leave from where they are, with the rest of this read's, in one write at the flush. Else it
// copies them for the owner.
func (c *conn) lend(st *sendStream, p []byte, end bool) {
	s := st.out
	if !slices.Contains(c.held, s) {
		if !s.busy.CompareAndSwap(false, true) {
			s.putCopy(st, p, end)
			c.touch(s)
			return
		}
		c.held = append(c.held, s)
	}
	s.apply() // what was put before (the stream's HEADERS) goes first
	s.borrow(st, p, end)
}

// touch notes that s was put events: the flush kicks it.
func (c *conn) touch(s *sender) {
	if s != nil && !slices.Contains(c.touched, s) {
		c.touched = append(c.touched, s)
	}
}

// flush ends a read: the senders the reader owns write what it gave them (without waiting:
// what the socket does not take goes to their writer goroutines, lent bytes copied), and those
// it put events to are kicked.
func (c *conn) flush() {
	c.framed = false
	for len(c.held) > 0 {
		s := c.held[len(c.held)-1]
		c.held = c.held[:len(c.held)-1]
		s.run(false)
	}
	c.rb.release() // what was lent is written or copied
	for len(c.touched) > 0 {
		s := c.touched[len(c.touched)-1]
		c.touched = c.touched[:len(c.touched)-1]
		s.kick()
	}
}

// putCopy puts DATA of st whose bytes are only lent, copied into chunks of the pool.
func (s *sender) putCopy(st *sendStream, p []byte, end bool) {
	for first := true; first || len(p) > 0; first = false {
		c := chunks.Get().(*[]byte)
		k := min(len(p), chunkSize)
		*c = append((*c)[:0], p[:k]...)
		p = p[k:]
		s.put(event{kind: evData, st: st, chunk: c, end: end && len(p) == 0, held: int64(k)})
	}
}
