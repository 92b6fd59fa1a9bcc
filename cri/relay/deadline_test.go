package relay

// F5 of issue 47: a write that had to wait for a client (it paused reading) must not leave its
// deadline on the client's connection, or every later write that would not wait fails at once
// and goes to the writer goroutine.

import (
	"context"
	"errors"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/http2"
)

// capturing is a listener that hands the test each connection it accepts, unwrapped: the
// relay gets the *net.UnixConn itself, with its file descriptor.
type capturing struct {
	net.Listener
	accepted chan net.Conn
}

func (l capturing) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.accepted <- c
	}
	return c, err
}

// TestNoWriteDeadlineLeftAfterASlowWrite: a client pauses reading while a 2 MiB answer comes,
// so that the relay's write to it waits, then reads it all. Once the deadline that bounded
// that write (WriteTimeout after it began) has passed, the client's connection still takes a
// write that does not wait: the relay's end of it answers a non-blocking write (RawConn.Write,
// what the relay's direct write uses) at once, rather than with os.ErrDeadlineExceeded as a
// deadline left behind makes it. On 03454cb the deadline was never cleared (writer.go), so
// every flush from then on woke the writer goroutine. Observed on the connection the relay
// was given, not inside the relay: the test holds for any writer that clears its deadline.
func TestNoWriteDeadlineLeftAfterASlowWrite(t *testing.T) {
	const writeTimeout = 2 * time.Second // long enough for the client to come back in time
	dir := shortDir(t)
	up := startRawUpstream(t, dir)
	srv := &Server{Route: func(string) *Target { return up.target() }, Limits: Limits{WriteTimeout: writeTimeout}}
	accepted := make(chan net.Conn, 1)
	sock, served := serveRelay(t, dir, srv, func(l net.Listener) net.Listener { return capturing{l, accepted} })
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitFor)
		defer cancel()
		srv.Shutdown(ctx)
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	client := dialDeaf(t, sock) // windows wide open; it reads nothing until the test does
	relayEnd := <-accepted
	client.headers(1, true, grpcRequest("/svc/Raw")...)
	upPeer := up.accept()
	id := upPeer.readUntil(isHeaders).Header().StreamID
	const size = 2 << 20 // far more than the client's socket takes unread
	upPeer.headers(id, false, ":status", "200", "content-type", "application/grpc")
	chunk := randomBytes(t, 16384)
	for sent := 0; sent < size; sent += len(chunk) {
		upPeer.write(func(fr *http2.Framer) error { return fr.WriteData(id, false, chunk) })
	}
	upPeer.headers(id, true, "grpc-status", "0")

	// The relay holds what the client's socket did not take: its write to the client waits.
	waitUntil(t, "the relay holds the answer the client does not read", func() bool { return srv.Held() >= size/2 })
	got := 0
	for {
		f := client.read()
		if d, ok := f.(*http2.DataFrame); ok && d.StreamID == 1 {
			got += len(d.Data())
		}
		if f.Header().StreamID == 1 && f.Header().Flags.Has(http2.FlagHeadersEndStream) && isHeaders(f) {
			break
		}
	}
	if got != size {
		t.Fatalf("the client got %d bytes of the answer, want %d", got, size)
	}
	// The relay wrote the last of the answer before the client read it: a deadline it set for
	// that write has passed WriteTimeout later. Waiting for the clock is the point: the fault
	// is what a deadline does once it has passed.
	time.Sleep(writeTimeout + 100*time.Millisecond)

	raw, err := relayEnd.(syscall.Conn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	if err := raw.Write(func(uintptr) bool { return true }); errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("a write that does not wait fails on the client's connection %s after the slow write ended: the write deadline was left set (%v)", writeTimeout, err)
	} else if err != nil {
		t.Fatal(err)
	}
}
