package agent

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podgate/podgate/agent/kube"
	"github.com/podgate/podgate/cri"
	"github.com/podgate/podgate/cri/imagepull"
)

// newImagePulls makes the image pull governor and its PullImage hook. It is always on: without
// caps it still shares concurrent pulls of one image and drops pulls whose pod is gone.
func (a *Agent) newImagePulls() (*imagepull.Governor, cri.Interceptor[*runtimeapi.PullImageRequest, *runtimeapi.PullImageResponse]) {
	g := imagepull.New(a.cfg.ImagePulls.Limits(), imagepull.WithRegisterer(a.registry))
	if a.pods != nil {
		a.pods.OnDeleted(func(pod *corev1.Pod) { g.PodDeleted(string(pod.UID)) })
	}
	return g, g.Interceptor(pullPriority(a.pods, a.cfg.ImagePulls.SandboxPriority()))
}

// pullPriority takes a pull's priority from its pod in the API server when podgate knows the
// pod, and from the sandbox config otherwise.
func pullPriority(pods *kube.PodLookup, fallback imagepull.SandboxPriority) imagepull.Prioritizer {
	return func(_ context.Context, req *runtimeapi.PullImageRequest) imagepull.Priority {
		uid := req.GetSandboxConfig().GetMetadata().GetUid()
		if pods != nil && uid != "" {
			if pod, ok := pods.Get(types.UID(uid)); ok {
				return imagepull.PriorityOf(pod.Spec.PriorityClassName, pod.Spec.Priority)
			}
		}
		return fallback.Of(req.GetSandboxConfig())
	}
}
