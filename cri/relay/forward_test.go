package relay

import (
	"bytes"
	"context"
	"net"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// forwardBackend is a grpc-go server behind the relay for Forward's tests: it keeps what its
// calls brought and counts the connections it accepted.
type forwardBackend struct {
	target    *Target
	conns     atomic.Int64
	calls     chan forwardSeen
	cancelled chan struct{}
}

type forwardSeen struct {
	method   string
	md       metadata.MD
	deadline time.Time
	msg      []byte
}

type countingListener struct {
	net.Listener
	n *atomic.Int64
}

func (l countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.n.Add(1)
	}
	return c, err
}

// startForwardBackend serves a gRPC server on a socket of dir: /svc/Echo answers the request
// with metadata, /svc/Big big, /svc/Fail a status with details, /svc/Hang waits for its
// cancellation; a "-limited" suffix changes nothing.
func startForwardBackend(t *testing.T, dir string, big []byte) *forwardBackend {
	t.Helper()
	sock := filepath.Join(dir, "backend.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	b := &forwardBackend{calls: make(chan forwardSeen, 10), cancelled: make(chan struct{}, 1)}
	srv := grpc.NewServer(grpc.ForceServerCodec(rawCodec{}), grpc.MaxRecvMsgSize(64<<20), grpc.MaxSendMsgSize(64<<20),
		grpc.UnknownServiceHandler(func(_ any, st grpc.ServerStream) error {
			var in []byte
			if err := st.RecvMsg(&in); err != nil {
				return err
			}
			method, _ := grpc.MethodFromServerStream(st)
			md, _ := metadata.FromIncomingContext(st.Context())
			dl, _ := st.Context().Deadline()
			b.calls <- forwardSeen{method, md, dl, in}
			switch strings.TrimSuffix(method, "-limited") {
			case "/svc/Echo", "/svc/Pass":
				_ = st.SetHeader(metadata.Pairs("x-h", "1", "x-h-bin", "\x00\x01"))
				st.SetTrailer(metadata.Pairs("x-t", "2"))
				return st.SendMsg(&in)
			case "/svc/Big":
				return st.SendMsg(&big)
			case "/svc/Fail":
				s, _ := status.New(codes.FailedPrecondition, "claim x: driver not registered ✗ 100%").WithDetails(&errdetails.ErrorInfo{Reason: "NO_DRIVER"})
				return s.Err()
			case "/svc/Hang":
				<-st.Context().Done()
				b.cancelled <- struct{}{}
				return st.Context().Err()
			}
			return status.Error(codes.Unimplemented, method)
		}))
	go srv.Serve(countingListener{l, &b.conns}) //nolint:errcheck // ends with Stop
	t.Cleanup(srv.Stop)
	b.target = &Target{Name: "test backend", MaxMessage: 16 << 20, Dial: func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}
	return b
}

// forwardingRelay starts a relay that passes /svc/Pass through to backend and answers every
// other call with a handler that forwards it to backend (to small when its method ends in
// "-limited"), setting x-added.
func forwardingRelay(t *testing.T, dir string, backend, small *Target) string {
	t.Helper()
	handler := &Target{Name: "handlers", MaxMessage: 1 << 20, Unary: func(ctx context.Context, call *UnaryCall) *UnaryAnswer {
		to := backend
		if strings.HasSuffix(call.Path, "-limited") {
			to = small
		}
		return call.Forward(ctx, to, metadata.Pairs("x-added", "podgate"), call.Message)
	}}
	return startRelay(t, dir, &Server{Route: func(path string) *Target {
		if path == "/svc/Pass" {
			return backend
		}
		return handler
	}})
}

// TestForward: a call a Unary target's handler forwards reaches the server on the client's own
// connection to it (the one the passed-through calls take), with the client's metadata, the
// handler's additions and the client's deadline, and brings back the server's answer as a
// gRPC client would: a message larger than any window, header and trailer metadata, a status
// with its message and details; the client's cancellation reaches the server, and an answer
// over the target's MaxMessage is refused.
func TestForward(t *testing.T) {
	dir := shortDir(t)
	big := randomBytes(t, 5<<20) // more than the stream window
	be := startForwardBackend(t, dir, big)
	small := *be.target
	small.MaxMessage = 1000
	c := unaryClient(t, forwardingRelay(t, dir, be.target, &small))
	ctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(t.Context(), "x-caller", "kubelet", "x-added", "kubelet's"), time.Minute)
	defer cancel()

	in, out := randomBytes(t, 200_000), []byte(nil) // more than grpc-go's first window
	if err := c.Invoke(ctx, "/svc/Pass", &in, &out); err != nil || !bytes.Equal(out, in) {
		t.Fatalf("Pass: %d bytes, %v", len(out), err)
	}
	<-be.calls
	var hdr, trl metadata.MD
	if err := c.Invoke(ctx, "/svc/Echo", &in, &out, grpc.Header(&hdr), grpc.Trailer(&trl)); err != nil || !bytes.Equal(out, in) {
		t.Fatalf("Echo: %d bytes back of %d, %v", len(out), len(in), err)
	}
	got := <-be.calls
	if !bytes.Equal(got.msg, in) {
		t.Errorf("the server got %d bytes, not the client's %d", len(got.msg), len(in))
	}
	if got.md.Get("x-caller")[0] != "kubelet" || strings.Join(got.md.Get("x-added"), ",") != "podgate" {
		t.Errorf("the server got metadata %v; want the client's x-caller and the handler's x-added", got.md)
	}
	if want, _ := ctx.Deadline(); got.deadline.IsZero() || got.deadline.After(want.Add(time.Second)) || got.deadline.Before(want.Add(-5*time.Second)) {
		t.Errorf("the server's deadline %v, the client's %v", got.deadline, want)
	}
	if hdr.Get("x-h")[0] != "1" || hdr.Get("x-h-bin")[0] != "\x00\x01" || trl.Get("x-t")[0] != "2" {
		t.Errorf("the client got header %v, trailer %v", hdr, trl)
	}
	if n := be.conns.Load(); n != 1 {
		t.Errorf("the server accepted %d connections, want 1: the forwarded call on the passed-through calls' one", n)
	}

	if err := c.Invoke(ctx, "/svc/Big", &in, &out); err != nil || !bytes.Equal(out, big) {
		t.Errorf("Big: %d bytes, %v; want %d", len(out), err, len(big))
	}
	<-be.calls

	err := c.Invoke(ctx, "/svc/Fail", &in, &out)
	st := status.Convert(err)
	if st.Code() != codes.FailedPrecondition || st.Message() != "claim x: driver not registered ✗ 100%" || len(st.Details()) != 1 {
		t.Errorf("Fail: %v (details %v)", err, st.Details())
	}
	<-be.calls

	if err := c.Invoke(ctx, "/svc/Big-limited", &in, &out); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("an answer over MaxMessage: %v, want ResourceExhausted", err)
	}
	<-be.calls

	hctx, hcancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Invoke(hctx, "/svc/Hang", &in, &out) }()
	<-be.calls
	hcancel()
	<-be.cancelled // the client's cancellation crossed both hops
	if err := <-done; status.Code(err) != codes.Canceled {
		t.Errorf("the cancelled call: %v", err)
	}
}

