package agent

import (
	"context"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/util/wait"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/klog/v2"

	"github.com/podgate/podgate/agent/compat"
)

// newPeerVersions is the metric that says which kubelet and runtime podgate sees, and whether
// their releases are in the range podgate is tested with.
func newPeerVersions() *prometheus.GaugeVec {
	return prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: "podgate", Name: "peer_version_info",
		Help: "The kubelet's and the runtime's versions as podgate sees them (component: kubelet, runtime); tested is false outside the releases podgate is tested with. Always 1.",
	}, []string{"component", "name", "version", "tested"})
}

// seeVersion logs a peer's version against the tested range — an error line outside it, for
// the operator to see, though podgate runs on — and sets the metric.
func (a *Agent) seeVersion(ctx context.Context, component, name string, v compat.Verdict) {
	logger := klog.FromContext(ctx)
	a.peerVersions.WithLabelValues(component, name, v.Version, strconv.FormatBool(v.Tested)).Set(1)
	if v.Tested {
		logger.Info("Peer version", "component", component, "name", name, "version", v.Version, "tested", true)
		return
	}
	logger.Error(nil, "Peer version outside podgate's tested range: podgate runs, untested", "component", component, "name", name, "version", v.Version, "tested", false, "why", v.Why)
}

// runtimeVersionTimeout bounds one Version call: the smallest CRI call there is.
const runtimeVersionTimeout = 10 * time.Second

// readRuntimeVersion asks the runtime its version once, retried with a backoff while it does
// not answer, and logs it against the tested range.
func (a *Agent) readRuntimeVersion(ctx context.Context, rt runtimeapi.RuntimeServiceClient) {
	_ = wait.ExponentialBackoffWithContext(ctx, rebuildBackoff, func(ctx context.Context) (bool, error) {
		cctx, cancel := context.WithTimeout(ctx, runtimeVersionTimeout)
		defer cancel()
		v, err := rt.Version(cctx, &runtimeapi.VersionRequest{})
		if err != nil {
			klog.FromContext(ctx).V(1).Info("Runtime version not read yet", "err", err)
			return false, nil
		}
		a.seeVersion(ctx, "runtime", v.RuntimeName, compat.Runtime(v.RuntimeName, v.RuntimeVersion))
		return true, nil
	})
}
