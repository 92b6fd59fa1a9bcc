package cri

import (
	"bytes"
	"context"
	"errors"
	"net"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"

	"github.com/podgate/podgate/test/testfs"
)

// stopTimeout bounds every wait of the StopGracefully tests for an event that must come.
const stopTimeout = 30 * time.Second

// holdingRuntime is a runtime whose Version calls and container event streams stay open: a
// Version call answers when answer is closed, and any call ends early when its context ends.
// A call that ended returns only once letReturn is called, so a test can tell whether
// StopGracefully waits for the handlers.
type holdingRuntime struct {
	runtimeapi.UnimplementedRuntimeServiceServer
	answer, mayReturn chan struct{}
	letReturn         func()      // closes mayReturn
	started           chan string // a call's method, when its handler starts
	running           atomic.Int64
}

// newHoldingRuntime returns a holdingRuntime whose handlers may return at the latest when the
// test ends, so that a failed test leaves none behind.
func newHoldingRuntime(t *testing.T) *holdingRuntime {
	r := &holdingRuntime{answer: make(chan struct{}), mayReturn: make(chan struct{}), started: make(chan string, 10)}
	r.letReturn = sync.OnceFunc(func() { close(r.mayReturn) })
	t.Cleanup(r.letReturn)
	return r
}

// hold runs a call's handler: it waits for answer (nil: never) or the call's end.
func (r *holdingRuntime) hold(ctx context.Context, method string, answer <-chan struct{}) error {
	r.running.Add(1)
	defer r.running.Add(-1)
	r.started <- method
	var err error
	select {
	case <-answer:
	case <-ctx.Done():
		err = status.FromContextError(ctx.Err()).Err()
	}
	<-r.mayReturn
	return err
}

func (r *holdingRuntime) Version(ctx context.Context, _ *runtimeapi.VersionRequest) (*runtimeapi.VersionResponse, error) {
	if err := r.hold(ctx, "Version", r.answer); err != nil {
		return nil, err
	}
	return &runtimeapi.VersionResponse{RuntimeName: "holding"}, nil
}

func (r *holdingRuntime) GetContainerEvents(_ *runtimeapi.GetEventsRequest, s runtimeapi.RuntimeService_GetContainerEventsServer) error {
	return r.hold(s.Context(), "GetContainerEvents", nil)
}

// serveHolding serves r with a plain grpc.Server on a unix socket and returns the server and a
// client connection to it.
func serveHolding(t *testing.T, r *holdingRuntime) (*grpc.Server, *grpc.ClientConn) {
	t.Helper()
	sock := filepath.Join(testfs.ShortDir(t), "rt.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	runtimeapi.RegisterRuntimeServiceServer(srv, r)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()
	t.Cleanup(func() {
		srv.Stop() // after a failure; a no-op after StopGracefully
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return srv, conn
}

// await returns the next value of ch, failing the test when none comes.
func await[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(stopTimeout):
		t.Fatalf("no %s", what)
		var zero T
		return zero
	}
}

// awaitGoAway waits until conn has left READY: the server told it (GOAWAY) that it stops.
func awaitGoAway(t *testing.T, conn *grpc.ClientConn) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), stopTimeout)
	defer cancel()
	for s := conn.GetState(); s == connectivity.Ready; s = conn.GetState() {
		if !conn.WaitForStateChange(ctx, s) {
			t.Fatal("the client never heard that the server stops")
		}
	}
}

// stopGracefully runs StopGracefully in a goroutine; the returned channel is closed when it
// returns.
func stopGracefully(ctx context.Context, srv *grpc.Server) <-chan struct{} {
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		StopGracefully(ctx, srv)
	}()
	return stopped
}

