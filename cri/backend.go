package cri

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/fsnotify/fsnotify"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"

	"github.com/podgate/podgate/cri/endpoint"
	"github.com/podgate/podgate/cri/relay"
)

// MaxMessageSize is the largest CRI message podgate accepts or sends, both ways: the kubelet's
// own limit (16 MiB), so a response the kubelet would take is never cut by the proxy.
const MaxMessageSize = 16 << 20

// Backend is a connection to a runtime's CRI socket. It connects in the background, reconnects
// with capped backoff, and makes calls fail fast with codes.Unavailable, naming the backend,
// while the runtime is down instead of letting them wait for the kubelet's deadline.
type Backend struct {
	name     string
	endpoint string
	path     string
	conn     *grpc.ClientConn
	// connectWait bounds how long a call waits for a connection that is being made.
	connectWait time.Duration
	lastDialErr atomic.Pointer[string]
	onState     func(up bool)
	// statsHandlers see every call to the backend (tracing).
	statsHandlers []stats.Handler
}

// BackendOption configures a Backend.
type BackendOption func(*Backend)

// WithConnectWait sets how long a call waits for a connection attempt in progress before it
// fails with Unavailable (default 2s). A unix socket either accepts or refuses at once, so this
// only matters for a runtime that is starting or hung.
func WithConnectWait(d time.Duration) BackendOption {
	return func(b *Backend) { b.connectWait = d }
}

// WithBackendStatsHandler adds a gRPC stats handler that sees every call to the backend:
// tracing's, which passes podgate's span on to containerd in the call's metadata, in place of
// the kubelet's it would otherwise forward. Without one the connection is built as before.
func WithBackendStatsHandler(h stats.Handler) BackendOption {
	return func(b *Backend) { b.statsHandlers = append(b.statsHandlers, h) }
}

// WithStateFunc sets a function called with every change of the backend between connected and
// not connected, from the backend's watcher goroutine.
func WithStateFunc(f func(up bool)) BackendOption {
	return func(b *Backend) { b.onState = f }
}

// ParseEndpoint accepts "unix:///abs/path" or "/abs/path" and returns the socket path; it is
// endpoint.Parse, which the configuration checks endpoints with.
func ParseEndpoint(ep string) (string, error) { return endpoint.Parse(ep) }

// NewBackend creates the connection to the runtime at endpoint and starts connecting in the
// background: it does not wait for the runtime to be there. name ("runtime", "image") appears
// in errors, logs and metrics. The watcher goroutine ends when ctx ends; Close the backend after.
func NewBackend(ctx context.Context, name, endpoint string, opts ...BackendOption) (*Backend, error) {
	path, err := ParseEndpoint(endpoint)
	if err != nil {
		return nil, err
	}
	b := &Backend{name: name, endpoint: "unix://" + path, path: path, connectWait: 2 * time.Second}
	for _, o := range opts {
		o(b)
	}
	codec := newRawCodec()
	dialOpts := []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(b.dial),
		grpc.WithDefaultCallOptions(
			grpc.ForceCodecV2(codec),
			grpc.MaxCallRecvMsgSize(MaxMessageSize),
			grpc.MaxCallSendMsgSize(MaxMessageSize),
		),
		// Reconnect quickly after containerd restarts, but cap the backoff so a runtime that
		// comes back is found within 2s.
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 2 * time.Second},
			MinConnectTimeout: 5 * time.Second,
		}),
		// An idle channel would report "not ready" between calls; a node agent keeps its runtime
		// connection open.
		grpc.WithIdleTimeout(0),
	}
	for _, h := range b.statsHandlers {
		dialOpts = append(dialOpts, grpc.WithStatsHandler(h))
	}
	conn, err := grpc.NewClient("passthrough:///"+path, dialOpts...)
	if err != nil {
		return nil, fmt.Errorf("%s backend %s: %w", name, b.endpoint, err)
	}
	b.conn = conn
	conn.Connect()
	go b.watch(ctx)
	go b.watchSocket(ctx)
	return b, nil
}

// watchSocket makes the connection try again at once, whatever its backoff, when the runtime's
// socket file is created: a restarted containerd is used as soon as it listens, not up to a
// backoff period later. Without a watch (the directory is missing, inotify is exhausted) the
// backoff alone finds it, within 2s.
func (b *Backend) watchSocket(ctx context.Context) {
	logger := klog.FromContext(ctx).WithValues("backend", b.name, "endpoint", b.endpoint)
	w, err := fsnotify.NewWatcher()
	if err != nil {
		logger.V(2).Info("Not watching the backend's socket file; reconnecting by backoff alone", "err", err)
		return
	}
	defer w.Close()
	if err := w.Add(filepath.Dir(b.path)); err != nil {
		logger.V(2).Info("Not watching the backend's socket file; reconnecting by backoff alone", "err", err)
		return
	}
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-w.Events:
			if !ok {
				return
			}
			if ev.Name == b.path && ev.Has(fsnotify.Create) && !b.Ready() {
				logger.V(2).Info("Backend socket created; reconnecting now")
				b.conn.ResetConnectBackoff()
			}
		case err, ok := <-w.Errors:
			if !ok {
				return
			}
			logger.V(2).Info("Watching the backend's socket file", "err", err)
		}
	}
}

