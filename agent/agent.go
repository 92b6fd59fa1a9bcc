package agent

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"k8s.io/klog/v2"

	"github.com/podgate/podgate/cri"
)

// Agent is one running podgate.
type Agent struct {
	cfg      *Configuration
	registry *prometheus.Registry
	version  string
	// pods is the node's pods from the API server; nil without a kubeconfig.
	pods *PodLookup
}

// New creates an agent from a validated configuration. version is reported in metrics and logs.
func New(cfg *Configuration, version string) *Agent {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	buildInfo := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: "podgate", Name: "build_info", Help: "podgate's version; always 1.",
	}, []string{"version"})
	buildInfo.WithLabelValues(version).Set(1)
	reg.MustRegister(buildInfo)
	return &Agent{cfg: cfg, registry: reg, version: version}
}

// Run serves until ctx ends, then shuts down gracefully: it stops accepting CRI connections,
// ends open streams, lets unary calls finish within the grace period, and returns nil. It
// returns an error when start-up fails or a server fails while running.
func (a *Agent) Run(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)

	if err := os.MkdirAll(a.cfg.StateDir, 0o700); err != nil {
		return fmt.Errorf("stateDir: %w", err)
	}
	if err := a.startKube(ctx); err != nil {
		return err
	}
	nodeSysctls, err := a.cfg.Sysctls.NodeSysctls()
	if err != nil {
		return err
	}
	if _, err := applyNodeSysctls(logger, nodeSysctls); err != nil {
		return err
	}
	server, backends, err := a.buildProxy(ctx)
	if err != nil {
		return err
	}
	defer closeAll(backends)

	l, err := cri.Listen(a.cfg.CRISocket, cri.SocketOptions{Mode: 0o660, Group: a.cfg.CRISocketGroup})
	if err != nil {
		return fmt.Errorf("criSocket: %w", err)
	}
	if err := a.checkNotSelf(); err != nil {
		l.Close()
		return err
	}
	serveDone := make(chan struct{})
	go func() {
		defer close(serveDone)
		if err := server.Serve(l); err != nil {
			cancel(fmt.Errorf("serve CRI on %s: %w", a.cfg.CRISocket, err))
		}
	}()

	var httpServer *http.Server
	if a.cfg.MetricsEnabled() {
		httpServer, err = a.startHTTP(ctx, cancel, server)
		if err != nil {
			server.Shutdown(ctx)
			<-serveDone
			return err
		}
	}

	logger.Info("podgate serving CRI", "version", a.version, "socket", a.cfg.CRISocket,
		"runtimeEndpoint", a.cfg.RuntimeEndpoint, "imageEndpoint", a.cfg.ImageBackend(),
		"metricsAddress", *a.cfg.MetricsAddress)
	// Tell systemd podgate is ready only now that the socket accepts calls, so a kubelet
	// ordered After=podgate.service finds it.
	if ok, err := daemon.SdNotify(false, daemon.SdNotifyReady); err != nil {
		logger.Error(err, "Notify systemd")
	} else if ok {
		logger.V(2).Info("Notified systemd: ready")
	}

	<-ctx.Done()
	cause := context.Cause(ctx)
	if errors.Is(cause, context.Canceled) {
		cause = nil
	}
	logger.Info("Shutting down", "reason", context.Cause(ctx), "gracePeriod", a.cfg.ShutdownGracePeriod.String())
	_, _ = daemon.SdNotify(false, daemon.SdNotifyStopping) // best effort: systemd stops us anyway

	// The parent context is done: shutdown gets its own, bounded one.
	shutdownCtx, done := context.WithTimeoutCause(context.WithoutCancel(ctx), a.cfg.ShutdownGracePeriod.Duration,
		errors.New("shutdown grace period over"))
	defer done()
	server.Shutdown(shutdownCtx)
	<-serveDone
	if httpServer != nil {
		if err := httpServer.Shutdown(shutdownCtx); err != nil {
			logger.Error(err, "Stop metrics server")
		}
	}
	logger.Info("Stopped")
	return cause
}

// buildProxy connects the backends and creates the CRI server with podgate's interceptors.
func (a *Agent) buildProxy(ctx context.Context) (*cri.Server, []*cri.Backend, error) {
	metrics := cri.NewMetrics(a.registry)
	runtime, err := cri.NewBackend(ctx, "runtime", a.cfg.RuntimeEndpoint,
		cri.WithStateFunc(metrics.BackendState("runtime", a.cfg.RuntimeEndpoint)))
	if err != nil {
		return nil, nil, fmt.Errorf("runtimeEndpoint: %w", err)
	}
	backends := []*cri.Backend{runtime}
	image := runtime
	if a.cfg.ImageEndpoint != "" && a.cfg.ImageEndpoint != a.cfg.RuntimeEndpoint {
		image, err = cri.NewBackend(ctx, "image", a.cfg.ImageEndpoint,
			cri.WithStateFunc(metrics.BackendState("image", a.cfg.ImageEndpoint)))
		if err != nil {
			_ = runtime.Close()
			return nil, nil, fmt.Errorf("imageEndpoint: %w", err)
		}
		backends = append(backends, image)
	}
	server := cri.NewServer(runtime, image, cri.WithMetrics(metrics), cri.WithLogger(klog.FromContext(ctx)))
	sandboxLog{}.register(server)
	a.registerImagePulls(server)
	policy, err := a.cfg.Sysctls.SysctlPolicy()
	if err != nil {
		closeAll(backends)
		return nil, nil, err
	}
	newSysctlGuard(policy, a.cfg.Sysctls.Verify, server.RuntimeClient(), a.registry).register(server)
	return server, backends, nil
}

// checkNotSelf refuses a backend endpoint that is podgate's own socket under another name (a
// symlink, a bind mount): every call would be forwarded to podgate again, without end.
// Validate catches the same path spelled differently; only the files can tell the rest.
func (a *Agent) checkNotSelf() error {
	self, err := os.Stat(a.cfg.CRISocket)
	if err != nil {
		return fmt.Errorf("criSocket: %w", err)
	}
	for _, ep := range []struct{ name, value string }{{"runtimeEndpoint", a.cfg.RuntimeEndpoint}, {"imageEndpoint", a.cfg.ImageEndpoint}} {
		p, err := cri.ParseEndpoint(ep.value)
		if err != nil {
			continue // empty imageEndpoint; Validate refused anything else
		}
		if fi, err := os.Stat(p); err == nil && os.SameFile(fi, self) {
			return fmt.Errorf("%s: %q is podgate's own criSocket: podgate would forward to itself", ep.name, ep.value)
		}
	}
	return nil
}

func closeAll(backends []*cri.Backend) {
	for _, b := range backends {
		_ = b.Close() // closing a client connection has nothing to report
	}
}

// probeTimeout bounds /readyz's call to the runtime: a probe must answer before the prober's
// own timeout (kubelet and systemd probes use about 1-5s).
const probeTimeout = 2 * time.Second
