package agent

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/klog/v2"

	"github.com/podgate/podgate/agent/config"
	"github.com/podgate/podgate/cri"
	"github.com/podgate/podgate/cri/relay"
	"github.com/podgate/podgate/sysctl"
)

// criServiceName names the CRI server in the list of services.
const criServiceName = "CRI"

// service is one of the servers podgate runs (CRI; metrics and health; later PodResources).
// Its listener is open once it is made; serve blocks until shutdown and returns nil then;
// shutdown stops it within ctx. Run starts and stops every service the same way.
type service struct {
	name     string
	serve    func() error
	shutdown func(ctx context.Context) error
	// close releases the listener of a service that never served.
	close func()
}

// runnable runs the service: serve until shutdown, which stops it.
func (s service) runnable() runnable {
	return runnable{
		name: s.name,
		run: func(context.Context) error {
			if err := s.serve(); err != nil {
				return fmt.Errorf("serve %s: %w", s.name, err)
			}
			return nil
		},
		stop: s.shutdown,
	}
}

// openServices opens every service's listener, in an order that keeps a podgate that cannot
// run from changing the node: the CRI socket first (a second podgate stops there), then the
// node's sysctls, then the other listeners. Run shuts the services down in the same order, so
// the CRI socket stops taking calls first. On error, what was opened is closed.
func (a *Agent) openServices(ctx context.Context, p *proxy) (services []service, err error) {
	defer func() {
		if err != nil {
			for _, s := range services {
				s.close()
			}
		}
	}()
	c, err := a.openCRI(p.server)
	if err != nil {
		return nil, err
	}
	services = append(services, c)
	nodeSysctls, err := sysctl.ParseNode(a.cfg.Sysctls.Node, sysctl.ProcSys)
	if err != nil {
		return services, err
	}
	if _, err := sysctl.ApplyNode(klog.FromContext(ctx), nodeSysctls); err != nil {
		return services, err
	}
	if p.podResources != nil {
		pr, err := a.openPodResources(ctx, p.podResources)
		if err != nil {
			return services, err
		}
		services = append(services, pr)
	}
	if a.cfg.MetricsEnabled() {
		h, err := a.openHTTP(ctx, p.server)
		if err != nil {
			return services, err
		}
		services = append(services, h)
	}
	return services, nil
}

// openCRI takes the CRI socket.
func (a *Agent) openCRI(server *cri.Server) (service, error) {
	l, err := cri.Listen(a.cfg.CRISocket, cri.SocketOptions{Mode: 0o660, Group: a.cfg.CRISocketGroup})
	if err != nil {
		return service{}, fmt.Errorf("criSocket: %w", err)
	}
	if err := a.checkNotSelf(); err != nil {
		l.Close()
		return service{}, err
	}
	return service{
		name:  criServiceName,
		serve: func() error { return server.Serve(l) },
		shutdown: func(ctx context.Context) error {
			server.Shutdown(ctx)
			return nil
		},
		close: func() { l.Close() },
	}, nil
}

// criLimits is the criSocketLimits section as the CRI socket's relay takes it.
func criLimits(l config.CRISocketLimits) relay.Limits {
	return relay.Limits{
		ConnectionBytes:  l.ConnectionBytes,
		TotalBytes:       l.TotalBytes,
		MaxConnections:   l.MaxConnections,
		MaxHeaderList:    uint32(min(l.MaxHeaderListBytes, math.MaxUint32)),
		IdleTimeout:      l.IdleTimeout.Duration,
		KeepaliveTime:    l.KeepaliveTime.Duration,
		KeepaliveTimeout: l.KeepaliveTimeout.Duration,
		RequestTimeout:   l.RequestTimeout.Duration,
		WriteTimeout:     l.WriteTimeout.Duration,
		WindowTimeout:    l.WindowTimeout.Duration,
	}
}

// openHTTP opens the metrics address for /metrics, /healthz and /readyz.
func (a *Agent) openHTTP(ctx context.Context, server *cri.Server) (service, error) {
	addr := *a.cfg.MetricsAddress
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return service{}, fmt.Errorf("metricsAddress: %w", err)
	}
	hs := &http.Server{
		Handler:           a.httpHandler(server),
		ReadHeaderTimeout: 5 * time.Second,
		BaseContext:       func(net.Listener) context.Context { return ctx },
	}
	klog.FromContext(ctx).V(1).Info("Serving metrics and health", "address", l.Addr().String(), "profiling", a.cfg.EnableProfilingHandler)
	return service{
		name: "metrics",
		serve: func() error {
			if err := hs.Serve(l); !errors.Is(err, http.ErrServerClosed) {
				return fmt.Errorf("%s: %w", addr, err)
			}
			return nil
		},
		shutdown: hs.Shutdown,
		close:    func() { l.Close() },
	}, nil
}

// httpHandler serves /metrics, /healthz, /readyz and, with enableProfilingHandler, Go's
// profiles under /debug/pprof/.
func (a *Agent) httpHandler(server *cri.Server) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(a.registry, promhttp.HandlerOpts{Registry: a.registry}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("ok\n")) // a client gone away is not our error
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		pctx, done := context.WithTimeout(r.Context(), probeTimeout)
		defer done()
		if err := server.Probe(pctx); err != nil {
			http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	if a.cfg.EnableProfilingHandler {
		// The index serves the named profiles (heap, goroutine, allocs, …) under it; the other
		// four are their own handlers, as in net/http/pprof's init.
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	return mux
}
