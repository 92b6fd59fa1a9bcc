package agent

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/klog/v2"

	"github.com/podgate/podgate/agent/kube"
	"github.com/podgate/podgate/cri/imagepull"
	"github.com/podgate/podgate/cri/imagepull/progress"
)

// newImagePulls makes the image pull governor and its PullImage hook, the progress tracker
// (unless imagePulls.containerdAddress is "") and the pull Events (with the Kubernetes API). The
// governor is always on: without caps it still shares concurrent pulls of one image and drops
// pulls whose pod is gone.
func (a *Agent) newImagePulls(ctx context.Context, p *proxy) error {
	cfg := a.cfg.ImagePulls
	view := &pullView{}
	opts := []imagepull.Option{imagepull.WithRegisterer(a.registry)}
	if a.events != nil {
		p.pullEvents = newPullEvents(view, a.events, cfg.WaitEventAfter.Duration, cfg.ProgressEventAfter.Duration, cfg.ProgressEventInterval.Duration)
		opts = append(opts, imagepull.WithObserver(p.pullEvents))
	}
	g := imagepull.New(cfg.Limits(), opts...)
	view.governor = g
	if sock := a.cfg.ContainerdSocket(); sock != "" {
		t, err := progress.New(sock, view.running, progress.WithNamespace(cfg.ContainerdNamespace), progress.WithRegisterer(a.registry))
		if err != nil {
			return err
		}
		view.progress = t
		klog.FromContext(ctx).Info("Image pull progress on: reading containerd's content store", "socket", sock, "namespace", cfg.ContainerdNamespace)
	} else {
		klog.FromContext(ctx).Info("Image pull progress off: imagePulls.containerdAddress is empty")
	}
	if a.pods != nil {
		a.pods.OnDeleted(func(pod *corev1.Pod) { g.PodDeleted(string(pod.UID)) })
	}
	p.pulls, p.pullView = g, view
	p.pullInterceptor = g.Interceptor(pullPriority(a.pods, cfg.SandboxPriority()))
	return nil
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
