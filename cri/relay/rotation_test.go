package relay

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
)

// TestUpstreamRotatesBeforeItsStreamIDsRunOut: once a connection to the server has used its
// last stream id, the next call goes on a fresh connection, while a call still open on the old
// one goes on both ways there; the old connection closes when that call ends, not before.
func TestUpstreamRotatesBeforeItsStreamIDsRunOut(t *testing.T) {
	dir := shortDir(t)
	up := startRawUpstream(t, dir)
	rec := newRecorder()
	tgt := up.target()
	// Ids 1 and 3 only.
	sock := startRelay(t, dir, &Server{Route: func(string) *Target { return tgt }, Observer: rec, lastUpstreamStreamID: 3})
	cl := dialRelay(t, sock)

	cl.headers(1, false, grpcRequest("/svc/Long")...)
	old := up.accept()
	long := old.readUntil(isHeaders).Header().StreamID
	cl.headers(3, true, grpcRequest("/svc/Short")...)
	short := old.readUntil(isHeaders).Header().StreamID
	if long != 1 || short != 3 {
		t.Fatalf("the first two calls went as streams %d and %d, want 1 and 3", long, short)
	}
	old.headers(short, true, ":status", "200", "content-type", "application/grpc", "grpc-status", "0")
	rec.wantEnded(t, "/svc/Short", codes.OK)

	cl.headers(5, true, grpcRequest("/svc/Next")...)
	fresh := up.accept()
	if h := fresh.readUntil(isHeaders); h.Header().StreamID != 1 || field(h, ":path") != "/svc/Next" {
		t.Fatalf("the call after the last id reached the new connection as stream %d %q", h.Header().StreamID, field(h, ":path"))
	}
	fresh.headers(1, true, ":status", "200", "content-type", "application/grpc", "grpc-status", "0")
	rec.wantEnded(t, "/svc/Next", codes.OK)

	// The long call still goes both ways on the old connection: it was not closed.
	req, ans := randomBytes(t, 3000), randomBytes(t, 4000)
	cl.write(func(fr *http2.Framer) error { return fr.WriteData(1, true, req) })
	if d := old.readUntil(isData).(*http2.DataFrame); !bytes.Equal(d.Data(), req) || !d.StreamEnded() {
		t.Fatalf("the old connection got %d bytes (end %v) of the long call, want %d", len(d.Data()), d.StreamEnded(), len(req))
	}
	old.headers(long, false, ":status", "200", "content-type", "application/grpc")
	old.write(func(fr *http2.Framer) error { return fr.WriteData(long, false, ans) })
	cl.readUntil(func(f http2.Frame) bool { return isHeaders(f) && f.Header().StreamID == 1 })
	if d := cl.readUntil(isData).(*http2.DataFrame); d.StreamID != 1 || !bytes.Equal(d.Data(), ans) {
		t.Fatalf("the client got %d bytes of the long call's answer, want %d", len(d.Data()), len(ans))
	}
	old.headers(long, true, "grpc-status", "0")
	rec.wantEnded(t, "/svc/Long", codes.OK)
	old.readEnd() // its last call done, the old connection closes
}

// sniffedConn is a connection the relay made to the server, keeping what the relay wrote on
// it and telling closed when the relay closes it.
type sniffedConn struct {
	net.Conn
	mu      sync.Mutex
	written bytes.Buffer
	once    sync.Once
	closed  chan<- *sniffedConn
	gone    atomic.Bool
}

func (c *sniffedConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	c.written.Write(p)
	c.mu.Unlock()
	return c.Conn.Write(p)
}

func (c *sniffedConn) Close() error {
	c.once.Do(func() {
		c.gone.Store(true)
		c.closed <- c
	})
	return c.Conn.Close()
}

func (c *sniffedConn) isClosed() bool { return c.gone.Load() }

// headerIDs reads the frames the relay wrote and returns the stream ids of its HEADERS in
// order.
func (c *sniffedConn) headerIDs(t *testing.T) []uint32 {
	t.Helper()
	c.mu.Lock()
	b := bytes.NewReader(bytes.Clone(c.written.Bytes()))
	c.mu.Unlock()
	preface := make([]byte, len(http2.ClientPreface))
	if _, err := io.ReadFull(b, preface); err != nil || string(preface) != http2.ClientPreface {
		t.Fatalf("the relay's connection began %q, not with the preface: %v", preface, err)
	}
	fr := http2.NewFramer(nil, b)
	var ids []uint32
	for {
		f, err := fr.ReadFrame()
		if errors.Is(err, io.EOF) {
			return ids
		}
		if err != nil {
			t.Fatalf("the relay wrote a bad frame: %v", err)
		}
		if h, ok := f.(*http2.HeadersFrame); ok {
			ids = append(ids, h.StreamID)
		}
	}
}

// echoStreamServer serves a gRPC server on a socket of dir that answers each message of any
// call with itself, until the client's end.
func echoStreamServer(t *testing.T, dir string) string {
	t.Helper()
	sock := filepath.Join(dir, "echo.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.ForceServerCodec(rawCodec{}), grpc.UnknownServiceHandler(func(_ any, st grpc.ServerStream) error {
		for {
			var m []byte
			if err := st.RecvMsg(&m); errors.Is(err, io.EOF) {
				return nil
			} else if err != nil {
				return err
			}
			if err := st.SendMsg(&m); err != nil {
				return err
			}
		}
	}))
	go srv.Serve(l) //nolint:errcheck // ends with Stop
	t.Cleanup(srv.Stop)
	return sock
}

