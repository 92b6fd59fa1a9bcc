package relay

import (
	"bufio"
	"bytes"
	"net"
	"sync"
	"syscall"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// endpoint is one HTTP/2 connection: the client's, or an upstream one. Only its reader
// goroutine reads frames. Frames for the peer are encoded into memory (out) under wmu, by
// whichever goroutine has them, and written by whoever holds the writer's busy: the goroutine
// that flushed, as far as the socket takes them without waiting, then the endpoint's writer
// goroutine, the only one that waits for the peer. wmu is never held across a write, so a peer
// that stops reading blocks the writer goroutine alone, never a reader, a timer, a reset or a
// close (grpc-go's shape: one writer per connection, fed by a buffer).
type endpoint struct {
	conn net.Conn
	br   *bufio.Reader
	fr   *http2.Framer

	// wmu guards what is encoded for the peer: the framer's output, the HPACK encoder, out.
	wmu  sync.Mutex
	out  outBuffer
	henc *hpack.Encoder
	hbuf bytes.Buffer
	// closing (under wmu) makes the writer close the connection once out is written.
	closing bool
	// dead (under wmu) says the writer ended: what is encoded now is dropped.
	dead bool

	w *writer // nil for the session's own side (self), which has no connection

	// Under the session's mu:
	send           window // the peer's connection-level window for what podgate sends
	peerInitWindow int64  // the peer's SETTINGS_INITIAL_WINDOW_SIZE
	peerMaxFrame   uint32 // the peer's SETTINGS_MAX_FRAME_SIZE
	// peerMaxHeaderList is the peer's SETTINGS_MAX_HEADER_LIST_SIZE, 0 while it set none.
	peerMaxHeaderList uint32
	recv              window // what the peer may still send on the connection
	// sendMost bounds from above how far a stream's window toward the peer went past the
	// SETTINGS_INITIAL_WINDOW_SIZE it began with (half.updateSend): a SETTINGS frame looks
	// for a window over 2^31-1 only when this says there may be one.
	sendMost int64
	updates  []windowUpdate
	// waiting lists the streams with bytes queued toward this peer (see listLocked): what a
	// WINDOW_UPDATE of the connection, a larger window in SETTINGS or room in out may let go.
	waiting []*stream
}

// windowUpdate is a WINDOW_UPDATE waiting for the endpoint's next flush.
type windowUpdate struct {
	id  uint32
	inc uint32
}

// outRoom is how many bytes of DATA an endpoint takes into out before its writer has written
// them; what comes beyond waits in its stream's queue, counted against the budget, until the
// writer makes room. It bounds what a peer that stops reading makes the relay hold outside
// the queues, a few writes' worth.
const outRoom = 4 * writeBuffer

// closeGrace bounds how long an endpoint's last frames (a GOAWAY) may take to leave before its
// connection is closed anyway.
const closeGrace = time.Second

// endpointHooks is what an endpoint's writer tells its session.
type endpointHooks struct {
	// timeout bounds each write to the peer that makes no progress; 0 for none.
	timeout time.Duration
	// hold counts n more (or, negative, fewer) bytes of DATA held in out.
	hold func(n int64)
	// drained is called, without locks, once the writer made room in out for DATA that
	// waited for it.
	drained func(e *endpoint)
	// stalled is called, without locks, when a write made no progress within timeout; the
	// connection closes after it.
	stalled func()
}

func newEndpoint(c net.Conn, br *bufio.Reader, hooks endpointHooks) *endpoint {
	e := &endpoint{conn: c, br: br}
	e.fr = http2.NewFramer(&e.out, br)
	e.fr.SetMaxReadFrameSize(maxFrame)
	e.fr.SetReuseFrames() // a DATA frame is passed on or queued (copied) before the next is read
	e.henc = hpack.NewEncoder(&e.hbuf)
	e.send = newWindow(initialWindow)
	e.peerInitWindow = initialWindow
	e.peerMaxFrame = 16384
	e.recv = newWindow(connWindow)
	e.w = &writer{endpointHooks: hooks, wake: make(chan struct{}, 1), progress: make(chan struct{}, 1), quit: make(chan struct{}), done: make(chan struct{})}
	if sc, ok := c.(syscall.Conn); ok {
		e.w.raw, _ = sc.SyscallConn()
	}
	return e
}

// startWriter starts the writer goroutine, once: at the first write the socket did not take at
// once, or at the close. A connection whose peer takes what it is sent has none.
func (e *endpoint) startWriter() {
	e.w.start.Do(func() { go e.writeLoop() })
}

// writeSettings encodes podgate's SETTINGS and opens the connection window to connWindow; the
// caller holds wmu (encode) and flushes.
func (e *endpoint) writeSettings(settings ...http2.Setting) error {
	if err := e.fr.WriteSettings(settings...); err != nil {
		return err
	}
	return e.fr.WriteWindowUpdate(0, connWindow-initialWindow)
}

// writeHeaders encodes fields as one header block; the caller holds wmu.
func (e *endpoint) writeHeaders(id uint32, fields []hpack.HeaderField, end bool, maxFrame uint32) error {
	e.hbuf.Reset()
	for _, f := range fields {
		if err := e.henc.WriteField(f); err != nil {
			return err
		}
	}
	block := e.hbuf.Bytes()
	first := true
	for first || len(block) > 0 {
		n := min(len(block), int(maxFrame))
		frag := block[:n]
		block = block[n:]
		if first {
			if err := e.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: frag, EndStream: end, EndHeaders: len(block) == 0}); err != nil {
				return err
			}
			first = false
			continue
		}
		if err := e.fr.WriteContinuation(id, len(block) == 0, frag); err != nil {
			return err
		}
	}
	return nil
}

