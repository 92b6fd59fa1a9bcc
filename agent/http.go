package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/klog/v2"

	"github.com/podgate/podgate/cri"
)

// startHTTP serves /metrics, /healthz and /readyz on the metrics address. A failure of the
// server after start-up cancels the agent with the cause.
func (a *Agent) startHTTP(ctx context.Context, cancel context.CancelCauseFunc, server *cri.Server) (*http.Server, error) {
	addr := *a.cfg.MetricsAddress
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metricsAddress: %w", err)
	}
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
	hs := &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 5 * time.Second,
		BaseContext:       func(net.Listener) context.Context { return ctx },
	}
	go func() {
		if err := hs.Serve(l); !errors.Is(err, http.ErrServerClosed) {
			cancel(fmt.Errorf("serve metrics on %s: %w", addr, err))
		}
	}()
	klog.FromContext(ctx).V(1).Info("Serving metrics and health", "address", l.Addr().String())
	return hs, nil
}
