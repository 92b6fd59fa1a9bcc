package cri

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containerd/errdefs"

	"github.com/containerd/errdefs/pkg/errgrpc"
	"github.com/podgate/podgate/cri/relay"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/klog/v2"
)

var (
	runtimeService = runtimeapi.RuntimeService_ServiceDesc.ServiceName
	imageService   = runtimeapi.ImageService_ServiceDesc.ServiceName
)

// Server is the CRI proxy. Its socket is served by a frame-level HTTP/2 relay (cri/relay): a
// call podgate does not intercept goes to the runtime as it came, frame by frame; the relay
// answers the calls podgate intercepts in the process, with their handlers, which decode them,
// run the interceptors and call the runtime; it refuses calls of services that are not CRI.
type Server struct {
	runtime *Backend
	image   *Backend
	metrics *Metrics
	logger  klog.Logger
	// runtimeClient is podgate's own client of the runtime, one for the connection: its lists
	// stream where the runtime can (StreamingLists), which it remembers.
	runtimeClient runtimeapi.RuntimeServiceClient

	relay *relay.Server
	// The relay's targets: the runtime and image backends, and podgate itself for services
	// that are not CRI.
	runtimeTarget, imageTarget, refuseTarget *relay.Target
	// unary holds the methods podgate's cri-api declares unary, and the newer unary methods it
	// knows by name (newerMethods); every other method (streams, and methods newer than
	// podgate) is long-lived: Shutdown ends it.
	unary map[string]bool
	// chains maps a full method name to its *interceptedMethod, unaryHandlers to its
	// serveUnary, and handlerTargets to the relay's target that answers the method with it.
	chains         map[string]any
	unaryHandlers  map[string]func(context.Context, *relay.UnaryCall) *relay.UnaryAnswer
	handlerTargets map[string]*relay.Target
	started        bool

	// limits bound what a client of the socket can make podgate hold, and for how long
	// (relay.DefaultLimits where a field is zero).
	limits relay.Limits

	// statsHandlers see every call (tracing), as a gRPC server's would; none by default, and
	// then a call costs nothing more.
	statsHandlers []stats.Handler

	// inFlight counts the calls being served; lastEnd is when the last one ended (UnixNano):
	// Quiet's view of the caller's activity.
	inFlight atomic.Int64
	lastEnd  atomic.Int64

	mu sync.Mutex
}

// Option configures a Server.
type Option func(*Server)

// WithMetrics records per-method metrics in m.
func WithMetrics(m *Metrics) Option { return func(s *Server) { s.metrics = m } }

// WithStatsHandler adds a gRPC stats handler that sees every call, intercepted or passed
// through, as a gRPC server's stats handler would: tracing's, which continues the kubelet's
// trace from the call's metadata. Without one a call costs nothing more.
func WithStatsHandler(h stats.Handler) Option {
	return func(s *Server) { s.statsHandlers = append(s.statsHandlers, h) }
}

// WithLimits sets the limits of what one client of the socket can make podgate hold, and for
// how long; relay.DefaultLimits without it.
func WithLimits(l relay.Limits) Option { return func(s *Server) { s.limits = l } }

// WithLogger sets the server's logger (default: klog's global logger).
func WithLogger(l klog.Logger) Option { return func(s *Server) { s.logger = l } }

