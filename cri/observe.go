package cri

import (
	"context"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"

	"github.com/podgate/podgate/cri/relay"
)

// observer records the metrics of the calls the relay forwards to a backend (podgate's own
// handlers record theirs: instrument) and, with stats handlers, shows those calls to them as
// a gRPC server and client would: the server's handlers see the call come in, the backend's
// see it go out, and the trace context they write for the backend replaces the caller's.
type observer struct{ s *Server }

// relayedCall is a call the relay forwards to a backend, while it is open.
type relayedCall struct {
	mm    *methodMetrics
	path  string
	start time.Time
	// The contexts the stats handlers tagged, server side and backend side.
	inCtx, outCtx context.Context
	backend       *Backend
}

func (o *observer) Begin(c *relay.Call) any {
	if c.Target != nil && c.Target.Unary != nil {
		return nil // instrumented by its handler
	}
	mm := o.s.metrics.forMethod(c.Path)
	mm.inFlight.Inc()
	o.s.inFlight.Add(1)
	rc := &relayedCall{mm: mm, path: c.Path, start: time.Now()}
	if len(o.s.statsHandlers) > 0 {
		rc.backend = o.s.backendFor(c.Path)
		o.traceBegin(rc, c)
	}
	return rc
}

func (o *observer) End(token any, code codes.Code) {
	c, ok := token.(*relayedCall)
	if !ok {
		return
	}
	if c.inCtx != nil {
		o.traceEnd(c, code)
	}
	c.mm.done(c.start, code)
	o.s.lastEnd.Store(time.Now().UnixNano())
	o.s.inFlight.Add(-1)
	if code != codes.OK && o.s.logger.V(3).Enabled() {
		o.s.logger.V(3).Info("CRI call failed", "method", shortMethod(c.path), "code", code.String())
	}
}

// traceBegin shows the call to the stats handlers: coming in with the caller's metadata, going
// out to the backend with what the backend's handlers add (the trace context of podgate's
// span), which the relay then sends in place of the caller's.
func (o *observer) traceBegin(rc *relayedCall, c *relay.Call) {
	md, _ := c.Metadata() // a malformed binary value is the backend's to refuse
	rc.inCtx = o.s.statsBegin(metadata.NewIncomingContext(context.Background(), md), c.Path, !o.s.unary[c.Path])
	if rc.backend == nil {
		return
	}
	rc.outCtx = rc.backend.statsBegin(rc.inCtx, c.Path)
	if out, _ := metadata.FromOutgoingContext(rc.outCtx); len(out) > 0 {
		c.SetMetadata(out)
	}
}

// traceEnd tells the stats handlers the call ended, with its code.
func (o *observer) traceEnd(rc *relayedCall, code codes.Code) {
	var err error
	if code != codes.OK {
		err = status.Error(code, code.String())
	}
	if rc.outCtx != nil {
		rc.backend.statsEnd(rc.outCtx, err)
	}
	o.s.statsEnd(rc.inCtx, err)
}

// statsBegin shows a call going out to the backend to its stats handlers, as a gRPC client
// does, and returns the context they tagged: its outgoing metadata is what they add to the
// call (the trace context of podgate's span).
func (b *Backend) statsBegin(ctx context.Context, path string) context.Context {
	return statsBegin(ctx, b.statsHandlers, path, stats.Begin{Client: true})
}

// statsEnd tells the backend's stats handlers that the call of ctx (statsBegin's) ended.
func (b *Backend) statsEnd(ctx context.Context, err error) {
	statsEnd(ctx, b.statsHandlers, true, err)
}

// statsBegin shows a call coming in to the stats handlers, as a gRPC server does, and returns
// the context they tagged.
func (s *Server) statsBegin(ctx context.Context, path string, serverStream bool) context.Context {
	return statsBegin(ctx, s.statsHandlers, path, stats.Begin{IsServerStream: serverStream})
}

// statsEnd tells the stats handlers that the call of ctx (statsBegin's) ended, with err.
func (s *Server) statsEnd(ctx context.Context, err error) {
	statsEnd(ctx, s.statsHandlers, false, err)
}

// statsBegin tags a call for handlers and tells them it began (begin, its time set now), and
// returns the context they tagged.
func statsBegin(ctx context.Context, handlers []stats.Handler, path string, begin stats.Begin) context.Context {
	if len(handlers) == 0 {
		return ctx
	}
	info := &stats.RPCTagInfo{FullMethodName: path}
	begin.BeginTime = time.Now()
	for _, h := range handlers {
		ctx = h.TagRPC(ctx, info)
		ev := begin
		h.HandleRPC(ctx, &ev)
	}
	return ctx
}

// statsEnd tells handlers that the call of ctx (statsBegin's) ended, with err; client says on
// which side.
func statsEnd(ctx context.Context, handlers []stats.Handler, client bool, err error) {
	now := time.Now()
	for _, h := range handlers {
		h.HandleRPC(ctx, &stats.End{Client: client, EndTime: now, Error: err})
	}
}
