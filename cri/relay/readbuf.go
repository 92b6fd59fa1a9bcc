package relay

import (
	"errors"
	"io"
	"net"
	"sync"
	"syscall"
)

// bigReads are the larger read buffers a connection to a target takes while a large answer
// streams in (readBuf.more), and gives back when it finds the socket empty.
var bigReads = sync.Pool{New: func() any { b := make([]byte, bigReadBuffer); return &b }}

// readBuf is a connection's read buffer. Unlike bufio.Reader it never moves bytes a reader has
// lent (conn.lend) while they are lent: between a read's first lent DATA frame and its flush
// (release) it only reads after them, into the buffer's free end. So when a frame is not whole
// in the buffer, the reader of a connection to a target (grow) can first take what the socket
// already holds (more, without waiting) and send the frames of several of the target's writes
// in one of its own. A client's connection reads only when its reader has flushed and passed
// its throttle, as with bufio.
type readBuf struct {
	nc  net.Conn
	raw syscall.RawConn // nil without a file descriptor: no reading more without waiting
	// buf is own, the connection's buffer, or big, one of bigReads that a connection to a
	// target (grow) takes when own is full in the middle of a frame, and gives back when it
	// has taken all the buffer holds, lent none of it, and the socket holds nothing more.
	buf  []byte
	own  []byte
	big  *[]byte
	grow bool
	r, w int
	// pinned says bytes before r may be lent: the buffer's bytes stay where they are.
	pinned bool
	// tryFn and waitFn are tryRead and waitRead made into func values once (RawConn.Read);
	// n and err are their results.
	tryFn, waitFn func(fd uintptr) bool
	n             int
	err           error
}

func newReadBuf(nc net.Conn, size int, grow bool) *readBuf {
	b := &readBuf{nc: nc, own: make([]byte, size), grow: grow}
	b.buf = b.own
	if sc, ok := nc.(syscall.Conn); ok {
		b.raw, _ = sc.SyscallConn()
	}
	b.tryFn, b.waitFn = b.tryRead, b.waitRead
	return b
}

// buffered is how many bytes are read and not yet taken.
func (b *readBuf) buffered() int { return b.w - b.r }

// peek is the next n bytes, which the caller checked are buffered; they stay valid until the
// buffer is released and read into again.
func (b *readBuf) peek(n int) []byte { return b.buf[b.r : b.r+n : b.r+n] }

// take takes the next n buffered bytes, which may be lent until release.
func (b *readBuf) take(n int) {
	b.r += n
	b.pinned = true
}

// release says nothing taken from the buffer is lent any more.
func (b *readBuf) release() { b.pinned = false }

// compact moves what is buffered to the front, when nothing is lent.
func (b *readBuf) compact() {
	if b.pinned || b.r == 0 {
		return
	}
	b.w = copy(b.buf, b.buf[b.r:b.w])
	b.r = 0
}

// more reads what the socket holds into the buffer's free end, without waiting, on a
// connection to a target; it says whether it read anything. An error or the end of the
// connection is left for Read to find. When its own buffer is full, it moves what it holds to a
// big buffer first; what was lent from its own stays where it is.
func (b *readBuf) more() bool {
	if b.raw == nil || !b.grow {
		return false
	}
	b.compact()
	if b.w == len(b.buf) && b.big == nil {
		b.big = bigReads.Get().(*[]byte)
		b.w = copy(*b.big, b.buf[b.r:b.w])
		b.buf, b.r = *b.big, 0
	}
	if b.w == len(b.buf) {
		return false
	}
	b.n, b.err = 0, nil
	if err := b.raw.Read(b.tryFn); err != nil || b.err != nil || b.n <= 0 {
		return false
	}
	b.w += b.n
	return true
}

// tryRead is one read(2) into the buffer's free end that does not wait (RawConn.Read), with
// syscall.Read as net.Conn's read: under the race detector it marks the happens-before from
// what wrote the bytes, as writev_other.go's syscall.Write does on the other side.
func (b *readBuf) tryRead(fd uintptr) bool {
	for {
		b.n, b.err = syscall.Read(int(fd), b.buf[b.w:])
		if !errors.Is(b.err, syscall.EINTR) {
			return true
		}
	}
}

// waitRead is tryRead that waits for the socket when it holds nothing; the big buffer goes back
// to the pool before the wait when none of it is lent or unread.
func (b *readBuf) waitRead(fd uintptr) bool {
	b.tryRead(fd)
	if !errors.Is(b.err, syscall.EAGAIN) {
		return true
	}
	if b.big != nil && !b.pinned && b.r == b.w {
		bigReads.Put(b.big)
		b.big, b.buf, b.r, b.w = nil, b.own, 0, 0
	}
	return false
}

// fill reads into the buffer's free end, waiting for the socket when it holds nothing.
func (b *readBuf) fill() (int, error) {
	if b.raw == nil {
		return b.nc.Read(b.buf[b.w:])
	}
	b.n, b.err = 0, nil
	if err := b.raw.Read(b.waitFn); err != nil {
		return 0, err // the deadline, or the connection closed
	}
	switch {
	case b.err != nil:
		return 0, b.err
	case b.n == 0:
		return 0, io.EOF
	}
	return b.n, nil
}

// Read takes buffered bytes, reading from the connection (waiting) when there are none: the
// framer's and the preface's reads.
func (b *readBuf) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	if b.r == b.w {
		b.compact()
		if len(p) >= len(b.buf)-b.w {
			return b.nc.Read(p) // no room, or more wanted than room: straight into p
		}
		n, err := b.fill()
		b.w += n
		if n == 0 {
			if err == nil {
				err = io.ErrNoProgress
			}
			return 0, err
		}
	}
	n := copy(p, b.buf[b.r:b.w])
	b.r += n
	return n, nil
}
