package cri

import (
	"context"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/podgate/podgate/cri/relay"
)

// forward sends an intercepted call's request (req, encoded) to backend b and returns the
// backend's header and trailer metadata and its answer's bytes. It goes on the caller's own
// connection to the backend, which the relay keeps for the calls it passes through, so an
// intercepted call costs what a passed-through one does, plus its hooks. A detached method's
// call (a shared image pull, which may outlive its caller) goes on podgate's own connection.
func (s *Server) forward(ctx context.Context, call *relay.UnaryCall, b *Backend, fullMethod string, detached bool, req []byte) (hdr, trl metadata.MD, resp []byte, err error) {
	if detached {
		var rf frame
		hdr, trl, err = b.invoke(ctx, fullMethod, frameOf(req), &rf)
		if err != nil {
			return hdr, trl, nil, err
		}
		resp = rf.data.Materialize()
		rf.free()
		return hdr, trl, resp, nil
	}
	outCtx := b.statsBegin(ctx, fullMethod)
	md, _ := metadata.FromOutgoingContext(outCtx)
	a := call.Forward(ctx, s.targetOf(b), md, req)
	b.statsEnd(outCtx, a.Err)
	return a.Header, a.Trailer, a.Message, a.Err
}

// invoke makes one unary call to the backend on podgate's own connection, with the caller's
// metadata, deadline and cancellation, and returns the backend's header and trailer metadata.
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
