package resources

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/klog/v2"
	kubeletconfig "k8s.io/kubelet/config/v1beta1"

	"github.com/podgate/podgate/podresources/cgroup"
)

// applyMemoryQoS adds the container's memory QoS to res.Unified as the kubelet 1.36 computes
// it (cgroup.MemoryQoS), from the container's request and limit and the pod's QoS class in the
// pod, and the node's allocatable memory for a container without a limit.
func (s *Hooks) applyMemoryQoS(ctx context.Context, uid types.UID, container string, res *runtimeapi.LinuxContainerResources) error {
	pod, ok := s.pods.Get(uid)
	if !ok {
		klog.FromContext(ctx).V(2).Info("Memory QoS skipped: the pod is not in the informer yet", "podUID", uid, "container", container)
		return nil
	}
	c, ok := podContainer(pod, container)
	if !ok {
		klog.FromContext(ctx).V(2).Info("Memory QoS skipped: no such container in the pod", "pod", klog.KObj(pod), "container", container)
		return nil
	}
	v, err := cgroup.MemoryQoS(cgroup.MemoryQoSInput{
		Request:         c.Resources.Requests.Memory().Value(),
		Limit:           c.Resources.Limits.Memory().Value(),
		QOSClass:        pod.Status.QOSClass,
		NodeAllocatable: s.allocatable.Load(),
		Factor:          s.factor,
		Policy:          s.policy,
		PageSize:        s.pageSize,
	})
	if err != nil {
		return fmt.Errorf("container %q memory QoS: %w", container, err)
	}
	if unified, changed := v.AddTo(res.GetUnified()); changed {
		res.Unified = unified
		s.qosApplied.Inc()
	}
	return nil
}

// podContainer is the pod's container by name (init containers too).
func podContainer(pod *corev1.Pod, name string) (*corev1.Container, bool) {
	for _, list := range [][]corev1.Container{pod.Spec.Containers, pod.Spec.InitContainers} {
		for i := range list {
			if list[i].Name == name {
				return &list[i], true
			}
		}
	}
	return nil, false
}

// ResolveAllocatable finds the node's allocatable memory, memory QoS's ceiling for a
// container without a limit, from the best source at hand (the kubelet's configuration, read
// once at start-up, when given, else the Node object when given, else MemTotal) and says which
// it used. It may be called again when a better source arrives (the Node, read later).
func (s *Hooks) ResolveAllocatable(ctx context.Context, kubeletConfig *kubeletconfig.KubeletConfiguration, node *corev1.Node) {
	logger := klog.FromContext(ctx)
	src := cgroup.NodeMemorySources{KubeletConfig: kubeletConfig}
	if src.KubeletConfig == nil {
		src.Node = node
	}
	mt, err := cgroup.ReadMemTotal(cgroup.MeminfoPath)
	if err != nil {
		logger.Info("Node allocatable memory: MemTotal could not be read", "err", err)
	}
	src.MemTotal = mt
	nm := cgroup.NodeAllocatable(src)
	s.allocatable.Store(nm.Bytes)
	logger.Info("Node allocatable memory", nm.KeysAndValues()...)
}
