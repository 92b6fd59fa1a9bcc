package podview

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"
	"k8s.io/klog/v2"

	"github.com/podgate/podgate/cri/imagepull"
	"github.com/podgate/podgate/cri/imagepull/progress"
	pb "github.com/podgate/podgate/podresources/api/v1alpha1"
)

// TestPullMessage: a pull of the pull governor's view is the extension's ImagePull: a queued
// one with its place and the cap holding it, a running one with its bytes and, under a stall
// rule, how long it has been below the minimum; a shared one names the pod it shares with;
// each its kind, an image's or a security profile's.
func TestPullMessage(t *testing.T) {
	since := time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC)
	started := since.Add(3 * time.Second)
	rule := progress.StallRule{MinBytesPerSecond: 1 << 20, Window: time.Minute}
	for _, tc := range []struct {
		name string
		pull imagepull.PullView
		want *pb.ImagePull
	}{{
		name: "queued behind the registry's cap",
		pull: imagepull.PullView{PullStatus: imagepull.PullStatus{
			Image: "example.com/app:v1", Registry: "example.com", Pod: klog.KRef("default", "web"), PodUID: "uid-web",
			Priority: imagepull.PriorityNodeCritical, Since: since, Position: 2, Waiting: imagepull.WaitingRegistry,
			Queued: 3, InFlight: 2, RegistryInFlight: 1, MaxParallel: 4, RegistryCap: 1,
		}},
		want: &pb.ImagePull{
			Image: "example.com/app:v1", Kind: "image", Registry: "example.com", PodNamespace: "default", PodName: "web", PodUid: "uid-web",
			Priority: "system-node-critical", State: pb.ImagePull_QUEUED, Since: timestamppb.New(since), Position: 2, WaitingFor: "registry",
			Queued: 3, InFlight: 2, RegistryInFlight: 1, MaxParallel: 4, RegistryCap: 1,
		},
	}, {
		name: "running, stalling, shared",
		pull: imagepull.PullView{
			PullStatus: imagepull.PullStatus{
				Image: "example.com/app:v1", Registry: "example.com", Pod: klog.KRef("default", "db"), PodUID: "uid-db",
				Since: since, Started: started, InFlight: 1, Shared: true, SharedWith: klog.KRef("default", "web"),
			},
			Progress: progress.Progress{Done: 3 << 20, Total: 8 << 20, Rate: 4096, Stall: progress.Stall{Rate: 2048, For: 20 * time.Second}},
			Stall:    rule,
		},
		want: &pb.ImagePull{
			Image: "example.com/app:v1", Kind: "image", Registry: "example.com", PodNamespace: "default", PodName: "db", PodUid: "uid-db",
			Priority: "normal", State: pb.ImagePull_PULLING, Since: timestamppb.New(since), Started: timestamppb.New(started), InFlight: 1,
			BytesDone: 3 << 20, BytesTotal: 8 << 20, BytesPerSecond: 4096,
			StallMinBytesPerSecond: 1 << 20, StallWindow: durationpb.New(time.Minute), StallingFor: durationpb.New(20 * time.Second), StallBytesPerSecond: 2048,
			SharedWith: "default/web",
		},
	}, {
		name: "held for its registry's cool-down",
		pull: imagepull.PullView{PullStatus: imagepull.PullStatus{
			Image: "docker.io/library/redis:7", Registry: "docker.io", Pod: klog.KRef("default", "cache"), PodUID: "uid-cache",
			Since: since, Position: 1, Waiting: imagepull.WaitingCoolDown, Queued: 1,
			CoolDownStatus: imagepull.CoolDownStatus{CoolingSince: since, PushBackCode: 429, NextTry: since.Add(8 * time.Second),
				PushBacks: 2, HeldUntil: since.Add(5 * time.Minute)},
		}},
		want: &pb.ImagePull{
			Image: "docker.io/library/redis:7", Kind: "image", Registry: "docker.io", PodNamespace: "default", PodName: "cache", PodUid: "uid-cache",
			Priority: "normal", State: pb.ImagePull_QUEUED, Since: timestamppb.New(since), Position: 1, WaitingFor: "cool-down", Queued: 1,
			CoolingSince: timestamppb.New(since), PushBackCode: 429, NextTry: timestamppb.New(since.Add(8 * time.Second)),
			PushBacks: 2, HeldUntil: timestamppb.New(since.Add(5 * time.Minute)),
		},
	}, {
		name: "held while another pull tries the registry",
		pull: imagepull.PullView{PullStatus: imagepull.PullStatus{
			Image: "docker.io/library/redis:7", Registry: "docker.io", Since: since, Waiting: imagepull.WaitingCoolDown,
			CoolDownStatus: imagepull.CoolDownStatus{CoolingSince: since, PushBackCode: 429, Probing: true, HeldUntil: since.Add(5 * time.Minute)},
		}},
		want: &pb.ImagePull{
			Image: "docker.io/library/redis:7", Kind: "image", Registry: "docker.io", Priority: "normal", State: pb.ImagePull_QUEUED, Since: timestamppb.New(since),
			WaitingFor: "cool-down", CoolingSince: timestamppb.New(since), PushBackCode: 429, Probing: true, HeldUntil: timestamppb.New(since.Add(5 * time.Minute)),
		},
	}, {
		name: "a security profile's, queued behind the node's cap",
		pull: imagepull.PullView{PullStatus: imagepull.PullStatus{
			Image: "example.com/seccomp@sha256:1234", Kind: imagepull.KindSecurityProfile, Registry: "example.com",
			Pod: klog.KRef("default", "web"), PodUID: "uid-web", Since: since, Position: 1, Waiting: imagepull.WaitingNode,
			Queued: 1, InFlight: 1, MaxParallel: 1,
		}},
		want: &pb.ImagePull{
			Image: "example.com/seccomp@sha256:1234", Kind: "security_profile", Registry: "example.com", PodNamespace: "default", PodName: "web",
			PodUid: "uid-web", Priority: "normal", State: pb.ImagePull_QUEUED, Since: timestamppb.New(since), Position: 1, WaitingFor: "node",
			Queued: 1, InFlight: 1, MaxParallel: 1,
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, pullMessage(tc.pull), protocmp.Transform()); diff != "" {
				t.Errorf("pullMessage (-want +got):\n%s", diff)
			}
		})
	}
	if got := pullMessages(nil); got != nil {
		t.Errorf("no pulls: %v, want nil", got)
	}
}
