package imagepull_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podgate/podgate/cri/imagepull"
)

// answeredBackend is the runtime's image service behind the feature: each pull waits for the
// test's answer, an error or nil for success.
type answeredBackend struct{ calls chan answeredCall }

type answeredCall struct {
	image  string
	answer chan error
}

func (b *answeredBackend) pull(ctx context.Context, req *runtimeapi.PullImageRequest) (*runtimeapi.PullImageResponse, error) {
	c := answeredCall{image: req.GetImage().GetImage(), answer: make(chan error, 1)}
	b.calls <- c
	select {
	case err := <-c.answer:
		if err != nil {
			return nil, err
		}
		return &runtimeapi.PullImageResponse{ImageRef: "sha256:" + c.image}, nil
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
}

func (b *answeredBackend) next(t *testing.T) answeredCall {
	t.Helper()
	select {
	case c := <-b.calls:
		return c
	case <-time.After(awaitTimeout):
		t.Fatal("no pull reached the runtime")
		return answeredCall{}
	}
}

// TestFeaturePullThrottled: a registry answers a pull 429; the pod whose pull met it and a pod
// whose pull of another image of the registry comes later both wait in podgate's queue, each
// told by a PullThrottled Event which registry pushed back, since when, the next try and until
// when podgate holds the pull; the pulls view (PodPulls, podgate pulls) shows the cool-down.
// When the cool-down ends the refused pull is tried again alone, and once it has pulled the
// other goes: both pods get their images within their first PullImage call.
func TestFeaturePullThrottled(t *testing.T) {
	ctx := t.Context()
	refused, later := testPod("refused"), testPod("later")
	events := newEventLog()
	// A first cool-down of 4 s (3.2 s at least): the pulls are looked at every second for
	// Events, and the refused pull must still wait at the first look.
	f, err := imagepull.NewFeature(ctx, imagepull.Limits{}, imagepull.SandboxPriority{}, prometheus.NewRegistry(),
		imagepull.WithPods(newPodSet(refused, later)), imagepull.WithEvents(events, time.Second, time.Second, time.Second),
		imagepull.WithRegistryCoolDown(imagepull.CoolDown{InitialDelay: 4 * time.Second, MaxDelay: time.Minute, RetryFor: 5 * time.Minute}))
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	ran := make(chan struct{})
	go func() { defer close(ran); f.Run(runCtx) }()
	t.Cleanup(func() { stop(); <-ran; f.Close() })
	backend := &answeredBackend{calls: make(chan answeredCall, 10)}
	pull := func(pod *corev1.Pod, image string) <-chan error {
		errc := make(chan error, 1)
		go func() {
			_, err := f.Interceptor()(ctx, &runtimeapi.PullImageRequest{
				Image:         &runtimeapi.ImageSpec{Image: image},
				SandboxConfig: &runtimeapi.PodSandboxConfig{Metadata: &runtimeapi.PodSandboxMetadata{Uid: string(pod.UID), Namespace: pod.Namespace, Name: pod.Name}},
			}, backend.pull)
			errc <- err
		}()
		return errc
	}

	const app, other = "registry.test/app:v1", "registry.test/other:v1"
	refusedDone := pull(refused, app)
	backend.next(t).answer <- status.Error(codes.Unknown, fmt.Sprintf(`failed to pull and unpack image %[1]q: failed to resolve reference %[1]q: unexpected status from HEAD request to https://registry.test/v2/app/manifests/v1: 429 Too Many Requests`, app))
	events.await(t, refused.Name, imagepull.ReasonPullThrottled, `"`+app+`"`, "registry registry.test pushed back (429 Too Many Requests), cooling down since",
		"next try at", "the registry refused this pull once", "podgate holds the pull until")
	laterDone := pull(later, other)
	events.await(t, later.Name, imagepull.ReasonPullThrottled, `"`+other+`"`, "registry registry.test pushed back (429 Too Many Requests)", "podgate holds the pull until")
	ps := f.Pulls("default", later.Name)
	if len(ps) != 1 || ps[0].Waiting != imagepull.WaitingCoolDown || ps[0].PushBackCode != 429 || ps[0].CoolingSince.IsZero() ||
		ps[0].HeldUntil.IsZero() || !ps[0].Started.IsZero() {
		t.Errorf("pulls of %s: %+v, want it queued for registry.test's cool-down", later.Name, ps)
	}

	retry := backend.next(t)
	if retry.image != app {
		t.Fatalf("the runtime pulls %s, want the refused pull's retry", retry.image)
	}
	retry.answer <- nil
	next := backend.next(t)
	if next.image != other {
		t.Fatalf("the runtime pulls %s, want %s", next.image, other)
	}
	next.answer <- nil
	for name, errc := range map[string]<-chan error{refused.Name: refusedDone, later.Name: laterDone} {
		select {
		case err := <-errc:
			if err != nil {
				t.Errorf("%s: %v", name, err)
			}
		case <-time.After(awaitTimeout):
			t.Fatalf("%s: no answer", name)
		}
	}
}
