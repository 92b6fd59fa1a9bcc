package imagepull

import (
	"context"
	"time"

	"k8s.io/klog/v2"

	"github.com/podgate/podgate/cri/imagepull/progress"
)

// view shows the governor's pulls, with the bytes containerd has fetched for them, to the
// PodResources extension (PodPulls, and each pod's image_pulls) and to the pull Events, and
// the running pulls to the progress tracker (progress.Pulls).
type view struct {
	governor *Governor
	// progress is nil when pull progress is off (imagePulls.containerdAddress "").
	progress *progress.Tracker
	// stall is the stall rule the tracker applies; off when stalls are not found.
	stall progress.StallRule
}

var _ progress.Pulls = (*view)(nil)

// newView is the view of g's pulls with their progress in t (nil: progress off), measured
// against stall where t finds stalls.
func newView(g *Governor, t *progress.Tracker, stall progress.StallRule) *view {
	v := &view{governor: g, progress: t}
	if t != nil {
		v.stall = stall
	}
	return v
}

// pull is one caller's pull with its progress, and the stall rule it is measured against.
type pull struct {
	PullStatus
	progress progress.Progress
	stall    progress.StallRule
}

// PullView is one caller's pull as the pulls view shows it (PodResources' PodPulls and each
// pod's image_pulls, made of it by agent/podview): where it stands, the bytes containerd has
// fetched for it, and the stall rule it is measured against.
type PullView struct {
	PullStatus
	// Progress is the pull's bytes in containerd's content store; zero while it waits or with
	// pull progress off.
	Progress progress.Progress
	// Stall is the stall rule the pull is measured against; off when stalls are not found.
	Stall progress.StallRule
}

// Pulls returns the pulls of the pod namespace/name, every caller's when namespace is "",
// oldest first.
func (f *Feature) Pulls(namespace, name string) []PullView {
	var out []PullView
	for _, p := range f.view.pulls() {
		if namespace != "" && (p.Pod.Namespace != namespace || p.Pod.Name != name) {
			continue
		}
		out = append(out, p.export())
	}
	return out
}

// PodPulls returns the pulls of the pod with this UID, oldest first.
func (f *Feature) PodPulls(uid string) []PullView {
	var out []PullView
	for _, s := range f.governor.PodPulls(uid) {
		out = append(out, f.view.withProgress(s).export())
	}
	return out
}

// pulls is every caller's pull, oldest first.
func (v *view) pulls() []pull {
	statuses := v.governor.Pulls()
	out := make([]pull, 0, len(statuses))
	for _, s := range statuses {
		out = append(out, v.withProgress(s))
	}
	return out
}

func (v *view) withProgress(s PullStatus) pull {
	p := pull{PullStatus: s}
	if s.Kind != KindImage {
		return p // neither progress nor stalls (Running)
	}
	p.stall = v.stall
	if v.progress != nil && !s.Started.IsZero() {
		p.progress, _ = v.progress.Progress(s.Image)
	}
	return p
}

// Running implements progress.Pulls: the backend image pulls running. A security profile's
// pull is no image's: containerd's content store shows no layers of it, and it is never
// stalled (the kubelet bounds it by its runtimeRequestTimeout).
func (v *view) Running() []progress.Running {
	rs := v.governor.Running()
	out := make([]progress.Running, 0, len(rs))
	for _, r := range rs {
		if r.Kind != KindImage {
			continue
		}
		out = append(out, progress.Running{Image: r.Image, Registry: v.governor.RegistryLabel(r.Registry), Started: r.Started})
	}
	return out
}

// Stalled implements progress.Pulls: the governor cancels a stalled pull, what containerd
// fetched of it kept first, as it must outlive the cancelled pull's lease.
func (v *view) Stalled(ctx context.Context, r progress.Running, p progress.Progress) {
	if err := v.progress.Keep(ctx, r.Image, keepFetched); err != nil {
		klog.FromContext(ctx).Info("Cannot keep what containerd fetched of a stalled pull; the retry fetches it again", "image", r.Image, "err", err)
	}
	v.governor.Stall(r.Image, r.Started, p.Stall.Rate, v.stall)
}

// export is the pull as the pulls view shows it.
func (p pull) export() PullView {
	return PullView{PullStatus: p.PullStatus, Progress: p.progress, Stall: p.stall}
}

// waited is how long the caller has waited, up to now or to the start of its pull.
func (p pull) waited(now time.Time) time.Duration {
	if !p.Started.IsZero() {
		return max(0, p.Started.Sub(p.Since))
	}
	return now.Sub(p.Since)
}
