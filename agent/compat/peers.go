package compat

import (
	"context"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/util/wait"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/klog/v2"
)

// Peers says which kubelet and runtime podgate runs beside: a log line each, an error line
// outside the tested range, and podgate_peer_version_info.
type Peers struct {
	info *prometheus.GaugeVec
}

// NewPeers registers podgate_peer_version_info with reg.
func NewPeers(reg prometheus.Registerer) *Peers {
	info := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: "podgate", Name: "peer_version_info",
		Help: "The kubelet's and the runtime's versions as podgate sees them (component: kubelet, runtime); tested is false outside the releases podgate is tested with. Always 1.",
	}, []string{"component", "name", "version", "tested"})
	reg.MustRegister(info)
	return &Peers{info: info}
}

// See logs a peer's version against the tested range — an error line outside it, for the
// operator to see, though podgate runs on — and sets the metric.
func (p *Peers) See(ctx context.Context, component, name string, v Verdict) {
	logger := klog.FromContext(ctx)
	p.info.WithLabelValues(component, name, v.Version, strconv.FormatBool(v.Tested)).Set(1)
	if v.Tested {
		logger.Info("Peer version", "component", component, "name", name, "version", v.Version, "tested", true)
		return
	}
	logger.Error(nil, "Peer version outside podgate's tested range: podgate runs, untested", "component", component, "name", name, "version", v.Version, "tested", false, "why", v.Why)
}

// runtimeVersionTimeout bounds one Version call: the smallest CRI call there is.
const runtimeVersionTimeout = 10 * time.Second

// ReadRuntime asks the runtime its version once, retried with backoff while it does not answer,
// and sees it (See) until ctx ends.
func (p *Peers) ReadRuntime(ctx context.Context, rt runtimeapi.RuntimeServiceClient, backoff wait.Backoff) {
	_ = wait.ExponentialBackoffWithContext(ctx, backoff, func(ctx context.Context) (bool, error) {
		cctx, cancel := context.WithTimeout(ctx, runtimeVersionTimeout)
		defer cancel()
		v, err := rt.Version(cctx, &runtimeapi.VersionRequest{})
		if err != nil {
			klog.FromContext(ctx).V(1).Info("Runtime version not read yet", "err", err)
			return false, nil
		}
		p.See(ctx, "runtime", v.RuntimeName, Runtime(v.RuntimeName, v.RuntimeVersion))
		return true, nil
	})
}