// TestForwardWhenTheServerFails: a forwarded call ends Unavailable, naming the server, when
// the server's connection breaks under it or its GOAWAY did not take it; the handler gets
// the status and the client with it.
func TestForwardWhenTheServerFails(t *testing.T) {
	for _, tt := range []struct {
		name string
		fail func(srv *rawPeer, id uint32)
		want string
	}{
		{"connection lost", func(srv *rawPeer, _ uint32) { srv.conn.Close() }, "test upstream"},
		{"refused by GOAWAY", func(srv *rawPeer, id uint32) {
			srv.write(func(fr *http2.Framer) error { return fr.WriteGoAway(id-1, http2.ErrCodeNo, nil) })
		}, "REFUSED_STREAM"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			srv, h, done := forwardToRawServer(t)
			if field(h, ":path") != "/svc/Echo" || field(h, "x-added") != "podgate" {
				t.Errorf("the server got %v", h.Fields)
			}
			tt.fail(srv, h.StreamID)
			err := <-done
			if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("got %v, want Unavailable saying %q", err, tt.want)
			}
		})
	}
}

// TestForwardOfACallNotDispatched: Forward of a UnaryCall the relay did not make says so.
func TestForwardOfACallNotDispatched(t *testing.T) {
	a := (&UnaryCall{Path: "/svc/M"}).Forward(t.Context(), &Target{Name: "x"}, nil, nil)
	if status.Code(a.Err) != codes.Internal || !strings.Contains(a.Err.Error(), "did not dispatch") {
		t.Errorf("got %v", a.Err)
	}
}

