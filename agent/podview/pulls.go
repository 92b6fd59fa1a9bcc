package podview

import (
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/podgate/podgate/cri/imagepull"
	"github.com/podgate/podgate/podresources"
	pb "github.com/podgate/podgate/podresources/api/v1alpha1"
)

// Pulls shows the pull governor's pulls to the PodResources extension's PodPulls, as each pod's
// image_pulls shows them (Source).
type Pulls struct {
	Feature *imagepull.Feature
}

var _ podresources.PullLister = Pulls{}

// Pulls implements podresources.PullLister: the pulls of the pod namespace/name, every
// caller's when namespace is "", oldest first.
func (p Pulls) Pulls(namespace, name string) []*pb.ImagePull {
	return pullMessages(p.Feature.Pulls(namespace, name))
}

// pullMessages are pulls as the extension shows them; nil for none.
func pullMessages(pulls []imagepull.PullView) []*pb.ImagePull {
	var out []*pb.ImagePull
	for _, p := range pulls {
		out = append(out, pullMessage(p))
	}
	return out
}

// pullMessage is a pull as the extension shows it.
func pullMessage(p imagepull.PullView) *pb.ImagePull {
	m := &pb.ImagePull{
		Image: p.Image, Kind: p.Kind.String(), State: pb.ImagePull_QUEUED, Since: timestamppb.New(p.Since),
		PodNamespace: p.Pod.Namespace, PodName: p.Pod.Name, PodUid: p.PodUID,
		Registry: p.Registry, Priority: p.Priority.String(),
		Position: uint32(p.Position), WaitingFor: string(p.Waiting),
		Queued: uint32(p.Queued), InFlight: uint32(p.InFlight), RegistryInFlight: uint32(p.RegistryInFlight),
		MaxParallel: uint32(p.MaxParallel), RegistryCap: uint32(p.RegistryCap),
		BytesDone: uint64(max(p.Progress.Done, 0)), BytesTotal: uint64(max(p.Progress.Total, 0)), BytesPerSecond: p.Progress.Rate,
	}
	if !p.Started.IsZero() {
		m.State, m.Started = pb.ImagePull_PULLING, timestamppb.New(p.Started)
	}
	if p.Stall.On() {
		m.StallMinBytesPerSecond, m.StallWindow = uint64(p.Stall.MinBytesPerSecond), durationpb.New(p.Stall.Window)
		if s := p.Progress.Stall; s.Stalling() {
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
