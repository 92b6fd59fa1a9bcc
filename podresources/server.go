package podresources

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
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

// Defaults of what one connection, and all together, may hold of the socket. A meta-CNI
// plugin makes one call on one connection per CNI ADD, and closes it.
const (
	DefaultMaxConnections = 64
	DefaultMaxStreams     = 16
	DefaultIdleTimeout    = 2 * time.Minute
)

// Defaults of what one process and the processes of one user may hold of the socket, inside
// its totals. A process gets a quarter of the socket's connections and watches, so that three
// others that take as much still leave room; a user three quarters, so that the processes of
// other users always have a quarter. The per-process quotas are the ones that bite first:
// a meta-CNI plugin and the process that misbehaves beside it are often both root, and the
// user's quota must still leave the plugin room beside one process at its own. The processes
// of one user that fork to take more are held to the user's quota, which does not protect a
// process of that same user; one of another user keeps its quarter.
const (
	DefaultMaxStreamsPerProcess = 2 * DefaultMaxStreams
	DefaultHeaderTimeout        = 10 * time.Second
	DefaultWatchSendTimeout     = 30 * time.Second
)

// perProcess and perUser are the default process's and user's quotas of a total.
func perProcess(total int) int { return max(1, total/4) }
func perUser(total int) int    { return max(1, total*3/4) }

// maxHeaderList bounds a call's header block (SETTINGS_MAX_HEADER_LIST_SIZE): a client sends a
// few hundred bytes; grpc-go's default, 16 MiB, lets one connection's HPACK references to a
// large -bin entry cost a gigabyte.
const maxHeaderList = 64 << 10

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
	// QPS and Burst are each client's token bucket (a client is a process, told by the
	// socket's peer credentials), which every call but the health check takes from as its
	// stream opens; zero means the defaults.
	QPS   float64
	Burst int
	// MaxConnections bounds the connections open at once; one over it is closed as it is
	// accepted. Zero means DefaultMaxConnections.
	MaxConnections int
	// MaxStreams bounds the calls open at once on one connection
	// (SETTINGS_MAX_CONCURRENT_STREAMS). Zero means DefaultMaxStreams.
	MaxStreams int
	// MaxConnectionsPerProcess and MaxConnectionsPerUser bound the connections one process,
	// and the processes of one user together, hold (a client told by the socket's peer
	// credentials); one over them is closed as it is accepted. Zero means a quarter and three
	// quarters of MaxConnections.
	MaxConnectionsPerProcess, MaxConnectionsPerUser int
	// MaxStreamsPerProcess and MaxStreamsPerUser bound the calls one process, and the
	// processes of one user, have open at once over all their connections; one over them is
	// ResourceExhausted. Zero means DefaultMaxStreamsPerProcess and three times the process's.
	MaxStreamsPerProcess, MaxStreamsPerUser int
	// MaxWatchesPerProcess and MaxWatchesPerUser bound the watches one process, and the
	// processes of one user, run at once, inside the Broadcaster's total. Zero means a quarter
	// and three quarters of that total.
	MaxWatchesPerProcess, MaxWatchesPerUser int
	// QPSPerUser and BurstPerUser are each user's token bucket, which the calls of all its
	// processes take from beside their own, so that forking does not multiply the rate. Zero
	// means twice QPS and Burst: one process can take at most half its user's rate.
	QPSPerUser   float64
	BurstPerUser int
	// HeaderTimeout closes a connection that has not opened a call (HTTP/2's preface, then a
	// call's headers) that long after it was accepted. Zero means DefaultHeaderTimeout.
	HeaderTimeout time.Duration
	// WatchSendTimeout ends a watch whose event could not be sent for that long, because its
	// client does not read. Zero means DefaultWatchSendTimeout.
	WatchSendTimeout time.Duration
	// IdleTimeout closes a connection that has had no call open for that long. Zero means
	// DefaultIdleTimeout.
	IdleTimeout time.Duration
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
	guard       *guard
}

