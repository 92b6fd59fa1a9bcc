package relay

import (
	"bytes"
	"errors"
	"net"
	"os"
	"syscall"
	"testing"
	"time"
)

// socketPair is two connected unix stream sockets as net.Conns, each with a file descriptor (a
// readBuf reads more without waiting only from one).
func socketPair(t *testing.T) (net.Conn, net.Conn) {
	t.Helper()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	conns := make([]net.Conn, 2)
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "socketpair")
		c, err := net.FileConn(f)
		_ = f.Close()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		conns[i] = c
	}
	return conns[0], conns[1]
}

func pattern(n int, seed byte) []byte {
	p := make([]byte, n)
	for i := range p {
		p[i] = seed + byte(i%251)
	}
	return p
}

func writeAll(t *testing.T, c net.Conn, p []byte) {
	t.Helper()
	if _, err := c.Write(p); err != nil {
		t.Fatal(err)
	}
}

// readFull reads n bytes through b's Read, as the framer does.
func readFull(t *testing.T, b *readBuf, n int) []byte {
	t.Helper()
	p := make([]byte, n)
	for got := 0; got < n; {
		k, err := b.Read(p[got:])
		if err != nil {
			t.Fatalf("read %d of %d bytes: %v", got, n, err)
		}
		got += k
	}
	return p
}

// The bytes a reader took and lent stay where they are, unchanged, while the buffer reads more
// behind them — into a big buffer once its own is full — and what it read more follows what it
// held, in order.
func TestReadBufMoreKeepsLentBytes(t *testing.T) {
	peer, c := socketPair(t)
	b := newReadBuf(c, readBuffer, true)
	first := pattern(readBuffer, 1)
	writeAll(t, peer, first)
	// One byte through Read fills the buffer (the socket holds exactly its size), then the
	// reader takes half of the rest and lends it.
	if got := readFull(t, b, 1); got[0] != first[0] {
		t.Fatalf("first byte %d, want %d", got[0], first[0])
	}
	if b.w != len(b.own) {
		t.Fatalf("the buffer holds %d bytes after the first read, want its size %d", b.w, len(b.own))
	}
	half := (readBuffer - 1) / 2
	lent := b.peek(half)
	b.take(half)
	want := bytes.Clone(lent)

	second := pattern(3*readBuffer, 7)
	writeAll(t, peer, second)
	var more int
	for b.more() {
		more++
	}
	if more == 0 || b.big == nil {
		t.Fatalf("more read %d times, big buffer taken: %v; want the own buffer, full, to move to a big one", more, b.big != nil)
	}
	if !bytes.Equal(lent, want) {
		t.Fatal("the lent bytes changed while the buffer read more")
	}
	if &lent[0] != &b.own[1] {
		t.Fatal("the lent bytes moved")
	}
	rest := append(bytes.Clone(first[1+half:]), second...)
	if b.buffered() != len(rest) {
		t.Fatalf("%d bytes buffered, want %d", b.buffered(), len(rest))
	}
	if !bytes.Equal(b.peek(len(rest)), rest) {
		t.Fatal("the buffered bytes are not what was held followed by what was read more, in order")
	}
}

// A big buffer whose bytes are lent reads nothing more once its free end is used up: the
// reader flushes first. Released, it moves what it holds to its front and fills the room that
// made.
func TestReadBufMoreStopsWhenFullAndLent(t *testing.T) {
	peer, c := socketPair(t)
	b := newReadBuf(c, readBuffer, true)
	writeAll(t, peer, pattern(bigReadBuffer+100, 3))
	readFull(t, b, 1)
	for b.more() {
	}
	if b.big == nil || b.w != bigReadBuffer {
		t.Fatalf("big buffer taken: %v, %d bytes in it; want it full", b.big != nil, b.w)
	}
	b.take(10)
	if b.more() {
		t.Fatal("a full buffer whose bytes are lent read more")
	}
	b.release()
	if !b.more() || b.buffered() != bigReadBuffer || b.r != 0 {
		t.Fatalf("after release: %d bytes buffered from %d, want %d from 0", b.buffered(), b.r, bigReadBuffer)
	}
}

// A client's connection reads more only when its reader asks for it (Read): never without
// waiting, never into a big buffer.
func TestReadBufClientReadsNoMore(t *testing.T) {
	peer, c := socketPair(t)
	b := newReadBuf(c, readBuffer, false)
	writeAll(t, peer, pattern(readBuffer+100, 3))
	readFull(t, b, 1)
	b.take(10)
	b.release()
	if b.more() || b.big != nil {
		t.Fatal("a client's connection read more without waiting")
	}
}

// Once everything in a big buffer was taken and nothing is lent, the read that finds the
// socket empty gives it back before it waits: an idle connection holds its own buffer only.
func TestReadBufGivesBigBackBeforeWaiting(t *testing.T) {
	peer, c := socketPair(t)
	b := newReadBuf(c, readBuffer, true)
	data := pattern(2*readBuffer, 5)
	writeAll(t, peer, data)
	readFull(t, b, 1)
	b.take(1)
	for b.more() {
	}
	if b.big == nil {
		t.Fatal("no big buffer taken")
	}
	b.release()
	if got := readFull(t, b, len(data)-2); !bytes.Equal(got, data[2:]) {
		t.Fatal("read back other bytes than were written")
	}
	if b.big == nil {
		t.Fatal("the big buffer was given back before the socket was found empty")
	}
	// Nothing more comes: the read finds the socket empty, gives the big buffer back and
	// waits, until the deadline.
	if err := c.SetReadDeadline(time.Now().Add(50 * time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Read(make([]byte, 9)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read of an empty socket: %v, want the deadline", err)
	}
	if b.big != nil || &b.buf[0] != &b.own[0] {
		t.Fatal("the big buffer was kept while the connection waited")
	}
	// And reads go on into its own buffer.
	if err := c.SetReadDeadline(time.Time{}); err != nil {
		t.Fatal(err)
	}
	writeAll(t, peer, []byte("next"))
	if got := readFull(t, b, 4); string(got) != "next" {
		t.Fatalf("read %q, want next", got)
	}
}

// The end of the connection and a connection without a file descriptor read as before.
func TestReadBufEndAndPipe(t *testing.T) {
	peer, c := socketPair(t)
	b := newReadBuf(c, readBuffer, true)
	writeAll(t, peer, []byte("last"))
	_ = peer.Close()
	if got := readFull(t, b, 4); string(got) != "last" {
		t.Fatalf("read %q, want last", got)
	}
	if _, err := b.Read(make([]byte, 9)); err == nil || err.Error() != "EOF" {
		t.Fatalf("read at the end: %v, want EOF", err)
	}

	p1, p2 := net.Pipe()
	defer p1.Close()
	defer p2.Close()
	pb := newReadBuf(p2, readBuffer, true)
	go func() { _, _ = p1.Write([]byte("piped")) }()
	if got := readFull(t, pb, 5); string(got) != "piped" {
		t.Fatalf("read %q, want piped", got)
	}
	if pb.more() {
		t.Fatal("a connection without a file descriptor read more without waiting")
	}
}
