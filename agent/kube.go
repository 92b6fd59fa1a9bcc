package agent

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"

	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/podgate/podgate/agent/kube"
)

// newKube creates the lookup of the node's pods when the Kubernetes API is configured (a
// kubeconfig, or WithKubernetesAPI); without it, it says once what is off and returns nil.
// runKube runs it. Start-up does not wait for its sync, so that podgate serves CRI while the
// API server is unreachable.
func (a *Agent) newKube(ctx context.Context) (*kube.PodLookup, error) {
	logger := klog.FromContext(ctx)
	if a.cfg.Kubeconfig == "" && a.api == nil {
		logger.Info("Kubernetes API access off: no kubeconfig; image pulls are not cancelled when their pod is deleted, and pull priority comes from the sandbox config",
			"priorityLabel", a.cfg.ImagePulls.PriorityLabel, "priorityNamespaces", a.cfg.ImagePulls.PriorityNamespaces)
		return nil, nil
	}
	node := a.cfg.NodeName
	if node == "" {
		h, err := os.Hostname()
		if err != nil {
			return nil, fmt.Errorf("nodeName: unset and no host name: %w", err)
		}
		node = strings.ToLower(h) // as the kubelet names its node
	}
	api := a.api
	if api == nil {
		var err error
		if api, err = kube.NewClient(a.cfg.Kubeconfig, kube.WithRateLimit(*a.cfg.KubeAPIQPS, int(*a.cfg.KubeAPIBurst))); err != nil {
			return nil, err
		}
	}
	pods, err := kube.NewPodLookup(api, node, kube.WithMetrics(a.registry), kube.WithKubeletPodsAPI(*a.cfg.KubeletPodsAPISocket))
	if err != nil {
		return nil, err
	}
	logger.Info("Kubernetes API access on", "kubeconfig", a.cfg.Kubeconfig, "node", node)
	return pods, nil
}

// runKube runs the pod lookup until ctx ends, with a line in the log once it synced.
func runKube(ctx context.Context, pods *kube.PodLookup) {
	var wg sync.WaitGroup
	wg.Go(func() { pods.Run(ctx) })
	if cache.WaitForCacheSync(ctx.Done(), pods.HasSynced) {
		klog.FromContext(ctx).Info("Pod informer synced", "node", pods.NodeName())
	}
	wg.Wait()
}