// NewServer creates a proxy that sends RuntimeService calls to runtime and ImageService calls
// to image (which may be the same Backend). Register interceptors with Intercept, then Serve.
func NewServer(runtime, image *Backend, opts ...Option) *Server {
	s := &Server{
		runtime:       runtime,
		image:         image,
		logger:        klog.Background(),
		unary:         map[string]bool{},
		chains:        map[string]any{},
		unaryHandlers: map[string]func(context.Context, *relay.UnaryCall) *relay.UnaryAnswer{},
	}
	for _, o := range opts {
		o(s)
	}
	if s.metrics == nil {
		s.metrics = NewMetrics(prometheus.NewRegistry())
	}
	for _, sd := range []*grpc.ServiceDesc{&runtimeapi.RuntimeService_ServiceDesc, &runtimeapi.ImageService_ServiceDesc} {
		for _, m := range sd.Methods {
			s.unary["/"+sd.ServiceName+"/"+m.MethodName] = true
		}
	}
	for _, name := range newerMethodNames() {
		s.unary[name] = true
	}
	s.runtimeClient = StreamingLists(runtimeapi.NewRuntimeServiceClient(runtime.conn))
	s.runtimeTarget = runtime.target()
	s.imageTarget = s.runtimeTarget
	if image != runtime {
		s.imageTarget = image.target()
	}
	s.refuseTarget = &relay.Target{Name: "podgate", Refuse: unknownService}
	s.relay = &relay.Server{
		Route:           s.route,
		Observer:        &observer{s: s},
		LongLived:       func(path string) bool { return !s.unary[path] },
		ShutdownMessage: "podgate is shutting down",
		Limits:          s.limits,
		Logger:          s.logger.WithValues("server", "CRI"),
		Refused:         s.metrics.refused,
	}
	limit := s.limits.TotalBytes
	if limit <= 0 {
		limit = relay.DefaultLimits.TotalBytes
	}
	s.metrics.watchBudget(s.relay.Held, limit)
	return s
}

// route says where a call goes: to podgate's handler when podgate intercepts it, to the
// backend of its service as it is otherwise, to podgate's refusal when its service is not CRI.
func (s *Server) route(fullMethod string) *relay.Target {
	if t, ok := s.handlerTargets[fullMethod]; ok {
		return t
	}
	switch s.backendFor(fullMethod) {
	case s.runtime:
		return s.runtimeTarget
	case s.image:
		return s.imageTarget
	}
	return s.refuseTarget
}

// targetOf is backend b as the relay's target: the one its passed-through calls go to.
func (s *Server) targetOf(b *Backend) *relay.Target {
	if b == s.image {
		return s.imageTarget
	}
	return s.runtimeTarget
}

// Serve serves CRI on l until Shutdown. It returns nil after a Shutdown.
func (s *Server) Serve(l net.Listener) error {
	s.mu.Lock()
	if !s.started {
		s.started = true
		s.handlerTargets = map[string]*relay.Target{}
		for name, h := range s.unaryHandlers {
			s.handlerTargets[name] = &relay.Target{Name: "podgate", Unary: h, MaxMessage: MaxMessageSize}
		}
	}
	s.mu.Unlock()
	return s.relay.Serve(l)
}

// Shutdown stops accepting connections, ends open streams (their clients get Unavailable and
// reconnect, as after a runtime restart), and lets unary calls in flight finish until ctx ends;
// then it cuts what is left.
func (s *Server) Shutdown(ctx context.Context) {
	s.relay.Shutdown(klog.NewContext(ctx, s.logger.WithValues("server", "CRI")))
}

// backendFor returns the backend that serves fullMethod, or nil for a service that is not CRI.
func (s *Server) backendFor(fullMethod string) *Backend {
	service, _, ok := strings.Cut(strings.TrimPrefix(fullMethod, "/"), "/")
	switch {
	case !ok:
		return nil
	case service == runtimeService:
		return s.runtime
	case service == imageService:
		return s.image
	}
	return nil
}

// instrument is the one boundary every call passes: it records metrics and maps an error to a
// gRPC status exactly once.
func (s *Server) instrument(ctx context.Context, fullMethod string, call func() error) error {
	mm := s.metrics.forMethod(fullMethod)
	mm.inFlight.Inc()
	s.inFlight.Add(1)
	start := time.Now()
	err := toStatus(ctx, call())
	code := status.Code(err)
	mm.done(start, code)
	s.lastEnd.Store(time.Now().UnixNano())
	s.inFlight.Add(-1)
	if err != nil && s.logger.V(3).Enabled() {
		s.logger.V(3).Info("CRI call failed", "method", shortMethod(fullMethod), "code", code.String(), "err", err)
	}
	return err
}