// encode runs write, which encodes frames for the peer, under wmu; nothing once the writer has
// ended. Encoding is into memory: only a frame the framer finds malformed fails.
func (e *endpoint) encode(write func() error) error {
	e.wmu.Lock()
	defer e.wmu.Unlock()
	if e.dead {
		return nil
	}
	return write()
}

// control encodes one frame with write and flushes it.
func (e *endpoint) control(write func() error) {
	_ = e.encode(write)
	e.flush()
}

// writeRST sends a RST_STREAM.
func (e *endpoint) writeRST(id uint32, code http2.ErrCode) {
	e.control(func() error { return e.fr.WriteRSTStream(id, code) })
}

// frameBuffered says whether the next frame is already whole in the read buffer, so that
// reading it will not block.
func (e *endpoint) frameBuffered() bool {
	n := e.br.Buffered()
	if n < 9 {
		return false
	}
	h, err := e.br.Peek(9)
	if err != nil {
		return false
	}
	length := int(h[0])<<16 | int(h[1])<<8 | int(h[2])
	return n >= 9+length
}

// pong answers a PING; it leaves with the reader's next flush.
func (e *endpoint) pong(f *http2.PingFrame) {
	if !f.IsAck() {
		_ = e.encode(func() error { return e.fr.WritePing(true, f.Data) })
	}
}

// goAway tells the peer the connection ends, and why.
func (e *endpoint) goAway(last uint32, code http2.ErrCode) {
	e.control(func() error { return e.fr.WriteGoAway(last, code, nil) })
}

// close closes the connection at once; the writer ends with it.
func (e *endpoint) close() {
	if e.w == nil {
		return
	}
	e.w.closeOnce.Do(func() {
		close(e.w.quit)
		_ = e.conn.Close()
		e.startWriter() // it ends the endpoint: what out holds given back, done closed
	})
}

// closeAfterFlush closes the connection once what is encoded has left, or after grace (at
// most), whichever comes first; it does not wait.
func (e *endpoint) closeAfterFlush(grace time.Duration) {
	if e.w == nil {
		return
	}
	e.w.closeSoon.Do(func() {
		e.setClosing()
		// Not flush: the caller may hold the session's mu, which what a write lets go takes.
		if e.w.busy.CompareAndSwap(false, true) {
			e.handOff(&batch{})
		}
		t := time.AfterFunc(grace, e.close)
		go func() {
			<-e.w.done
			t.Stop()
		}()
	})
}

func (e *endpoint) setClosing() {
	e.wmu.Lock()
	defer e.wmu.Unlock()
	e.closing = true
}

// shutdown is closeAfterFlush, waiting for the close.
func (e *endpoint) shutdown() {
	if e.w == nil {
		return
	}
	e.closeAfterFlush(closeGrace)
	<-e.w.done
}

// outMost is how many bytes out may hold before the reader of the same connection stops
// reading until the writer has made room: the frames a peer's frames make podgate answer
// (PING's, SETTINGS' acknowledgements, resets) cannot pile up for a peer that does not read.
const outMost = outRoom + 64<<10

// throttle waits, before the reader reads its next frame, while out holds more than outMost:
// until the writer has written, or has ended.
func (e *endpoint) throttle() {
	for e.outSize() > outMost {
		select {
		case <-e.w.progress:
		case <-e.w.done:
			return
		}
	}
}

func (e *endpoint) outSize() int64 {
	e.wmu.Lock()
	defer e.wmu.Unlock()
	return e.out.size
}

// takeBatch hands what is encoded to its writer, and says whether the connection is to close
// once it is written.
func (e *endpoint) takeBatch() (*batch, bool) {
	e.wmu.Lock()
	defer e.wmu.Unlock()
	bufs, data := e.out.take()
	return &batch{bufs: bufs, data: data}, e.closing
}

// kill marks the endpoint dead, so that nothing more is encoded, and returns what was.
func (e *endpoint) kill() [][]byte {
	e.wmu.Lock()
	defer e.wmu.Unlock()
	e.dead = true
	bufs, _ := e.out.take()
	return bufs
}

// outBuffer is what an endpoint has encoded for its peer, in buffers borrowed from a pool at
// the first byte and given back once written: an idle connection holds none.
type outBuffer struct {
	bufs [][]byte
	size int64 // bytes in bufs
	data int64 // DATA payload bytes among them (writeItem)
}

var outBuffers = sync.Pool{New: func() any { b := make([]byte, 0, writeBuffer); return &b }}

// Write appends b; the framer writes each frame with one call.
func (o *outBuffer) Write(b []byte) (int, error) {
	n := len(b)
	o.size += int64(n)
	for len(b) > 0 {
		if k := len(o.bufs); k == 0 || len(o.bufs[k-1]) == cap(o.bufs[k-1]) {
			o.bufs = append(o.bufs, (*outBuffers.Get().(*[]byte))[:0])
		}
		last := &o.bufs[len(o.bufs)-1]
		k := min(cap(*last)-len(*last), len(b))
		*last = append(*last, b[:k]...)
		b = b[k:]
	}
	return n, nil
}

// take hands what is buffered to the writer, with its DATA bytes.
func (o *outBuffer) take() (bufs [][]byte, data int64) {
	bufs, data = o.bufs, o.data
	o.bufs, o.data, o.size = nil, 0, 0
	return bufs, data
}

// releaseOut gives written buffers back to the pool.
func releaseOut(bufs [][]byte) {
	for _, b := range bufs {
		b = b[:0]
		outBuffers.Put(&b)
	}
}
