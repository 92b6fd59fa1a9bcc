package relay

import (
	"bufio"
	"bytes"
	"errors"
	"net"
	"os"
	"sync"
	"sync/atomic"
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

// batch is what a writer took from out: buffers, the bytes of them already written, and the
// DATA bytes among them.
type batch struct {
	bufs    [][]byte
	written int
	data    int64
}

func (b *batch) empty() bool { return len(b.bufs) == 0 }

// rest is what of the batch is not written yet, buffer by buffer.
func (b *batch) rest(yield func([]byte) bool) {
	skip := b.written
	for _, buf := range b.bufs {
		if skip >= len(buf) {
			skip -= len(buf)
			continue
		}
		if !yield(buf[skip:]) {
			return
		}
		skip = 0
	}
}

func (b *batch) size() (n int) {
	for _, buf := range b.bufs {
		n += len(buf)
	}
	return n
}

// writer is an endpoint's writing side.
type writer struct {
	endpointHooks
	// busy is held by whoever writes to the connection: a goroutine that flushed, while the
	// socket takes its bytes without waiting, or the writer goroutine, to which it hands what
	// the socket did not take (and busy with it) through handed and wake.
	busy   atomic.Bool
	handed *batch
	wake   chan struct{}
	// raw writes without waiting (nil when the connection has no file descriptor: the
	// writer goroutine writes everything then).
	raw       syscall.RawConn
	progress  chan struct{} // a write ended: throttle looks again
	quit      chan struct{} // closed by close
	done      chan struct{} // closed when the writer has ended and the connection is closed
	start     sync.Once // startWriter
	closeOnce sync.Once
	closeSoon sync.Once // closeAfterFlush
	// starved says DATA waits in a queue for room in out.
	starved atomic.Bool
	// acct guards unwritten, the DATA bytes taken into out and not yet written (outRoom
	// bounds it), and gone, set when the writer has ended and they never will be.
	acct      sync.Mutex
	unwritten int64
	gone      bool
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

// flush makes what is encoded leave: the caller writes it at once as far as the socket takes it
// without waiting (the usual case: no goroutine to wake), and the writer goroutine the rest. It
// never waits for the peer. When another goroutine is writing, it takes these bytes too.
func (e *endpoint) flush() {
	if e.w != nil && e.w.busy.CompareAndSwap(false, true) {
		e.writeNow()
	}
}

// writeNow writes out without waiting, holding busy, until out is empty (busy let go) or the
// socket takes no more (busy and the rest handed to the writer goroutine).
func (e *endpoint) writeNow() {
	w := e.w
	for {
		b, closing := e.takeBatch()
		switch {
		case b.empty() && closing:
			e.handOff(b) // the writer goroutine closes the connection
			return
		case b.empty():
			if !w.release(e) {
				return
			}
			continue
		case w.raw == nil:
			e.handOff(b)
			return
		}
		if !e.tryWrite(b) {
			e.handOff(b)
			return
		}
		e.wrote(b)
	}
}

// release lets busy go; it says whether the caller took it again because more came meanwhile.
func (w *writer) release(e *endpoint) bool {
	w.busy.Store(false)
	return e.outSize() > 0 && w.busy.CompareAndSwap(false, true)
}

// handOff gives b and busy to the writer goroutine. The send never waits: only busy's holder
// sends, and the writer goroutine took the last token before it let busy go (or has ended).
func (e *endpoint) handOff(b *batch) {
	w := e.w
	w.handed = b
	select {
	case w.wake <- struct{}{}:
	default:
	}
	e.startWriter()
}

// tryWrite writes what b has left without waiting: it says whether all of it was written. A
// broken connection is the writer goroutine's to find.
func (e *endpoint) tryWrite(b *batch) bool {
	var stop bool
	err := e.w.raw.Write(func(fd uintptr) bool {
		for buf := range b.rest {
			n, err := syscall.Write(int(fd), buf)
			if n > 0 {
				b.written += n
			}
			if err != nil || n < len(buf) {
				stop = true
				return true // done: not waiting for the socket
			}
		}
		return true
	})
	return err == nil && !stop
}

// wrote counts b written: its DATA leaves the budget and makes room, throttle looks again.
func (e *endpoint) wrote(b *batch) {
	w := e.w
	releaseOut(b.bufs)
	w.settle(-b.data)
	select {
	case w.progress <- struct{}{}:
	default:
	}
	if w.starved.Load() && e.room() > outRoom/2 && w.starved.CompareAndSwap(true, false) {
		w.drained(e)
	}
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

// commit counts n bytes of DATA taken into out (hold) until they are written.
func (w *writer) commit(n int64) { w.settle(n) }

// settle counts n more (or, negative, fewer) bytes of DATA in out, unless the writer has
// ended, which gave them all back.
func (w *writer) settle(n int64) {
	w.acct.Lock()
	defer w.acct.Unlock()
	if !w.gone {
		w.unwritten += n
		w.hold(n)
	}
}

// end gives back what out held when the writer has ended: no byte of it will be written.
func (w *writer) end() {
	w.acct.Lock()
	defer w.acct.Unlock()
	w.gone = true
	w.hold(-w.unwritten)
	w.unwritten = 0
}

// room is how many more bytes of DATA out takes now.
func (e *endpoint) room() int64 {
	if e.w == nil {
		return maxWindow
	}
	e.w.acct.Lock()
	defer e.w.acct.Unlock()
	return outRoom - e.w.unwritten
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

// writeLoop is the writer goroutine: handed what the socket did not take at once, and busy
// with it, it writes, waiting for the peer as long as WriteTimeout lets it, then what came
// meanwhile, until out is empty (busy let go) or the connection ends; it closes the connection
// once out is empty when closing asks it to.
func (e *endpoint) writeLoop() {
	w := e.w
	defer e.endWriter()
	for {
		select {
		case <-w.wake:
		case <-w.quit:
			return
		}
		b := w.handed
		w.handed = nil
		for {
			var closing bool
			if b == nil || b.empty() {
				b, closing = e.takeBatch()
			}
			if b.empty() {
				if closing {
					return
				}
				if w.release(e) {
					b = nil
					continue
				}
				break
			}
			err := e.write(b)
			e.wrote(b)
			if err != nil {
				return
			}
			b = nil
		}
	}
}

// write writes what b has left. With a timeout, a write that makes no progress within it fails
// the connection (its peer does not read); one that makes some goes on. (Plain writes rather
// than writev: the race detector sees the happens-before of what a socket carries only through
// them.)
func (e *endpoint) write(b *batch) error {
	for buf := range b.rest {
		for len(buf) > 0 {
			if e.w.timeout > 0 {
				_ = e.conn.SetWriteDeadline(time.Now().Add(e.w.timeout))
			}
			n, err := e.conn.Write(buf)
			buf = buf[n:]
			b.written += n
			switch {
			case err == nil:
			case n > 0 && errors.Is(err, os.ErrDeadlineExceeded):
				// slow, not stopped
			default:
				if errors.Is(err, os.ErrDeadlineExceeded) && e.w.stalled != nil {
					e.w.stalled()
				}
				return err
			}
		}
	}
	return nil
}

// endWriter ends the writer: nothing more is encoded, what was is dropped, the connection
// closes.
func (e *endpoint) endWriter() {
	w := e.w
	releaseOut(e.kill())
	w.end()
	e.close()
	close(w.done)
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
