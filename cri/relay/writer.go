package relay

// An endpoint's writing side: who writes what is encoded for the peer (the goroutine that
// flushed, as far as the socket takes it without waiting; the writer goroutine the rest), and
// what out holds against the budget until it is written.

import (
	"errors"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

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
	start     sync.Once     // startWriter
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
