package manager

// Beside the kubelet: who prepares a pod's claims (dra.prepare).

import (
	"context"

	"k8s.io/klog/v2"

	"github.com/podgate/podgate/cri/registry"
)

// preparer decides who prepares the pod's claims, by dra.prepare: podgate (always), the
// kubelet (never), or with auto the kubelet when it prepares claims (its version, as agent
// knows it: WithKubeletPrepares) and manages this pod (its PodResources socket knows it): it
// then called RunPodSandbox after preparing them. A kubelet that does not answer, does not know
// the pod, or whose version is not known leaves it to podgate: a repeated prepare is harmless,
// a missing device is not.
func (d *Manager) preparer(ctx context.Context, ref registry.PodRef) string {
	switch d.mode {
	case PrepareNever:
		return PreparedByKubelet
	case PrepareAlways:
		return PreparedByPodgate
	}
	kubelet := d.kubelet
	if kubelet == nil { // no podResources.kubeletSocket: nobody to ask
		return PreparedByPodgate
	}
	if d.kubeletPrepares == nil || !d.kubeletPrepares(ctx) {
		return PreparedByPodgate
	}
	known, err := kubelet.KubeletKnowsPod(ctx, ref.Namespace, ref.Name)
	switch {
	case kubelet.NotListening(err):
		// A kubelet that died and left its socket behind: decided at once, as with no socket
		// (podgate_podresources_kubelet_requests_total{result="not_listening"} counts it).
		klog.FromContext(ctx).V(1).Info("Nobody listens on the kubelet's PodResources socket: no kubelet, podgate prepares the pod's claims", "err", err)
		return PreparedByPodgate
	case err != nil:
		klog.FromContext(ctx).V(1).Info("The kubelet's PodResources did not say whether it manages the pod: podgate prepares its claims", "err", err)
		return PreparedByPodgate
	}
	if !known {
		return PreparedByPodgate
	}
	return PreparedByKubelet
}