// TestEncodeTimeout: grpc-timeout holds at most 8 digits, in the finest unit that fits,
// rounded up so that the server never gets less time than is left.
func TestEncodeTimeout(t *testing.T) {
	for d, want := range map[time.Duration]string{
		-time.Second:                   "0n",
		0:                              "0n",
		1500:                           "1500n",
		99_999_999:                     "99999999n",
		100_000_000:                    "100000u",
		100_000_001:                    "100001u",
		2 * time.Minute:                "120000m",
		30 * time.Hour:                 "108000S",
		10_000 * time.Hour:             "36000000S",
		100_000 * time.Hour:            "6000000M",
		time.Duration(1<<63 - 1):       "2562048H",
		2*time.Hour + time.Millisecond: "7200001m",
	} {
		if got := encodeTimeout(d); got != want {
			t.Errorf("encodeTimeout(%v) = %q, want %q", d, got, want)
		}
		if got, err := parseTimeout(encodeTimeout(d)); err != nil || got < d {
			t.Errorf("parseTimeout(encodeTimeout(%v)) = %v, %v: less than was left", d, got, err)
		}
	}
}

// TestForwardBadAnswers: what a gRPC client refuses in an answer, Forward refuses too, naming
// why, and a trailers-only answer's status reaches the client with its message decoded.
func TestForwardBadAnswers(t *testing.T) {
	for _, tt := range []struct {
		name    string
		answer  func(srv *rawPeer, id uint32)
		code    codes.Code
		message string
	}{
		{"HTTP 503", func(srv *rawPeer, id uint32) {
			srv.headers(id, true, ":status", "503", "content-type", "text/plain")
		}, codes.Unavailable, "HTTP status 503"},
		{"no grpc-status", func(srv *rawPeer, id uint32) {
			srv.headers(id, true, ":status", "200", "content-type", "application/grpc")
		}, codes.Internal, "without a valid grpc-status"},
		{"compressed", func(srv *rawPeer, id uint32) {
			srv.headers(id, false, ":status", "200", "content-type", "application/grpc")
			srv.write(func(fr *http2.Framer) error { return fr.WriteData(id, false, []byte{1, 0, 0, 0, 1, 'x'}) })
			srv.headers(id, true, "grpc-status", "0")
		}, codes.Internal, "compressed"},
		{"short message", func(srv *rawPeer, id uint32) {
			srv.headers(id, false, ":status", "200", "content-type", "application/grpc")
			srv.write(func(fr *http2.Framer) error { return fr.WriteData(id, false, []byte{0, 0, 0, 0, 9, 'x'}) })
			srv.headers(id, true, "grpc-status", "0")
		}, codes.Internal, "prefix says 9"},
		{"OK without a message", func(srv *rawPeer, id uint32) {
			srv.headers(id, true, ":status", "200", "content-type", "application/grpc", "grpc-status", "0")
		}, codes.Internal, "no message"},
		{"trailers-only status", func(srv *rawPeer, id uint32) {
			srv.headers(id, true, ":status", "200", "content-type", "application/grpc", "grpc-status", "5", "grpc-message", "no such container %E2%9C%97")
		}, codes.NotFound, "no such container ✗"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			srv, h, done := forwardToRawServer(t)
			srv.readUntil(func(f http2.Frame) bool { return isData(f) && f.Header().Flags.Has(http2.FlagDataEndStream) })
			tt.answer(srv, h.StreamID)
			err := <-done
			if st := status.Convert(err); st.Code() != tt.code || !strings.Contains(st.Message(), tt.message) {
				t.Errorf("got %v, want %v saying %q", err, tt.code, tt.message)
			}
		})
	}
}