// target is the backend as the relay's target: a connection of its own per client connection.
// While the backend connection has failed, calls fail at once, naming the backend, as on that
// connection.
func (b *Backend) target() *relay.Target {
	return &relay.Target{
		Name:       fmt.Sprintf("%s backend %s", b.name, b.endpoint),
		MaxMessage: MaxMessageSize, // the answers Forward takes
		Dial: func(ctx context.Context) (net.Conn, error) {
			c, err := b.dial(ctx, "")
			if err != nil {
				return nil, fmt.Errorf("%s backend %s is unavailable: %w", b.name, b.endpoint, err)
			}
			return c, nil
		},
		Unavailable: func() error {
			if s := b.conn.GetState(); s == connectivity.TransientFailure || s == connectivity.Shutdown {
				return b.unavailable(s)
			}
			return nil
		},
	}
}

// Close closes the connection.
func (b *Backend) Close() error { return b.conn.Close() }

func (b *Backend) dial(ctx context.Context, _ string) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", b.path)
	if err != nil {
		msg := err.Error()
		b.lastDialErr.Store(&msg)
		return nil, err
	}
	b.lastDialErr.Store(nil)
	return c, nil
}

func (b *Backend) watch(ctx context.Context) {
	logger := klog.FromContext(ctx).WithValues("backend", b.name, "endpoint", b.endpoint)
	up, failureLogged := false, false
	if b.onState != nil {
		b.onState(false)
	}
	for {
		s := b.conn.GetState()
		if now := s == connectivity.Ready; now != up {
			up = now
			if up {
				logger.Info("Backend connected")
				failureLogged = false
			} else {
				logger.Info("Backend disconnected", "state", s.String())
			}
			if b.onState != nil {
				b.onState(up)
			}
		}
		// One line per outage, not one per retry: the runtime may stay away for long.
		if s == connectivity.TransientFailure && !failureLogged {
			failureLogged = true
			logger.Info("Backend unavailable, retrying with backoff; CRI calls fail with Unavailable meanwhile", "err", b.dialError())
		}
		if s == connectivity.Idle {
			// grpc drops to idle when the runtime goes away; reconnect in the background so
			// /readyz and the next call see the runtime as soon as it is back.
			b.conn.Connect()
		}
		if s == connectivity.Shutdown || !b.conn.WaitForStateChange(ctx, s) {
			return
		}
	}
}

func (b *Backend) dialError() string {
	if p := b.lastDialErr.Load(); p != nil {
		return *p
	}
	return ""
}

// Ready reports whether the backend is connected now.
func (b *Backend) Ready() bool { return b.conn.GetState() == connectivity.Ready }

// waitReady waits until the backend is connected or ctx ends.
func (b *Backend) waitReady(ctx context.Context) error {
	for {
		s := b.conn.GetState()
		if s == connectivity.Ready {
			return nil
		}
		if s == connectivity.Idle {
			b.conn.Connect()
		}
		if !b.conn.WaitForStateChange(ctx, s) {
			return b.unavailable(s)
		}
	}
}

// usable returns nil when a call can go to the backend now, and otherwise an Unavailable status
// naming the backend: at once when the last connection attempt failed, after at most
// connectWait when an attempt is under way.
func (b *Backend) usable(ctx context.Context) error {
	s := b.conn.GetState()
	switch s {
	case connectivity.Ready:
		return nil
	case connectivity.TransientFailure, connectivity.Shutdown:
		return b.unavailable(s)
	}
	wctx, cancel := context.WithTimeout(ctx, b.connectWait)
	defer cancel()
	if err := b.waitReady(wctx); err != nil {
		if ctx.Err() != nil {
			return status.FromContextError(ctx.Err()).Err()
		}
		return err
	}
	return nil
}

func (b *Backend) unavailable(s connectivity.State) error {
	if e := b.dialError(); e != "" {
		return status.Errorf(codes.Unavailable, "%s backend %s is unavailable: %s", b.name, b.endpoint, e)
	}
	return status.Errorf(codes.Unavailable, "%s backend %s is unavailable (connection %s)", b.name, b.endpoint, strings.ToLower(s.String()))
}

// transportError names the backend in an Unavailable error that the connection (not the runtime)
// produced, such as the runtime dying during a call.
func (b *Backend) transportError(err error) error {
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.Unavailable || b.Ready() {
		return err
	}
	return status.Errorf(codes.Unavailable, "%s backend %s: %s", b.name, b.endpoint, st.Message())
}