// TestUpstreamRotationFailsNoCall: thousands of calls of one client, passed through and
// forwarded by a handler, with long streams open across many rotations of its connection to the
// server (32 stream ids each): no call fails, no connection takes a stream id above the
// ceiling or out of order, and every connection but the last closes once its calls ended.
func TestUpstreamRotationFailsNoCall(t *testing.T) {
	const (
		ceiling = 63 // ids 1, 3, …, 63: 32 calls a connection
		workers = 8
		calls   = 400 // per worker
		streams = 4
	)
	dir := shortDir(t)
	backendSock := echoStreamServer(t, dir)
	closed := make(chan *sniffedConn, 1000)
	var dialled sync.Map // *sniffedConn → order of dialling
	var ndial atomic.Int64
	backend := &Target{Name: "echo", Dial: func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		c, err := d.DialContext(ctx, "unix", backendSock)
		if err != nil {
			return nil, err
		}
		sc := &sniffedConn{Conn: c, closed: closed}
		dialled.Store(sc, ndial.Add(1))
		return sc, nil
	}}
	handler := &Target{Name: "handler", Unary: func(ctx context.Context, call *UnaryCall) *UnaryAnswer {
		return call.Forward(ctx, backend, metadata.MD{}, call.Message)
	}}
	sock := startRelay(t, dir, &Server{Route: func(path string) *Target {
		if path == "/svc/Forwarded" {
			return handler
		}
		return backend
	}, lastUpstreamStreamID: ceiling})
	cl := unaryClient(t, sock)
	ctx, cancel := context.WithTimeout(context.Background(), 2*waitFor)
	defer cancel()

	var failed atomic.Int64
	fail := func(format string, args ...any) {
		failed.Add(1)
		t.Errorf(format, args...)
	}
	done := make(chan struct{})
	var long sync.WaitGroup
	for i := range streams {
		long.Go(func() {
			st, err := cl.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}, "/svc/Stream")
			if err != nil {
				fail("stream %d: %v", i, err)
				return
			}
			first := int64(-1)
			for n := 0; ; n++ {
				in, out := fmt.Appendf(nil, "stream %d message %d", i, n), []byte(nil)
				if err := st.SendMsg(&in); err != nil {
					fail("stream %d send %d: %v", i, n, err)
					return
				}
				if err := st.RecvMsg(&out); err != nil || !bytes.Equal(in, out) {
					fail("stream %d message %d: %q, %v", i, n, out, err)
					return
				}
				if first < 0 {
					first = ndial.Load()
				}
				select {
				case <-done:
				default:
					continue
				}
				if err := st.CloseSend(); err != nil {
					fail("stream %d close: %v", i, err)
				}
				if err := st.RecvMsg(&out); !errors.Is(err, io.EOF) {
					fail("stream %d ended with %v, want its end", i, err)
				}
				if rotations := ndial.Load() - first; rotations < 3 {
					t.Errorf("stream %d lived through %d rotations, want several", i, rotations)
				}
				return
			}
		})
	}
	var unary sync.WaitGroup
	for w := range workers {
		unary.Go(func() {
			for n := range calls {
				path := "/svc/Passed"
				if n%2 == 1 {
					path = "/svc/Forwarded"
				}
				in, out := fmt.Appendf(nil, "worker %d call %d", w, n), []byte(nil)
				if err := cl.Invoke(ctx, path, &in, &out); err != nil || !bytes.Equal(in, out) {
					fail("%s of worker %d, call %d: %q, %v", path, w, n, out, err)
				}
			}
		})
	}
	unary.Wait()
	close(done)
	long.Wait()
	if n := failed.Load(); n > 0 {
		t.Fatalf("%d calls failed across the rotations", n)
	}

	total := ndial.Load()
	if least := int64(workers * calls / (ceiling + 1) / 2); total < least {
		t.Errorf("%d connections to the server for %d calls, want at least %d", total, workers*calls+streams, least)
	}
	// Every connection but the one in use closes, its calls done. (A call that dialled while
	// another's dial won closes its connection at once, unused.)
	for range total - 1 {
		select {
		case <-closed:
		case <-time.After(waitFor):
			t.Fatalf("%d of %d connections still open after their calls ended", total-int64(len(closed)), total)
		}
	}
	var open *sniffedConn
	dialled.Range(func(k, _ any) bool {
		if c := k.(*sniffedConn); !c.isClosed() {
			open = c
		}
		return true
	})
	if open == nil {
		t.Fatal("no connection to the server is left open for the next call")
	}
	openOrder, _ := dialled.Load(open)
	newestUsed := int64(0)
	dialled.Range(func(k, order any) bool {
		if len(k.(*sniffedConn).headerIDs(t)) > 0 {
			newestUsed = max(newestUsed, order.(int64))
		}
		return true
	})
	if openOrder != newestUsed {
		t.Errorf("connection %d is left open, but %d is the newest that took calls", openOrder, newestUsed)
	}
	var seen int
	dialled.Range(func(k, _ any) bool {
		ids := k.(*sniffedConn).headerIDs(t)
		seen += len(ids)
		for i, id := range ids {
			if id > ceiling || id%2 == 0 || (i > 0 && id <= ids[i-1]) {
				t.Errorf("a connection's stream ids %v: %d is above %d, even or out of order", ids, id, ceiling)
				break
			}
		}
		return true
	})
	if want := workers*calls + streams; seen != want {
		t.Errorf("the server's connections took %d calls, want %d", seen, want)
	}
}
