package agent

// What podgate learns from its node's Node object, which kubeletinfo.NodeReader reads.

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/podgate/podgate/agent/compat"
	"github.com/podgate/podgate/agent/kube"
	"github.com/podgate/podgate/agent/kubeletinfo"
	"github.com/podgate/podgate/podresources/resources"
)

var _ kubeletinfo.NodeSource = (*kube.PodLookup)(nil)

// learnNode is what podgate learns from its Node: the kubelet's version (logged against the
// tested range; memory QoS's and dra.prepare auto's decisions, DRA being on wherever the Node
// is read: both need the Kubernetes API), memory QoS's ceiling without the kubelet's
// configuration file.
func (a *Agent) learnNode(kubelet *kubeletinfo.View, res *resources.Hooks) func(context.Context, *corev1.Node) {
	return func(ctx context.Context, node *corev1.Node) {
		logger := klog.FromContext(ctx)
		version := node.Status.NodeInfo.KubeletVersion
		a.peers.See(ctx, "kubelet", "kubelet", compat.Kubelet.Check(version))
		kubelet.LearnVersion(logger, version, res.MemoryQoS())
		if res.MemoryQoS() && kubelet.Get().Config == nil { // no kubelet configuration read: the Node is better than MemTotal
			res.ResolveAllocatable(ctx, nil, node)
		}
		prepares, known, why := kubelet.Get().PreparesDRAClaims()
		logger.Info("DRA prepare", "mode", a.cfg.DRA.Prepare, "kubeletVersion", version, "kubeletPrepares", known && prepares, "reason", why)
	}
}
