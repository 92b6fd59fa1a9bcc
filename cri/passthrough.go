package cri

import (
	"context"
	"errors"
	"io"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// passthrough is the transparent handler: grpc gives it every call no interceptor claimed. The
// call's messages are forwarded as raw frames to the backend of its service.
func (s *Server) passthrough(_ any, ss grpc.ServerStream) error {
	fullMethod, ok := grpc.MethodFromServerStream(ss)
	if !ok {
		return status.Error(codes.Internal, "no method in stream")
	}
	ctx := ss.Context()
	b := s.backendFor(fullMethod)
	if b == nil {
		// Never a generic tunnel: podgate's socket must not expose containerd's own API.
		return s.instrument(ctx, fullMethod, func() error { return unknownService(fullMethod) })
	}
	return s.instrument(ctx, fullMethod, func() error {
		if s.unary[fullMethod] {
			return s.forwardUnary(ctx, ss, b, fullMethod)
		}
		return s.forwardStream(ctx, ss, b, fullMethod)
	})
}

// forwardUnary forwards a unary call: one request frame, one response frame, headers and
// trailers both ways.
func (s *Server) forwardUnary(ctx context.Context, ss grpc.ServerStream, b *Backend, fullMethod string) error {
	var req frame
	if err := ss.RecvMsg(&req); err != nil {
		return err
	}
	var resp frame
	hdr, trl, err := b.invoke(ctx, fullMethod, &req, &resp)
	if len(hdr) > 0 {
		_ = ss.SetHeader(hdr) // fails only after headers went out, which they have not
	}
	if len(trl) > 0 {
		ss.SetTrailer(trl)
	}
	if err != nil {
		return err
	}
	return ss.SendMsg(&resp)
}

// invoke makes one unary call to the backend with the caller's metadata, deadline and
// cancellation, and returns the backend's header and trailer metadata.
func (b *Backend) invoke(ctx context.Context, fullMethod string, req, resp any) (hdr, trl metadata.MD, err error) {
	if err := b.usable(ctx); err != nil {
		return nil, nil, err
	}
	err = b.conn.Invoke(outgoing(ctx), fullMethod, req, resp, grpc.Header(&hdr), grpc.Trailer(&trl))
	return hdr, trl, b.transportError(err)
}

// forwardStream forwards a call of any shape, message by message, over one backend stream per
// client stream: server streams such as GetContainerEvents, and methods podgate's cri-api does
// not know. Open streams end with Unavailable when podgate shuts down.
func (s *Server) forwardStream(ctx context.Context, ss grpc.ServerStream, b *Backend, fullMethod string) error {
	if err := b.usable(ctx); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stopAfter := context.AfterFunc(s.stopping, cancel)
	defer stopAfter()

	desc := &grpc.StreamDesc{StreamName: shortMethod(fullMethod), ServerStreams: true, ClientStreams: true}
	cs, err := b.conn.NewStream(outgoing(ctx), desc, fullMethod)
	if err != nil {
		return s.streamError(b, err)
	}
	go pumpToBackend(ss, cs, cancel)

	for first := true; ; first = false {
		var f frame
		if err := cs.RecvMsg(&f); err != nil {
			ss.SetTrailer(cs.Trailer())
			if errors.Is(err, io.EOF) {
				return nil
			}
			return s.streamError(b, err)
		}
		if first {
			// The header arrived with the first message (grpc-go servers send it then), so
			// Header does not block here; asking earlier would hold a stream that waits
			// for its first event.
			if hdr, err := cs.Header(); err == nil && len(hdr) > 0 {
				if err := ss.SendHeader(hdr); err != nil {
					return err
				}
			}
		}
		if err := ss.SendMsg(&f); err != nil {
			return err
		}
	}
}

// pumpToBackend copies the client's messages to the backend stream and half-closes it at the
// client's end of input; a broken client stream cancels the call.
func pumpToBackend(ss grpc.ServerStream, cs grpc.ClientStream, cancel context.CancelFunc) {
	for {
		var f frame
		if err := ss.RecvMsg(&f); err != nil {
			if errors.Is(err, io.EOF) {
				_ = cs.CloseSend() // always nil for grpc-go client streams
			} else {
				cancel()
			}
			return
		}
		if err := cs.SendMsg(&f); err != nil {
			// The backend ended the stream; RecvMsg on the other side reports why.
			return
		}
	}
}

func (s *Server) streamError(b *Backend, err error) error {
	if s.stopping.Err() != nil {
		return status.Error(codes.Unavailable, "podgate is shutting down")
	}
	return b.transportError(err)
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
		if strings.HasPrefix(k, ":") || reservedHeader[k] {
			delete(in, k)
		}
	}
	if len(in) == 0 {
		return ctx
	}
	return metadata.NewOutgoingContext(ctx, in)
}

var reservedHeader = map[string]bool{
	"content-type": true, "user-agent": true, "te": true, "grpc-timeout": true,
	"grpc-encoding": true, "grpc-accept-encoding": true, "grpc-message-type": true,
	"grpc-status": true, "grpc-message": true, "grpc-status-details-bin": true,
}
