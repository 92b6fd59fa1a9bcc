package cri

import (
	"context"

	"google.golang.org/grpc"
	"k8s.io/klog/v2"
)

// StopGracefully stops s within ctx's lifetime. First gracefully (grpc.Server.GracefulStop): s
// accepts no more connections or calls and lets the calls in flight finish. If ctx ends first,
// it logs so with ctx's logger and cuts the calls still open (grpc.Server.Stop): their handlers'
// contexts are cancelled and their clients see the connection close, as Unavailable.
//
// Either way it returns only once GracefulStop has returned, which grpc-go does after every
// handler of s has returned: neither the goroutine it runs GracefulStop in nor any handler of s
// outlives the call. A handler that ignores its context's cancellation therefore holds it up
// past ctx's end.
func StopGracefully(ctx context.Context, s *grpc.Server) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.GracefulStop()
	}()
	select {
	case <-done:
		return
	case <-ctx.Done():
	}
	klog.FromContext(ctx).Info("Grace period over, closing the calls still open", "reason", context.Cause(ctx))
	s.Stop()
	<-done // GracefulStop returns once Stop has closed the connections and the handlers have returned
}