// forwardToRawServer makes a client's /svc/Echo call that a handler forwards to a server the
// test drives frame by frame, and returns that server, the call's headers as it got them, and
// the client's result to come.
func forwardToRawServer(t *testing.T) (*rawPeer, *http2.MetaHeadersFrame, <-chan error) {
	t.Helper()
	dir := shortDir(t)
	up := startRawUpstream(t, dir)
	backend := up.target()
	c := unaryClient(t, forwardingRelay(t, dir, backend, backend))
	done := make(chan error, 1)
	in, out := []byte("x"), []byte(nil)
	go func() { done <- c.Invoke(t.Context(), "/svc/Echo", &in, &out) }()
	srv := up.accept()
	return srv, srv.readUntil(isHeaders).(*http2.MetaHeadersFrame), done
}

// TestForwardFields: a forwarded call goes with the client's header fields, the handler's
// metadata in place of the client's of the same name, the deadline of the handler's context
// (not the client's grpc-timeout, which counted from the client's send) and no compression
// accepted, since the relay reads the answer itself.
func TestForwardFields(t *testing.T) {
	c := &UnaryCall{fields: []hpack.HeaderField{
		{Name: ":method", Value: "POST"}, {Name: ":path", Value: "/svc/M"}, {Name: "content-type", Value: "application/grpc"},
		{Name: "grpc-timeout", Value: "2S"}, {Name: "grpc-accept-encoding", Value: "gzip"},
		{Name: "traceparent", Value: "kubelet's"}, {Name: "x-caller", Value: "kubelet"},
	}}
	ctx, cancel := context.WithTimeout(t.Context(), time.Hour)
	defer cancel()
	got := c.forwardFields(ctx, metadata.Pairs("traceparent", "podgate's"))
	want := map[string]string{":method": "POST", ":path": "/svc/M", "content-type": "application/grpc", "traceparent": "podgate's", "x-caller": "kubelet"}
	seen := map[string]int{}
	for _, f := range got {
		seen[f.Name]++
		switch {
		case f.Name == "grpc-timeout":
			if d, err := parseTimeout(f.Value); err != nil || d < 59*time.Minute || d > time.Hour {
				t.Errorf("grpc-timeout %q, want the hour left of the handler's context", f.Value)
			}
		case want[f.Name] != f.Value:
			t.Errorf("%s: %q, want %q", f.Name, f.Value, want[f.Name])
		}
	}
	for name := range want {
		if seen[name] != 1 {
			t.Errorf("%s sent %d times, want once", name, seen[name])
		}
	}
	if seen["grpc-timeout"] != 1 || seen["grpc-accept-encoding"] != 0 {
		t.Errorf("grpc-timeout sent %d times (want once), grpc-accept-encoding %d (want never): %v", seen["grpc-timeout"], seen["grpc-accept-encoding"], got)
	}
	if got[0].Name != ":method" || got[1].Name != ":path" {
		t.Errorf("pseudo-headers not first: %v", got)
	}
}