// toStatus maps err to a gRPC status error. A status (from the backend or an interceptor)
// passes through unchanged; context errors become Canceled or DeadlineExceeded; an error of an
// errdefs class (a policy's refusal) gets that class's code from errgrpc, as in containerd;
// anything else is Internal. The message is always err's own.
func toStatus(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	// FromError also finds a status wrapped by an interceptor ("prepare claim x: <status>").
	// Its message is then the whole chain's, with the inner status printed as "rpc error: code
	// = … desc = …": the code is said once, by the status itself.
	if st, ok := status.FromError(err); ok {
		return wrappedStatus(err, st).Err()
	}
	// The first class in the chain wins: "driver x: unavailable: context deadline exceeded"
	// is the driver's failure (Unavailable), not the caller's deadline. Context errors are
	// classes too. Before the call's own context: a refusal stays a refusal even if the caller
	// has gone. errdefs.Resolve says ErrUnknown both for an error of no class and for one of
	// class ErrUnknown; only the latter is Unknown, the rest is podgate's own failure.
	if !errors.Is(errdefs.Resolve(err), errdefs.ErrUnknown) || errdefs.IsUnknown(err) {
		return errgrpc.ToGRPC(err)
	}
	if ctx.Err() != nil {
		return status.Error(status.FromContextError(ctx.Err()).Code(), err.Error())
	}
	return status.Error(codes.Internal, err.Error())
}

// wrappedStatus is st, found in err, with the inner status's text in err's message replaced by
// its own message: "prepare claim x: driver not registered", not "prepare claim x: rpc error:
// code = FailedPrecondition desc = driver not registered". Details are kept.
func wrappedStatus(err error, st *status.Status) *status.Status {
	var inner interface {
		error
		GRPCStatus() *status.Status
	}
	if !errors.As(err, &inner) || inner == err { //nolint:errorlint // identity: is err the status itself?
		return st
	}
	p := st.Proto()
	p.Message = strings.Replace(err.Error(), inner.Error(), inner.GRPCStatus().Message(), 1)
	return status.FromProto(p)
}

func methodNames(ms []grpc.MethodDesc, ss []grpc.StreamDesc) []string {
	names := make([]string, 0, len(ms)+len(ss))
	for _, m := range ms {
		names = append(names, m.MethodName)
	}
	for _, st := range ss {
		names = append(names, st.StreamName)
	}
	return names
}

func unknownService(fullMethod string) error {
	return status.Errorf(codes.Unimplemented, "podgate serves only %s and %s, not %s", runtimeService, imageService, relay.Clip(fullMethod))
}

// Probe checks that every backend answers a cheap call (Version for the runtime, ImageFsInfo
// for a separate image endpoint), for /readyz.
func (s *Server) Probe(ctx context.Context) error {
	var resp frame
	if _, _, err := s.runtime.invoke(ctx, "/"+runtimeService+"/Version", frameOf(nil), &resp); err != nil {
		return err
	}
	resp.free()
	if s.image != s.runtime {
		if _, _, err := s.image.invoke(ctx, "/"+imageService+"/ImageFsInfo", frameOf(nil), &resp); err != nil {
			return err
		}
		resp.free()
	}
	return nil
}

// RuntimeClient is a client of the backend runtime, for interceptors that must ask it something
// (a sandbox's status) or clean up after a call they fail, and for podgate's own lists: its
// ListPodSandbox and ListContainers stream where the runtime serves list streaming
// (StreamingLists), so that a node with more containers than one 16 MiB message holds is listed
// whole. It is the same client for every caller, which shares what the runtime serves.
func (s *Server) RuntimeClient() runtimeapi.RuntimeServiceClient {
	return s.runtimeClient
}

// Quiet waits until no call has been served for quiet (none in flight, the last ended quiet
// ago), at most for most, or until ctx ends (its error). Work of podgate's own that can wait,
// such as reading a new sandbox's verbose status for the registry, waits for it so that it
// does not run beside the caller's next calls: the kubelet makes them back to back after a
// RunPodSandbox or a StartContainer, and containerd and the CPUs serve them slower meanwhile.
func (s *Server) Quiet(ctx context.Context, quiet, most time.Duration) error {
	deadline := time.Now().Add(most)
	for {
		now := time.Now()
		wait := quiet
		if s.inFlight.Load() == 0 {
			wait = quiet - now.Sub(time.Unix(0, s.lastEnd.Load()))
		}
		if wait <= 0 || !now.Before(deadline) {
			return nil
		}
		wait = min(wait, deadline.Sub(now))
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return context.Cause(ctx)
		}
	}
}
