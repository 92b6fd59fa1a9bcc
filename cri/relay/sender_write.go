package relay

// How the owner's bytes reach the socket: a write that does not wait where the socket takes
// them (writev of the batch, DATA payloads lent from a reader's buffer included), and the
// writer goroutine, handed the token when it does not, which alone waits for the peer.

import (
	"errors"
	"net"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// write writes the batch: without waiting unless g (the writer goroutine, which waits up to the
// timeout for each write to make progress). It says whether the caller is still the owner: not
// once the token went to the writer goroutine, or the sender ended.
func (s *sender) write(g bool) bool {
	b := &s.o.b
	for !b.empty() {
		n, err := s.writeOnce(g)
		if n > 0 {
			b.advance(n)
			s.wrote()
		}
		switch {
		case err == nil:
		case errors.Is(err, errWouldBlock):
			b.keepLent()
			s.handOff()
			return false
		case errors.Is(err, os.ErrDeadlineExceeded), errors.Is(err, net.ErrClosed):
			s.end()
			return false
		default:
			// The peer is gone (EPIPE, ECONNRESET): nothing more can be written, but what it
			// sent before it left may still wait to be read. Its reader reads on until the
			// end, and the session closes the connection then.
			s.endWriting()
			return false
		}
	}
	b.reset()
	return true
}

// writeOnce makes one write of what the batch has left.
func (s *sender) writeOnce(g bool) (int, error) {
	if s.raw == nil {
		if !g {
			return 0, errWouldBlock
		}
		return s.writeConn()
	}
	o := &s.o
	if !g {
		err := s.raw.Write(s.tryFn)
		n, werr := o.wn, o.werr
		switch {
		case errors.Is(werr, unix.EAGAIN):
			return n, errWouldBlock
		case werr != nil:
			return n, werr
		}
		return n, err
	}
	if s.hooks.timeout > 0 {
		_ = s.conn.SetWriteDeadline(time.Now().Add(s.hooks.timeout))
		// Cleared after the write: a deadline left behind would fail every later write that
		// does not wait, at once.
		defer func() { _ = s.conn.SetWriteDeadline(time.Time{}) }()
	}
	err := s.raw.Write(s.waitFn)
	n, werr := o.wn, o.werr
	if werr == nil || errors.Is(werr, unix.EAGAIN) {
		werr = err // the wait's end: the deadline, or the connection closed
	}
	if n == 0 && errors.Is(werr, os.ErrDeadlineExceeded) && s.hooks.stalled != nil {
		s.hooks.stalled()
	}
	return n, werr
}

// tryWritev is what a write that does not wait runs on the socket (RawConn.Write): one writev;
// its results are the owner's wn and werr. A method value made once, not a closure per write.
func (s *sender) tryWritev(fd uintptr) bool {
	s.o.wn, s.o.werr = writev(fd, &s.o.b, &s.o.iovs)
	return true
}

// waitWritev is tryWritev for the writer goroutine: when the socket takes nothing, it waits for
// it (within the deadline).
func (s *sender) waitWritev(fd uintptr) bool {
	s.tryWritev(fd)
	return !errors.Is(s.o.werr, unix.EAGAIN)
}

// writeConn writes the batch's next buffer with the connection's Write, for a connection
// without a file descriptor.
func (s *sender) writeConn() (int, error) {
	for p := range s.o.b.pending {
		if s.hooks.timeout > 0 {
			_ = s.conn.SetWriteDeadline(time.Now().Add(s.hooks.timeout))
		}
		n, err := s.conn.Write(p)
		if n == 0 && errors.Is(err, os.ErrDeadlineExceeded) && s.hooks.stalled != nil {
			s.hooks.stalled()
		}
		return n, err
	}
	return 0, nil
}

// wrote settles the frames the last write finished: their DATA goes back to the windows of
// where it came from, their bytes leave the budget, the reader's throttle looks again.
func (s *sender) wrote() {
	o := &s.o
	var held int64
	var responses int32
	for _, m := range o.b.left() {
		held += m.held
		if m.response {
			responses++
		}
		if m.st != nil && m.n > 0 {
			if k := m.st.credit.give(m.n); k != nil {
				o.kicks = append(o.kicks, k)
			}
		}
	}
	if responses > 0 {
		s.responses.Add(-responses)
	}
	if s.held.Load() > held {
		s.since.Store(time.Now().UnixNano()) // bytes left, others are still held
	}
	if held > 0 {
		o.held -= held
		s.charge(-held)
	}
	select {
	case s.progress <- struct{}{}:
	default:
	}
	if len(o.kicks) > 0 {
		s.deliver()
	}
}

// drain writes the batch without waiting, as far as the socket takes it; it says whether all of
// it left. What it does not write stays for the owner's next write.
func (s *sender) drain() bool {
	b := &s.o.b
	for !b.empty() {
		n, err := s.writeOnce(false)
		if n > 0 {
			b.advance(n)
			s.wrote()
		}
		if err != nil {
			return false
		}
	}
	b.reset()
	return true
}

// handOff gives the token (and what the batch has left) to the writer goroutine.
func (s *sender) handOff() {
	s.handoffs.Add(1)
	s.startWriter()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// startWriter starts the writer goroutine, once: at the first write the socket did not take at
// once, or at the close. A connection whose peer takes what it is sent has none.
func (s *sender) startWriter() {
	s.start.Do(func() { go s.writeLoop() })
}

// writeLoop is the writer goroutine: handed the token, it writes, waiting for the peer, until
// nothing is left. After close it ends the sender unless an owner is at work, which ends it.
func (s *sender) writeLoop() {
	quit := s.quit
	for {
		select {
		case <-s.wake:
			s.run(true)
		case <-quit:
			quit = nil
			if s.busy.CompareAndSwap(false, true) {
				s.end()
			}
		case <-s.done:
			return
		}
	}
}

// throttle waits, before the reader of the same connection reads on, while more than
// maxResponses frames answering the peer wait to be written: until the owner wrote, or the
// sender ended.
func (s *sender) throttle() {
	for s.responses.Load() > maxResponses {
		select {
		case <-s.progress:
		case <-s.done:
			return
		}
	}
}
