package cri

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podgate/podgate/test/testfs"
)

// TestQuietWaitsForTheCallsInFlight: Quiet does not return while a call is served (until its
// ctx ends, or at most most), and returns once the calls have ended and quiet has passed.
func TestQuietWaitsForTheCallsInFlight(t *testing.T) {
	r := newHoldingRuntime(t)
	sock := filepath.Join(testfs.ShortDir(t), "rt.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	rt := grpc.NewServer()
	runtimeapi.RegisterRuntimeServiceServer(rt, r)
	go rt.Serve(l) //nolint:errcheck // ends with Stop
	t.Cleanup(rt.Stop)
	s, conn := proxyFor(t, sock, "", nil)

	version := make(chan error, 1)
	go func() {
		_, err := runtimeapi.NewRuntimeServiceClient(conn).Version(t.Context(), &runtimeapi.VersionRequest{})
		version <- err
	}()
	await(t, r.started, "Version call at the runtime")
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	if err := s.Quiet(ctx, time.Millisecond, time.Hour); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Quiet with a call in flight: %v, want it to wait until its context ends", err)
	}
	if err := s.Quiet(t.Context(), time.Millisecond, 10*time.Millisecond); err != nil {
		t.Errorf("Quiet with a call in flight, at most 10ms: %v, want nil once that is over", err)
	}
	close(r.answer)
	r.letReturn()
	if err := await(t, version, "Version answer"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel = context.WithTimeout(t.Context(), stopTimeout)
	defer cancel()
	if err := s.Quiet(ctx, time.Millisecond, time.Hour); err != nil {
		t.Errorf("Quiet once the call ended: %v, want nil", err)
	}
}
