package manager

// Beside the kubelet: who prepares a pod's claims (dra.prepare), and the kubelet's version.

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/version"
	"k8s.io/klog/v2"

	"github.com/podgate/podgate/cri/registry"
)

// preparer decides who prepares the pod's claims, by dra.prepare: podgate (always), the
// kubelet (never), or with auto the kubelet when it prepares claims (its version) and manages
// this pod (its PodResources socket knows it): it then called RunPodSandbox after preparing
// them. A kubelet that does not answer, does not know the pod, or whose version is not known
// leaves it to podgate: a repeated prepare is harmless, a missing device is not.
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
	if v := d.kubeletVersionNow(ctx); v == nil || v.LessThan(kubeletPreparesFrom) {
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

// kubeletVersionNow is the kubelet's version for a decision now: the one read at start-up or,
// while that read has not succeeded (podgate started before the kubelet registered its Node,
// and retries with a backoff of up to 30 s), the Node read now, by one GET at most every
// nodeReadInterval, which the sandboxes asking meanwhile wait for. Without it, the claims of
// the pods the kubelet starts right after it registered would be prepared twice.
func (d *Manager) kubeletVersionNow(ctx context.Context) *version.Version {
	if v := d.kubeletVersion.Load(); v != nil {
		return v
	}
	d.nodeMu.Lock()
	defer d.nodeMu.Unlock()
	if v := d.kubeletVersion.Load(); v != nil || (!d.nodeReadAt.IsZero() && d.now().Sub(d.nodeReadAt) < nodeReadInterval) {
		return v
	}
	d.nodeReadAt = d.now()
	node, err := d.pods.Node(ctx)
	if err != nil {
		klog.FromContext(ctx).V(1).Info("Node not read: podgate prepares the pod's claims itself", "err", err)
		return nil
	}
	d.SetKubeletVersion(ctx, node)
	return d.kubeletVersion.Load()
}

// SetKubeletVersion takes the kubelet's version from its Node object (status.nodeInfo), read
// at start-up, for dra.prepare auto.
func (d *Manager) SetKubeletVersion(ctx context.Context, node *corev1.Node) {
	if node == nil {
		return
	}
	raw := node.Status.NodeInfo.KubeletVersion
	v, err := version.ParseGeneric(raw)
	if err != nil {
		klog.FromContext(ctx).Info("Kubelet version of the Node not understood: podgate prepares pods' claims itself", "kubeletVersion", raw, "err", err)
		return
	}
	d.kubeletVersion.Store(v)
	klog.FromContext(ctx).Info("DRA prepare", "mode", d.mode, "kubeletVersion", raw, "kubeletPrepares", !v.LessThan(kubeletPreparesFrom))
}
