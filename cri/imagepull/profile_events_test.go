package imagepull_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podgate/podgate/cri/imagepull"
)

// TestFeatureProfilePulls: a security profile's pull shows as such wherever podgate shows
// pulls: its pods' Events say "security profile", the pulls view (podgate pulls, PodPulls)
// gives its kind, and the metrics count it under kind="security_profile", apart from images.
// With a cap of one, an image pull runs while a profile pull waits, shared by a second pod;
// then the profile pull runs past the progress threshold and ends.
func TestFeatureProfilePulls(t *testing.T) {
	ctx := t.Context()
	running, waiting, sharing := testPod("running"), testPod("waiting"), testPod("sharing")
	pods, events, reg := newPodSet(running, waiting, sharing), newEventLog(), prometheus.NewRegistry()
	f, err := imagepull.NewFeature(ctx, imagepull.Limits{MaxParallel: 1}, imagepull.SandboxPriority{}, reg,
		imagepull.WithPods(pods), imagepull.WithEvents(events, time.Second, time.Second, time.Second))
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	ran := make(chan struct{})
	go func() { defer close(ran); f.Run(runCtx) }()
	t.Cleanup(func() { stop(); <-ran; f.Close() })
	images := &heldBackend{pulling: make(chan string, 10), release: make(chan struct{})}
	profileStarted, profileRelease := make(chan struct{}, 10), make(chan struct{})
	answer := []byte{0x08, 0x00} // cached=false, as a runtime may spell it
	ref := profileRef("example.com", "strict")
	profile := func(pod *corev1.Pod) <-chan error {
		req := profileReq(ref, "", "", pod.Namespace, pod.Name)
		req.SandboxConfig.Metadata.Uid = string(pod.UID)
		b, err := req.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		errc := make(chan error, 1)
		go func() {
			got, err := f.ProfileInterceptor()(ctx, b, func(ctx context.Context) ([]byte, error) {
				profileStarted <- struct{}{}
				select {
				case <-profileRelease:
					return answer, nil
				case <-ctx.Done():
					return nil, context.Cause(ctx)
				}
			})
			if err == nil && string(got) != string(answer) {
				t.Errorf("%s got %x, want the runtime's %x", pod.Name, got, answer)
			}
			errc <- err
		}()
		return errc
	}

	imageDone := make(chan error, 1)
	go func() {
		_, err := f.Interceptor()(ctx, &runtimeapi.PullImageRequest{
			Image:         &runtimeapi.ImageSpec{Image: "example.com/app:v1"},
			SandboxConfig: &runtimeapi.PodSandboxConfig{Metadata: &runtimeapi.PodSandboxMetadata{Uid: string(running.UID), Namespace: running.Namespace, Name: running.Name}},
		}, images.pull)
		imageDone <- err
	}()
	<-images.pulling
	waitingDone := profile(waiting)
	events.await(t, waiting.Name, imagepull.ReasonPullQueued, `Pulling security profile "`+ref+`" waits in podgate's queue`, "imagePulls.maxParallel 1, 1 running")
	sharingDone := profile(sharing)
	events.await(t, sharing.Name, imagepull.ReasonPullShared, `Security profile "`+ref+`" is pulled once`, "pod default/pod-waiting")
	kinds := map[string]imagepull.Kind{}
	for _, p := range f.Pulls("", "") {
		kinds[p.Pod.Name] = p.Kind
		if p.Kind == imagepull.KindSecurityProfile && (!p.Started.IsZero() || p.Stall.On()) {
			t.Errorf("the waiting profile pull: %+v", p)
		}
	}
	want := map[string]imagepull.Kind{"pod-running": imagepull.KindImage, "pod-waiting": imagepull.KindSecurityProfile, "pod-sharing": imagepull.KindSecurityProfile}
	for pod, kind := range want {
		if got, ok := kinds[pod]; !ok || got != kind {
			t.Errorf("pulls view: %s's pull of kind %v, want %v (all: %v)", pod, got, kind, kinds)
		}
	}
	if pulls := f.PodPulls(string(waiting.UID)); len(pulls) != 1 || pulls[0].Kind != imagepull.KindSecurityProfile {
		t.Errorf("PodPulls of the waiting pod: %+v", pulls)
	}

	images.release <- struct{}{}
	if err := <-imageDone; err != nil {
		t.Fatal(err)
	}
	<-profileStarted
	events.await(t, waiting.Name, imagepull.ReasonPullProgress, `Pulling security profile "`+ref+`": `, "so far")
	close(profileRelease)
	for _, errc := range []<-chan error{waitingDone, sharingDone} {
		if err := <-errc; err != nil {
			t.Errorf("profile pull: %v", err)
		}
	}
	events.await(t, waiting.Name, imagepull.ReasonPullProgress, `Pulled security profile "`+ref+`" in `)
	for _, m := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"podgate_image_pull_duration_seconds", map[string]string{"kind": "security_profile", "result": "success"}, 1},
		{"podgate_image_pull_duration_seconds", map[string]string{"kind": "image", "result": "success"}, 1},
		{"podgate_image_pull_wait_seconds", map[string]string{"kind": "security_profile"}, 2},
		{"podgate_image_pull_deduplicated_total", map[string]string{"kind": "security_profile"}, 1},
		{"podgate_image_pull_deduplicated_total", map[string]string{"kind": "image"}, 0},
	} {
		if got := metricOf(t, reg, m.name, m.labels); got != m.want {
			t.Errorf("%s%v = %v, want %v", m.name, m.labels, got, m.want)
		}
	}
}

// metricOf is the counter name with labels in reg, or the sample count of the histogram.
func metricOf(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if want, ok := labels[l.GetName()]; ok && want != l.GetValue() {
					continue next
				}
			}
			if h := m.GetHistogram(); h != nil {
				return float64(h.GetSampleCount())
			}
			return m.GetCounter().GetValue()
		}
	}
	t.Fatalf("no series %s%v", name, labels)
	return 0
}
