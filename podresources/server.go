package podresources

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"
	v1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/podgate/podgate/cri"
	pb "github.com/podgate/podgate/podresources/api/v1alpha1"
)

// Defaults of the rate limit of podgate's socket: the kubelet's rate (100 QPS), with a burst
// that lets every pod of a full node start at once (multus asks on every CNI ADD) where the
// kubelet's 10 refuses most of them. A call to podgate costs the kubelet at most a share of
// one call (flightGroup), so podgate's burst need not be the kubelet's.
const (
	DefaultQPS   = 100
	DefaultBurst = 100
)

// maxRequestSize bounds a request: the largest a client needs is a Get with a 253-byte name
// and a 63-byte namespace, or a reflection request naming a file.
const maxRequestSize = 64 << 10

// Options configure a Server.
type Options struct {
	// Source is what podgate knows of the pods. Required.
	Source Source
	// Pulls lists the image pulls for PodPulls; nil: none are shown.
	Pulls PullLister
	// Broadcaster carries the changes to watches; nil: a broadcaster with the default limits
	// that nothing publishes to.
	Broadcaster *Broadcaster
	// KubeletSocket is the kubelet's PodResources socket to merge; empty: podgate's part alone.
	KubeletSocket string
	// KubeletQPS and KubeletBurst are podgate's own token bucket for its calls to the
	// kubelet's socket, at or below the kubelet's limit; zero means the defaults.
	KubeletQPS   float64
	KubeletBurst int
	// QPS and Burst are the token bucket every call but the health check takes from; zero
	// means the defaults.
	QPS   float64
	Burst int
	// Registerer takes the podgate_podresources_* metrics; nil: not registered.
	Registerer prometheus.Registerer
	// Logger is the handlers' logger (klog.FromContext of their context); unset: klog's
	// global logger.
	Logger klog.Logger
}

// Server is podgate's PodResources gRPC server: the v1 lister, podgate's extension, server
// reflection and gRPC health.
type Server struct {
	grpc        *grpc.Server
	health      *health.Server
	broadcaster *Broadcaster
	kubelet     *kubeletClient
}

// NewServer builds the server; Serve starts it on a listener.
func NewServer(o Options) (*Server, error) {
	if o.Source == nil {
		return nil, errors.New("podresources: no source")
	}
	if o.QPS == 0 {
		o.QPS = DefaultQPS
	}
	if o.Burst == 0 {
		o.Burst = DefaultBurst
	}
	if o.KubeletQPS == 0 {
		o.KubeletQPS = DefaultKubeletQPS
	}
	if o.KubeletBurst == 0 {
		o.KubeletBurst = DefaultKubeletBurst
	}
	if o.QPS < 0 || o.Burst < 0 {
		return nil, fmt.Errorf("podresources: qps %v and burst %d must be positive", o.QPS, o.Burst)
	}
	if o.KubeletQPS < 0 || o.KubeletBurst < 0 {
		return nil, fmt.Errorf("podresources: kubelet qps %v and burst %d must be positive", o.KubeletQPS, o.KubeletBurst)
	}
	if o.Broadcaster == nil {
		o.Broadcaster = NewBroadcaster(DefaultMaxWatchers, DefaultWatcherBuffer)
	}
	m := newMetrics(o.Registerer)
	m.registerWatchers(o.Registerer, o.Broadcaster)
	o.Broadcaster.mu.Lock()
	o.Broadcaster.onDrop = m.watchersDropped.Inc
	o.Broadcaster.mu.Unlock()

	s := &Server{health: health.NewServer(), broadcaster: o.Broadcaster}
	if o.KubeletSocket != "" {
		m.registerKubelet(o.Registerer)
		s.kubelet = newKubeletClient(o.KubeletSocket, m, o.KubeletQPS, o.KubeletBurst)
	}
	limit := &limiter{bucket: rate.NewLimiter(rate.Limit(o.QPS), o.Burst), qps: o.QPS, burst: o.Burst}
	s.grpc = grpc.NewServer(
		grpc.MaxRecvMsgSize(maxRequestSize),
		grpc.MaxSendMsgSize(MaxMessageSize),
		// A client that went away without closing its connection (a CNI plugin killed in the
		// middle of a call) is found and its connection closed.
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 2 * time.Minute, Timeout: 20 * time.Second}),
		grpc.ChainUnaryInterceptor(withLogger(o.Logger), m.countUnary, limit.unary),
		grpc.ChainStreamInterceptor(withStreamLogger(o.Logger), m.countStream, limit.stream),
	)
	v1.RegisterPodResourcesListerServer(s.grpc, &lister{source: o.Source, kubelet: s.kubelet})
	pb.RegisterPodResourcesServer(s.grpc, &extension{source: o.Source, broadcaster: o.Broadcaster, pulls: o.Pulls})
	healthpb.RegisterHealthServer(s.grpc, s.health)
	reflection.Register(s.grpc)
	for _, name := range []string{"", "v1.PodResourcesLister", pb.PodResources_ServiceDesc.ServiceName} {
		s.health.SetServingStatus(name, healthpb.HealthCheckResponse_SERVING)
	}
	return s, nil
}