// TestStopGracefullyLetsCallsFinish: while ctx is open, a call in flight finishes with its
// answer, and StopGracefully returns after it.
func TestStopGracefullyLetsCallsFinish(t *testing.T) {
	r := newHoldingRuntime(t)
	r.letReturn()
	srv, conn := serveHolding(t, r)
	version := make(chan error, 1)
	go func() {
		_, err := runtimeapi.NewRuntimeServiceClient(conn).Version(t.Context(), &runtimeapi.VersionRequest{})
		version <- err
	}()
	await(t, r.started, "Version call at the server")

	stopped := stopGracefully(t.Context(), srv)
	awaitGoAway(t, conn)
	select {
	case <-stopped:
		t.Fatal("StopGracefully returned while a call was in flight and ctx open")
	default:
	}
	close(r.answer)
	if err := await(t, version, "Version answer"); err != nil {
		t.Errorf("call in flight during a graceful stop: %v, want its answer", err)
	}
	await(t, stopped, "return of StopGracefully")
	if n := r.running.Load(); n != 0 {
		t.Errorf("%d handlers still run after StopGracefully returned", n)
	}
}

// TestStopGracefullyCutsCallsWhenCtxEnds: a hanging call and an open stream hold the graceful
// stop until ctx ends; then both are cut, and StopGracefully returns once their handlers have
// returned, leaving no goroutine of its own behind.
func TestStopGracefullyCutsCallsWhenCtxEnds(t *testing.T) {
	r := newHoldingRuntime(t)
	srv, conn := serveHolding(t, r)
	client := runtimeapi.NewRuntimeServiceClient(conn)
	version := make(chan error, 1)
	go func() {
		_, err := client.Version(t.Context(), &runtimeapi.VersionRequest{})
		version <- err
	}()
	stream, err := client.GetContainerEvents(t.Context(), &runtimeapi.GetEventsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		await(t, r.started, "call at the server")
	}

	var logs bytes.Buffer
	logger := textlogger.NewLogger(textlogger.NewConfig(textlogger.Output(&logs)))
	errGrace := errors.New("grace period of the test over")
	ctx, cancel := context.WithCancelCause(klog.NewContext(t.Context(), logger))
	stopped := stopGracefully(ctx, srv)
	awaitGoAway(t, conn)
	select {
	case <-stopped:
		t.Fatal("StopGracefully returned while calls were open and ctx open")
	default:
	}

	cancel(errGrace)
	if err := await(t, version, "end of the hanging call"); status.Code(err) != codes.Unavailable {
		t.Errorf("hanging call ended with %v, want Unavailable", err)
	}
	if _, err := stream.Recv(); status.Code(err) != codes.Unavailable {
		t.Errorf("open stream ended with %v, want Unavailable", err)
	}
	// Both calls are cut; their handlers have not returned yet.
	select {
	case <-stopped:
		t.Fatal("StopGracefully returned while handlers of the server still ran")
	default:
	}
	r.letReturn()
	await(t, stopped, "return of StopGracefully")
	if n := r.running.Load(); n != 0 {
		t.Errorf("%d handlers still run after StopGracefully returned", n)
	}
	awaitNoGoroutineIn(t, "cri.StopGracefully")
	if got := logs.String(); !strings.Contains(got, "Grace period over") || !strings.Contains(got, errGrace.Error()) {
		t.Errorf("log %q does not say that the grace period is over and why", got)
	}
}

// awaitNoGoroutineIn waits until no goroutine runs fn. A goroutine whose last step has woken its
// waiter may still be listed for a moment before it exits: the test yields until it has, and
// fails if it is still there when stopTimeout has passed.
func awaitNoGoroutineIn(t *testing.T, fn string) {
	t.Helper()
	deadline := time.Now().Add(stopTimeout)
	buf := make([]byte, 1<<20)
	for {
		stacks := string(buf[:runtime.Stack(buf, true)])
		var left []string
		for g := range strings.SplitSeq(stacks, "\n\n") {
			if strings.Contains(g, fn) {
				left = append(left, g)
			}
		}
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("goroutines still in %s:\n%s", fn, strings.Join(left, "\n\n"))
		}
		runtime.Gosched()
	}
}
