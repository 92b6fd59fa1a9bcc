package agent

import (
	"context"

	"github.com/podgate/podgate/agent/config"
	"github.com/podgate/podgate/agent/kube"
	"github.com/podgate/podgate/agent/kubeletinfo"
	"github.com/podgate/podgate/cri/imagepull"
)

// newImagePulls builds the image-pull feature (cri/imagepull): with the node's pods when
// podgate has the Kubernetes API, the pod Events when it can write them (each nil otherwise),
// containerd's content store unless imagePulls.containerdAddress is "", and the kubelet's own
// cap when its configuration was read.
func (a *Agent) newImagePulls(ctx context.Context, pods *kube.PodLookup, events *kube.EventRecorder, kubelet *kubeletinfo.View) (*imagepull.Feature, error) {
	cfg := a.cfg.ImagePulls
	opts := []imagepull.FeatureOption{imagepull.WithProgress(a.cfg.ContainerdSocket(), cfg.ContainerdNamespace)}
	if pods != nil {
		opts = append(opts, imagepull.WithPods(pods))
	}
	if events != nil {
		opts = append(opts, imagepull.WithEvents(pullEventSink{events},
			cfg.WaitEventAfter.Duration, cfg.ProgressEventAfter.Duration, cfg.ProgressEventInterval.Duration))
	}
	opts = append(opts, imagepull.WithStall(cfg.Stall.Rule()), imagepull.WithRegistryCoolDown(coolDown(&cfg)))
	if n, known, _ := kubelet.Get().PullCap(); known { // the kubelet's own cap, from its configuration
		opts = append(opts, imagepull.WithKubeletCap(n))
	}
	return imagepull.NewFeature(ctx, pullLimits(&cfg), sandboxPriority(&cfg), a.registry, opts...)
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
	if len(p.PerRegistryRate) > 0 {
		l.PerRegistryRate = map[string]imagepull.Rate{}
		for host, r := range p.PerRegistryRate {
			norm, _ := imagepull.RegistryHost(host) // validated
			burst := int32(config.DefaultRegistryRateBurst)
			if r.Burst != nil {
				burst = *r.Burst
			}
			l.PerRegistryRate[norm] = imagepull.Rate{Pulls: int(r.Pulls), Interval: r.Interval.Duration, Burst: int(burst)}
		}
	}
	return l
}

// coolDown is how the governor treats a registry that pushes back.
func coolDown(p *config.ImagePulls) imagepull.CoolDown {
	initial, maxDelay, retryFor := p.CoolDown.Durations()
	return imagepull.CoolDown{InitialDelay: initial, MaxDelay: maxDelay, RetryFor: retryFor}
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
