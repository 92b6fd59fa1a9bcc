package relay

import (
	"bytes"
	"context"
	"errors"
	"io"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// unaryClient is a grpc-go client of the relay at sock, carrying messages as their bytes.
func unaryClient(t *testing.T, sock string) *grpc.ClientConn {
	t.Helper()
	c, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.ForceCodec(rawCodec{}), grpc.MaxCallRecvMsgSize(64<<20), grpc.MaxCallSendMsgSize(64<<20)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestUnaryTarget: a call a Unary target answers in the process gets, as from a gRPC server,
// its request's message and metadata (binary values decoded) with the client's deadline, and
// answers with a message of any size (within the client's windows), header and trailer
// metadata, or a status with its details; a request over MaxMessage is refused
// ResourceExhausted without the handler, and a client that gives up cancels the handler's
// context.
func TestUnaryTarget(t *testing.T) {
	dir := shortDir(t)
	type seen struct {
		call     *UnaryCall
		deadline time.Time
	}
	calls := make(chan seen, 10)
	cancelled := make(chan error, 1)
	big := bytes.Repeat([]byte("0123456789abcdef"), 300_000) // 4.8 MB: more than any window
	rec := newRecorder()
	tgt := &Target{Name: "handlers", MaxMessage: 1 << 20, Unary: func(ctx context.Context, call *UnaryCall) *UnaryAnswer {
		d, _ := ctx.Deadline()
		calls <- seen{call, d}
		switch call.Path {
		case "/svc/Echo":
			return &UnaryAnswer{Message: call.Message, Header: metadata.Pairs("x-h", "1", "x-h-bin", "\x00\x01"), Trailer: metadata.Pairs("x-t", "2")}
		case "/svc/Big":
			return &UnaryAnswer{Message: big}
		case "/svc/Fail":
			st, _ := status.New(codes.FailedPrecondition, "claim x: driver not registered ✗").WithDetails(&errdetails.ErrorInfo{Reason: "NO_DRIVER"})
			return &UnaryAnswer{Err: st.Err(), Trailer: metadata.Pairs("x-t", "3")}
		case "/svc/Hang":
			<-ctx.Done()
			cancelled <- ctx.Err()
			return &UnaryAnswer{Err: status.FromContextError(ctx.Err()).Err()}
		}
		return &UnaryAnswer{Err: status.Error(codes.Unimplemented, call.Path)}
	}}
	sock := startRelay(t, dir, &Server{Route: func(string) *Target { return tgt }, Observer: rec})
	c := unaryClient(t, sock)

	ctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(t.Context(), "x-caller", "kubelet", "x-id-bin", "\xff\x00"), time.Minute)
	defer cancel()
	var hdr, trl metadata.MD
	in, out := []byte("hello"), []byte(nil)
	if err := c.Invoke(ctx, "/svc/Echo", &in, &out, grpc.Header(&hdr), grpc.Trailer(&trl)); err != nil || !bytes.Equal(out, in) {
		t.Fatalf("Echo: %q, %v", out, err)
	}
	got := <-calls
	if got.call.Header.Get("x-caller")[0] != "kubelet" || got.call.Header.Get("x-id-bin")[0] != "\xff\x00" || got.call.Header.Get(":authority") == nil {
		t.Errorf("the handler got metadata %v", got.call.Header)
	}
	// The deadline travels as a duration (grpc-timeout) and starts anew when it arrives, as on a
	// gRPC server: within the time the call took to arrive of the client's.
	if want, _ := ctx.Deadline(); got.deadline.IsZero() || got.deadline.Sub(want).Abs() > 5*time.Second {
		t.Errorf("the handler's deadline %v, the client's %v", got.deadline, want)
	}
	if hdr.Get("x-h")[0] != "1" || hdr.Get("x-h-bin")[0] != "\x00\x01" || trl.Get("x-t")[0] != "2" {
		t.Errorf("the client got header %v, trailer %v", hdr, trl)
	}
	rec.wantEnded(t, "/svc/Echo", codes.OK)

	if err := c.Invoke(ctx, "/svc/Big", &in, &out); err != nil || !bytes.Equal(out, big) {
		t.Errorf("Big: %d bytes, %v; want %d", len(out), err, len(big))
	}
	<-calls

	err := c.Invoke(ctx, "/svc/Fail", &in, &out, grpc.Trailer(&trl))
	st := status.Convert(err)
	if st.Code() != codes.FailedPrecondition || st.Message() != "claim x: driver not registered ✗" || len(st.Details()) != 1 || trl.Get("x-t")[0] != "3" {
		t.Errorf("Fail: %v (details %v), trailer %v", err, st.Details(), trl)
	}
	<-calls

	tooBig := make([]byte, 1<<20+1)
	if err := c.Invoke(ctx, "/svc/Echo", &tooBig, &out); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("a request over MaxMessage: %v, want ResourceExhausted", err)
	}
	select {
	case s := <-calls:
		t.Errorf("the handler ran for a request over MaxMessage: %s", s.call.Path)
	default:
	}

	hctx, hcancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Invoke(hctx, "/svc/Hang", &in, &out) }()
	<-calls
	hcancel()
	if err := <-cancelled; !errors.Is(err, context.Canceled) {
		t.Errorf("the handler's context ended with %v, want cancelled with the client's call", err)
	}
	if err := <-done; status.Code(err) != codes.Canceled {
		t.Errorf("the client's cancelled call: %v", err)
	}
	rec.wantEnded(t, "/svc/Hang", codes.Canceled)
}

