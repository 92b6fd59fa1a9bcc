package imagepull

import (
	"context"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"
	"k8s.io/klog/v2"

	"github.com/podgate/podgate/cri/imagepull/progress"
	pb "github.com/podgate/podgate/podresources/api/v1alpha1"
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

// Pulls returns the pulls of the pod namespace/name, every caller's when namespace is "",
// oldest first, as PodResources' extension shows them (its PullLister).
func (f *Feature) Pulls(namespace, name string) []*pb.ImagePull {
	var out []*pb.ImagePull
	for _, p := range f.view.pulls() {
		if namespace != "" && (p.Pod.Namespace != namespace || p.Pod.Name != name) {
			continue
		}
		out = append(out, pullMessage(p))
	}
	return out
}

// PodPulls returns the pulls of the pod with this UID, oldest first, as PodResources shows
// them in the pod's image_pulls.
func (f *Feature) PodPulls(uid string) []*pb.ImagePull {
	var out []*pb.ImagePull
	for _, s := range f.governor.PodPulls(uid) {
		out = append(out, pullMessage(f.view.withProgress(s)))
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
	p := pull{PullStatus: s, stall: v.stall}
	if v.progress != nil && !s.Started.IsZero() {
		p.progress, _ = v.progress.Progress(s.Image)
	}
	return p
}

// Running implements progress.Pulls: the backend pulls running.
func (v *view) Running() []progress.Running {
	rs := v.governor.Running()
	out := make([]progress.Running, 0, len(rs))
	for _, r := range rs {
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

// pullMessage is a pull as the extension shows it.
func pullMessage(p pull) *pb.ImagePull {
	m := &pb.ImagePull{
		Image: p.Image, State: pb.ImagePull_QUEUED, Since: timestamppb.New(p.Since),
		PodNamespace: p.Pod.Namespace, PodName: p.Pod.Name, PodUid: p.PodUID,
		Registry: p.Registry, Priority: p.Priority.String(),
		Position: uint32(p.Position), WaitingFor: string(p.Waiting),
		Queued: uint32(p.Queued), InFlight: uint32(p.InFlight), RegistryInFlight: uint32(p.RegistryInFlight),
		MaxParallel: uint32(p.MaxParallel), RegistryCap: uint32(p.RegistryCap),
		BytesDone: uint64(max(p.progress.Done, 0)), BytesTotal: uint64(max(p.progress.Total, 0)), BytesPerSecond: p.progress.Rate,
	}
	if !p.Started.IsZero() {
		m.State, m.Started = pb.ImagePull_PULLING, timestamppb.New(p.Started)
	}
	if p.stall.On() {
		m.StallMinBytesPerSecond, m.StallWindow = uint64(p.stall.MinBytesPerSecond), durationpb.New(p.stall.Window)
		if s := p.progress.Stall; s.Stalling() {
			m.StallingFor, m.StallBytesPerSecond = durationpb.New(s.For), s.Rate
		}
	}
	if p.Shared {
		m.SharedWith = p.SharedWith.String()
	}
	m.PushBackCode, m.Probing, m.PushBacks = uint32(p.PushBackCode), p.Probing, uint32(p.PushBacks)
	m.CoolingSince, m.NextTry, m.HeldUntil = timestampOrNil(p.CoolingSince), timestampOrNil(p.NextTry), timestampOrNil(p.HeldUntil)
	return m
}

// timestampOrNil is t, unset when zero.
func timestampOrNil(t time.Time) *timestamppb.Timestamp {
	if t.IsZero() {
		return nil
	}
	return timestamppb.New(t)
}

// waited is how long the caller has waited, up to now or to the start of its pull.
func (p pull) waited(now time.Time) time.Duration {
	if !p.Started.IsZero() {
		return max(0, p.Started.Sub(p.Since))
	}
	return now.Sub(p.Since)
}