// KubeletKnowsPod asks the kubelet's PodResources socket whether it manages the pod (its Get
// knows it), through the same rate limit and coalescing as the v1 calls, so that asking never
// pushes podgate over the kubelet's limit. Without a kubelet socket it is an error, and so at
// once with a socket nobody listens on (a kubelet that stopped left it behind), for which
// IsKubeletNotListening is true: only a kubelet that is there is waited for.
func (s *Server) KubeletKnowsPod(ctx context.Context, namespace, name string) (bool, error) {
	if s.kubelet == nil {
		return false, errNoKubelet
	}
	return s.kubelet.KnowsPod(ctx, namespace, name)
}

// IsKubeletNotListening reports whether err says that nobody listens on the kubelet's
// PodResources socket: no kubelet is there.
func IsKubeletNotListening(err error) bool { return callResult(err) == kubeletNotListening }

// Serve serves on l until Shutdown; it returns nil after Shutdown.
func (s *Server) Serve(l net.Listener) error {
	if err := s.grpc.Serve(l); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return err
	}
	return nil
}

// Shutdown reports NOT_SERVING, ends the watches, lets unary calls in flight finish until ctx
// ends, then closes every connection.
func (s *Server) Shutdown(ctx context.Context) {
	s.health.Shutdown()
	s.broadcaster.Close()
	cri.StopGracefully(klog.NewContext(ctx, klog.FromContext(ctx).WithValues("server", "PodResources")), s.grpc)
	if s.kubelet != nil {
		_ = s.kubelet.Close() // closing a client connection has nothing to report
	}
}

// limiter is the token bucket of the kubelet's PodResources server, over every call but the
// health check (a probe must not fail because a client is noisy).
type limiter struct {
	bucket *rate.Limiter
	qps    float64
	burst  int
}

func (l *limiter) allow(method string) error {
	if strings.HasPrefix(method, "/grpc.health.v1.Health/") || l.bucket.Allow() {
		return nil
	}
	return status.Errorf(codes.ResourceExhausted, "rejected by rate limit: podResources.qps %v, podResources.burst %d", l.qps, l.burst)
}

func (l *limiter) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if err := l.allow(info.FullMethod); err != nil {
		return nil, err
	}
	return handler(ctx, req)
}

func (l *limiter) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if err := l.allow(info.FullMethod); err != nil {
		return err
	}
	return handler(srv, ss)
}

// withLogger gives the handlers logger, when set.
func withLogger(logger klog.Logger) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if logger.GetSink() != nil {
			ctx = klog.NewContext(ctx, logger)
		}
		return handler(ctx, req)
	}
}

func withStreamLogger(logger klog.Logger) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if logger.GetSink() != nil {
			ss = &loggerStream{ServerStream: ss, ctx: klog.NewContext(ss.Context(), logger)}
		}
		return handler(srv, ss)
	}
}

// loggerStream is a stream whose context carries the server's logger.
type loggerStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *loggerStream) Context() context.Context { return s.ctx }

func (m *metrics) countUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	resp, err := handler(ctx, req)
	m.requests.WithLabelValues(info.FullMethod, status.Code(err).String()).Inc()
	return resp, err
}

func (m *metrics) countStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	err := handler(srv, ss)
	m.requests.WithLabelValues(info.FullMethod, status.Code(err).String()).Inc()
	return err
}