// TestUnaryTargetBadRequests: what a gRPC server refuses, the relay refuses for a Unary target
// too, naming why: a malformed grpc-timeout, a compressed message, a message shorter than its
// prefix says, no message.
func TestUnaryTargetBadRequests(t *testing.T) {
	dir := shortDir(t)
	ran := make(chan string, 10)
	tgt := &Target{Name: "handlers", Unary: func(_ context.Context, call *UnaryCall) *UnaryAnswer {
		ran <- call.Path
		return &UnaryAnswer{Message: call.Message}
	}}
	sock := startRelay(t, dir, &Server{Route: func(string) *Target { return tgt }})
	for _, tt := range []struct {
		name    string
		extra   []string
		body    []byte
		code    codes.Code
		message string
	}{
		{"malformed grpc-timeout", []string{"grpc-timeout", "12x"}, []byte{0, 0, 0, 0, 0}, codes.Internal, "grpc-timeout"},
		{"compressed", nil, []byte{1, 0, 0, 0, 1, 'x'}, codes.Unimplemented, "compressed"},
		{"short message", nil, []byte{0, 0, 0, 0, 9, 'x'}, codes.Internal, "prefix says 9"},
		{"no message", nil, nil, codes.Internal, "no message"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cl := dialRelay(t, sock)
			cl.headers(1, tt.body == nil, append(grpcRequest("/svc/M"), tt.extra...)...)
			if tt.body != nil {
				cl.write(func(fr *http2.Framer) error { return fr.WriteData(1, true, tt.body) })
			}
			h := cl.readUntil(isHeaders)
			if field(h, "grpc-status") != strconv.Itoa(int(tt.code)) || !strings.Contains(field(h, "grpc-message"), tt.message) {
				t.Errorf("got %v, want grpc-status %d and a message with %q", h, tt.code, tt.message)
			}
		})
	}
	select {
	case p := <-ran:
		t.Errorf("the handler ran for a bad request: %s", p)
	default:
	}
}

// TestRefuseTarget: a Refuse target's call is answered from its headers, with the refusal's
// status, while the client still streams: a bidirectional call that has not half-closed gets
// its answer (as from a gRPC server that does not know the service) instead of hanging.
func TestRefuseTarget(t *testing.T) {
	dir := shortDir(t)
	rec := newRecorder()
	tgt := &Target{Name: "refusal", Refuse: func(path string) error {
		return status.Errorf(codes.Unimplemented, "no service for %s", path)
	}}
	sock := startRelay(t, dir, &Server{Route: func(string) *Target { return tgt }, Observer: rec})
	c := unaryClient(t, sock)
	ctx, cancel := context.WithTimeout(t.Context(), waitFor)
	defer cancel()
	st, err := c.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}, "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo")
	if err != nil {
		t.Fatal(err)
	}
	msg := []byte("list services")
	if err := st.SendMsg(&msg); err != nil && !errors.Is(err, io.EOF) {
		t.Fatal(err)
	}
	var out []byte
	err = st.RecvMsg(&out)
	if s := status.Convert(err); s.Code() != codes.Unimplemented || s.Message() != "no service for /grpc.reflection.v1.ServerReflection/ServerReflectionInfo" {
		t.Errorf("a stream still open got %v, want the refusal", err)
	}
	rec.wantEnded(t, "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo", codes.Unimplemented)
}

// TestShutdownWaitsForUnaryHandlers: Shutdown cancels a Unary target's call still under way
// when its grace ends, and returns only once the handler has returned, so that no handler's
// work outlives it.
func TestShutdownWaitsForUnaryHandlers(t *testing.T) {
	dir := shortDir(t)
	started, cancelled, proceed := make(chan struct{}), make(chan struct{}), make(chan struct{})
	tgt := &Target{Name: "handlers", Unary: func(ctx context.Context, _ *UnaryCall) *UnaryAnswer {
		close(started)
		<-ctx.Done()
		close(cancelled)
		<-proceed // the handler's last work, after its call was cancelled
		return &UnaryAnswer{Err: status.FromContextError(ctx.Err()).Err()}
	}}
	srv := &Server{Route: func(string) *Target { return tgt }}
	sock, served := serveRelay(t, dir, srv, nil)
	c := unaryClient(t, sock)
	in, out := []byte("x"), []byte(nil)
	go func() { _ = c.Invoke(context.Background(), "/svc/Slow", &in, &out) }()
	<-started
	graceOver, over := context.WithCancel(context.Background())
	over()
	stopped := make(chan struct{})
	go func() {
		srv.Shutdown(graceOver)
		close(stopped)
	}()
	<-cancelled
	select {
	case <-stopped:
		t.Fatal("Shutdown returned while a handler was still running")
	case <-time.After(200 * time.Millisecond): // a bound for the negative, not a synchronisation
	}
	close(proceed)
	<-stopped
	if err := <-served; err != nil {
		t.Errorf("Serve: %v", err)
	}
}