// NewServer builds the server; Serve starts it on a listener.
func NewServer(o Options) (*Server, error) {
	if o.Source == nil {
		return nil, errors.New("podresources: no source")
	}
	o.QPS = cmp.Or(o.QPS, DefaultQPS)
	o.Burst = cmp.Or(o.Burst, DefaultBurst)
	o.KubeletQPS = cmp.Or(o.KubeletQPS, DefaultKubeletQPS)
	o.KubeletBurst = cmp.Or(o.KubeletBurst, DefaultKubeletBurst)
	if o.QPS < 0 || o.Burst < 0 {
		return nil, fmt.Errorf("podresources: qps %v and burst %d must be positive", o.QPS, o.Burst)
	}
	if o.MaxConnections < 0 || o.MaxStreams < 0 || o.IdleTimeout < 0 {
		return nil, fmt.Errorf("podresources: maxConnections %d, maxStreams %d and idleTimeout %v must be positive", o.MaxConnections, o.MaxStreams, o.IdleTimeout)
	}
	o.MaxConnections = cmp.Or(o.MaxConnections, DefaultMaxConnections)
	o.MaxStreams = cmp.Or(o.MaxStreams, DefaultMaxStreams)
	o.IdleTimeout = cmp.Or(o.IdleTimeout, DefaultIdleTimeout)
	if o.Broadcaster == nil {
		o.Broadcaster = NewBroadcaster(DefaultMaxWatchers, DefaultWatcherBuffer)
	}
	if err := o.setQuotas(); err != nil {
		return nil, err
	}
	if o.KubeletQPS < 0 || o.KubeletBurst < 0 {
		return nil, fmt.Errorf("podresources: kubelet qps %v and burst %d must be positive", o.KubeletQPS, o.KubeletBurst)
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
	s.guard = newGuard(o, m)
	if o.Registerer != nil {
		o.Registerer.MustRegister(newSlotsCollector(s.guard.slots))
	}
	s.grpc = grpc.NewServer(serverOptions(o, s.guard, m)...)
	v1.RegisterPodResourcesListerServer(s.grpc, &lister{source: o.Source, kubelet: s.kubelet})
	pb.RegisterPodResourcesServer(s.grpc, &extension{source: o.Source, broadcaster: o.Broadcaster, pulls: o.Pulls,
		sendTimeout: o.WatchSendTimeout, onStall: s.guard.stalled})
	healthpb.RegisterHealthServer(s.grpc, s.health)
	reflection.Register(s.grpc)
	for _, name := range []string{"", "v1.PodResourcesLister", pb.PodResources_ServiceDesc.ServiceName} {
		s.health.SetServingStatus(name, healthpb.HealthCheckResponse_SERVING)
	}
	return s, nil
}

// newGuard is what the socket holds its clients to, as o says.
func newGuard(o Options, m *metrics) *guard {
	logger := o.Logger
	if logger.GetSink() == nil {
		logger = klog.Background()
	}
	return &guard{
		clients: newClients(o.QPS, o.Burst, o.QPSPerUser, o.BurstPerUser, maxClients, time.Now),
		slots: newSlots([numKinds]quota{
			kindConnections: {total: o.MaxConnections, perUser: o.MaxConnectionsPerUser, perProcess: o.MaxConnectionsPerProcess,
				totalKey: "podResources.maxConnections", perUserKey: "podResources.maxConnectionsPerUser", perProcessKey: "podResources.maxConnectionsPerProcess"},
			// The streams' total is the connections' times maxStreams, which grpc-go holds.
			kindStreams: {perUser: o.MaxStreamsPerUser, perProcess: o.MaxStreamsPerProcess,
				perUserKey: "podResources.maxStreamsPerUser", perProcessKey: "podResources.maxStreamsPerProcess"},
			kindWatches: {total: o.Broadcaster.max, perUser: o.MaxWatchesPerUser, perProcess: o.MaxWatchesPerProcess,
				totalKey: "the socket's watches", perUserKey: "podResources.maxWatchesPerUser", perProcessKey: "podResources.maxWatchesPerProcess"},
		}),
		refusals:         newRefusals(logger.WithValues("server", "PodResources"), m.refusals),
		requests:         m.requests,
		watchersDropped:  m.watchersDropped,
		headerTimeout:    o.HeaderTimeout,
		watchSendTimeout: o.WatchSendTimeout,
	}
}

// setQuotas checks the per-process and per-user quotas and fills in their defaults; the
// totals and the Broadcaster are set.
func (o *Options) setQuotas() error {
	if o.MaxConnectionsPerProcess < 0 || o.MaxConnectionsPerUser < 0 || o.MaxStreamsPerProcess < 0 || o.MaxStreamsPerUser < 0 ||
		o.MaxWatchesPerProcess < 0 || o.MaxWatchesPerUser < 0 || o.QPSPerUser < 0 || o.BurstPerUser < 0 || o.HeaderTimeout < 0 || o.WatchSendTimeout < 0 {
		return errors.New("podresources: the per-process and per-user quotas, headerTimeout and watchSendTimeout must be positive")
	}
	o.MaxConnectionsPerProcess = cmp.Or(o.MaxConnectionsPerProcess, perProcess(o.MaxConnections))
	o.MaxConnectionsPerUser = cmp.Or(o.MaxConnectionsPerUser, max(o.MaxConnectionsPerProcess, perUser(o.MaxConnections)))
	o.MaxStreamsPerProcess = cmp.Or(o.MaxStreamsPerProcess, DefaultMaxStreamsPerProcess)
	o.MaxStreamsPerUser = cmp.Or(o.MaxStreamsPerUser, 3*o.MaxStreamsPerProcess)
	o.MaxWatchesPerProcess = cmp.Or(o.MaxWatchesPerProcess, perProcess(o.Broadcaster.max))
	o.MaxWatchesPerUser = cmp.Or(o.MaxWatchesPerUser, max(o.MaxWatchesPerProcess, perUser(o.Broadcaster.max)))
	o.QPSPerUser = cmp.Or(o.QPSPerUser, 2*o.QPS)
	o.BurstPerUser = cmp.Or(o.BurstPerUser, 2*o.Burst)
	o.HeaderTimeout = cmp.Or(o.HeaderTimeout, DefaultHeaderTimeout)
	o.WatchSendTimeout = cmp.Or(o.WatchSendTimeout, DefaultWatchSendTimeout)
	for _, q := range []struct {
		name          string
		process, user int
	}{
		{"maxConnections", o.MaxConnectionsPerProcess, o.MaxConnectionsPerUser},
		{"maxStreams", o.MaxStreamsPerProcess, o.MaxStreamsPerUser},
		{"maxWatches", o.MaxWatchesPerProcess, o.MaxWatchesPerUser},
	} {
		if q.process > q.user {
			return fmt.Errorf("podresources: %sPerProcess %d is over %sPerUser %d", q.name, q.process, q.name, q.user)
		}
	}
	return nil
}

// serverOptions are the gRPC server's limits and interceptors.
func serverOptions(o Options, g *guard, m *metrics) []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.Creds(peerCreds{}), // the client's uid and pid, for its rate limit and the log
		grpc.InTapHandle(g.tap),
		grpc.MaxRecvMsgSize(maxRequestSize),
		grpc.MaxSendMsgSize(MaxMessageSize),
		grpc.MaxHeaderListSize(maxHeaderList),
		grpc.MaxConcurrentStreams(uint32(o.MaxStreams)),
		// A connection left idle is closed, and one whose client went away without closing it
		// (a CNI plugin killed in the middle of a call) is found by a PING and closed.
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: o.IdleTimeout, Time: 2 * time.Minute, Timeout: 20 * time.Second}),
		// A client that pings more than once a minute is told to calm down and closed.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: time.Minute, PermitWithoutStream: true}),
		grpc.ChainUnaryInterceptor(withLogger(o.Logger), m.countUnary),
		grpc.ChainStreamInterceptor(withStreamLogger(o.Logger), m.countStream),
	}
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

// Serve serves on l until Shutdown, within the connection cap; it returns nil after Shutdown.
func (s *Server) Serve(l net.Listener) error {
	if err := s.grpc.Serve(s.guard.listen(l)); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
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
