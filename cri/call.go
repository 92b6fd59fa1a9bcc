package cri

import (
	"context"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/podgate/podgate/cri/relay"
)

// invoke makes one unary call to the backend with the caller's metadata, deadline and
// cancellation, and returns the backend's header and trailer metadata.
func (b *Backend) invoke(ctx context.Context, fullMethod string, req, resp any) (hdr, trl metadata.MD, err error) {
	if err := b.usable(ctx); err != nil {
		return nil, nil, err
	}
	err = b.conn.Invoke(outgoing(ctx), fullMethod, req, resp, grpc.Header(&hdr), grpc.Trailer(&trl))
	return hdr, trl, b.transportError(err)
}

// outgoing turns the caller's incoming metadata into the backend call's outgoing metadata.
// HTTP/2 pseudo-headers and the headers grpc sets itself are left out; grpc carries the
// deadline (grpc-timeout) and cancellation from ctx. It runs on every forwarded call, and a
// kubelet's call usually carries nothing else (:authority, content-type, user-agent only):
// then ctx goes on as it is, without a second map or context value.
func outgoing(ctx context.Context) context.Context {
	in, ok := metadata.FromIncomingContext(ctx) // a copy, ours to trim
	if !ok {
		return ctx
	}
	for k := range in {
		if relay.GRPCSetsItself(k) {
			delete(in, k)
		}
	}
	if len(in) == 0 {
		return ctx
	}
	return metadata.NewOutgoingContext(ctx, in)
}
