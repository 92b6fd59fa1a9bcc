package agent

import (
	"context"

	"github.com/podgate/podgate/agent/kube"
	"github.com/podgate/podgate/cri/imagepull"
	"github.com/podgate/podgate/podresources"
)

var _ podresources.PullLister = (*imagepull.Feature)(nil)

// newImagePulls wires the image-pull feature (cri/imagepull): the pod informer when podgate
// has the Kubernetes API, the pod Events when it can write them, containerd's content store
// unless imagePulls.containerdAddress is "".
func (a *Agent) newImagePulls(ctx context.Context, p *proxy) error {
	cfg := a.cfg.ImagePulls
	opts := []imagepull.FeatureOption{imagepull.WithProgress(a.cfg.ContainerdSocket(), cfg.ContainerdNamespace)}
	if a.pods != nil {
		opts = append(opts, imagepull.WithPods(a.pods))
	}
	if a.events != nil {
		opts = append(opts, imagepull.WithEvents(pullEventSink{a.events},
			cfg.WaitEventAfter.Duration, cfg.ProgressEventAfter.Duration, cfg.ProgressEventInterval.Duration))
	}
	f, err := imagepull.NewFeature(ctx, cfg.Limits(), cfg.SandboxPriority(), a.registry, opts...)
	if err != nil {
		return err
	}
	p.pulls = f
	return nil
}

// pullEventSink adapts the recorder to imagepull's EventSink.
type pullEventSink struct{ recorder *kube.EventRecorder }

var _ imagepull.EventSink = pullEventSink{}

// Eventf implements imagepull.EventSink.
func (s pullEventSink) Eventf(pod imagepull.PodRef, eventType, reason, action, noteFormat string, args ...any) {
	s.recorder.Eventf(kube.PodRef(pod), eventType, reason, action, noteFormat, args...)
}
