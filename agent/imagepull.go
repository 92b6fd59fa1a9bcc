package agent

import (
	"context"

	"github.com/podgate/podgate/agent/config"
	"github.com/podgate/podgate/agent/kube"
	"github.com/podgate/podgate/cri/imagepull"
	"github.com/podgate/podgate/podresources"
)

var _ podresources.PullLister = (*imagepull.Feature)(nil)

// newImagePulls wires the image-pull feature (cri/imagepull): the pod informer when podgate
// has the Kubernetes API, the pod Events when it can write them, containerd's content store
// unless imagePulls.containerdAddress is "", and the kubelet's own cap when its configuration
// was read.
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
	opts = append(opts, imagepull.WithStall(cfg.Stall.Rule()))
	if n, known, _ := p.kubelet.Get().PullCap(); known { // the kubelet's own cap, from its configuration
		opts = append(opts, imagepull.WithKubeletCap(n))
	}
	f, err := imagepull.NewFeature(ctx, pullLimits(&cfg), sandboxPriority(&cfg), a.registry, opts...)
	if err != nil {
		return err
	}
	p.pulls = f
	return nil
}

// pullLimits returns the governor's caps, registry hosts normalised. The section is valid
// (Validate).
func pullLimits(p *config.ImagePulls) imagepull.Limits {
	var l imagepull.Limits
	if p.MaxParallel != nil {
		l.MaxParallel = int(*p.MaxParallel)
	}
	if len(p.PerRegistry) > 0 {
		l.PerRegistry = map[string]int{}
		for host, v := range p.PerRegistry {
			norm, _ := imagepull.RegistryHost(host) // validated
			l.PerRegistry[norm] = int(v)
		}
	}
	return l
}

// sandboxPriority is the pulls' priority fallback without the API.
func sandboxPriority(p *config.ImagePulls) imagepull.SandboxPriority {
	return imagepull.SandboxPriority{Label: p.PriorityLabel, Namespaces: p.PriorityNamespaces}
}

// pullEventSink adapts the recorder to imagepull's EventSink.
type pullEventSink struct{ recorder *kube.EventRecorder }

var _ imagepull.EventSink = pullEventSink{}

// Eventf implements imagepull.EventSink.
func (s pullEventSink) Eventf(pod imagepull.PodRef, eventType, reason, action, noteFormat string, args ...any) {
	s.recorder.Eventf(kube.PodRef(pod), eventType, reason, action, noteFormat, args...)
}
