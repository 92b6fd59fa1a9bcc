package imagepull_test

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podgate/podgate/cri/imagepull"
	"github.com/podgate/podgate/test/crifake"
	"github.com/podgate/podgate/test/testfs"
)

// serveContent serves containerd's content store of a pull in progress (test/crifake) on a unix
// socket until the test ends and returns the socket's path; listed is told of each poll.
func serveContent(t *testing.T, listed chan<- struct{}) string {
	t.Helper()
	path := filepath.Join(testfs.ShortDir(t), "containerd.sock")
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	store := crifake.NewContentStore()
	store.Listed = listed
	store.Register(s)
	served := make(chan struct{})
	go func() { defer close(served); _ = s.Serve(l) }()
	t.Cleanup(func() { s.Stop(); <-served })
	return path
}

// podEvent is one Event the feature told a pod.
type podEvent struct {
	pod                     imagepull.PodRef
	eventType, reason, note string
}

// eventLog is an EventSink that keeps every Event and tells waiters of each new one.
type eventLog struct {
	mu     sync.Mutex
	events []podEvent
	added  chan struct{} // closed and replaced on each Event
}

func newEventLog() *eventLog { return &eventLog{added: make(chan struct{})} }

func (l *eventLog) Eventf(pod imagepull.PodRef, eventType, reason, _, noteFormat string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events = append(l.events, podEvent{pod, eventType, reason, fmt.Sprintf(noteFormat, args...)})
	close(l.added)
	l.added = make(chan struct{})
}

// await waits for an Event of reason about the pod named name whose note has every one of parts.
func (l *eventLog) await(t *testing.T, name, reason string, parts ...string) {
	t.Helper()
	timeout := time.After(awaitTimeout)
	for {
		l.mu.Lock()
		added := l.added
		for _, e := range l.events {
			if e.pod.Name == name && e.reason == reason && containsAll(e.note, parts) {
				l.mu.Unlock()
				return
			}
		}
		l.mu.Unlock()
		select {
		case <-added:
		case <-timeout:
			t.Fatalf("no %s Event about %s with %q; Events: %+v", reason, name, parts, l.all())
		}
	}
}

func (l *eventLog) all() []podEvent {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]podEvent(nil), l.events...)
}

func containsAll(s string, parts []string) bool {
	for _, p := range parts {
		if !strings.Contains(s, p) {
			return false
		}
	}
	return true
}

// podSet is the node's pods as the API server shows them; delete tells OnDeleted.
type podSet struct {
	mu        sync.Mutex
	pods      map[types.UID]*corev1.Pod
	onDeleted []func(*corev1.Pod)
}

var _ imagepull.Pods = (*podSet)(nil)

func newPodSet(pods ...*corev1.Pod) *podSet {
	s := &podSet{pods: map[types.UID]*corev1.Pod{}}
	for _, p := range pods {
		s.pods[p.UID] = p
	}
	return s
}

func (s *podSet) Get(uid types.UID) (*corev1.Pod, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p, ok := s.pods[uid]
	return p, ok
}

func (s *podSet) OnDeleted(fn func(*corev1.Pod)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.onDeleted = append(s.onDeleted, fn)
}

func (s *podSet) delete(p *corev1.Pod) {
	s.mu.Lock()
	delete(s.pods, p.UID)
	fns := s.onDeleted
	s.mu.Unlock()
	for _, fn := range fns {
		fn(p)
	}
}

func testPod(name string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "pod-" + name, UID: types.UID("uid-" + name)}}
}

// heldBackend is the runtime's image service behind the feature: each pull waits until the
// test releases one.
type heldBackend struct {
	pulling chan string
	release chan struct{}
}

func (b *heldBackend) pull(ctx context.Context, req *runtimeapi.PullImageRequest) (*runtimeapi.PullImageResponse, error) {
	image := req.GetImage().GetImage()
	b.pulling <- image
	select {
	case <-b.release:
		return &runtimeapi.PullImageResponse{ImageRef: "sha256:" + image}, nil
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
}

// TestFeaturePullEvents: with a cap of one pull, a backend that holds the pulls and
// containerd's content store beside it, the pod whose pull runs gets progress Events with
// bytes from the content store, the pod that waits a queue Event naming the cap and its place,
// a pod asking for the same image a sharing Event naming the pod it shares with, and a pod
// deleted while queued a cancellation Event; no Event is told twice. The pulls view (what
// PodResources' PodPulls shows) says the same.
func TestFeaturePullEvents(t *testing.T) {
	ctx := t.Context()
	running, waiting, sharing, deleted := testPod("running"), testPod("waiting"), testPod("sharing"), testPod("deleted")
	pods, events, polled := newPodSet(running, waiting, sharing, deleted), newEventLog(), make(chan struct{}, 1)
	f, err := imagepull.NewFeature(ctx, imagepull.Limits{MaxParallel: 1}, imagepull.SandboxPriority{}, prometheus.NewRegistry(),
		imagepull.WithPods(pods), imagepull.WithEvents(events, time.Second, time.Second, time.Second),
		imagepull.WithProgress(serveContent(t, polled), "k8s.io"))
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	ran := make(chan struct{})
	go func() { defer close(ran); f.Run(runCtx) }()
	t.Cleanup(func() { stop(); <-ran; f.Close() })
	backend := &heldBackend{pulling: make(chan string, 10), release: make(chan struct{})}
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

	runningDone := pull(running, "example.com/app:v1")
	if got := <-backend.pulling; got != "example.com/app:v1" {
		t.Fatalf("backend pulls %s, want example.com/app:v1", got)
	}
	waitingDone := pull(waiting, "example.com/other:v1")
	events.await(t, waiting.Name, imagepull.ReasonPullQueued, `"example.com/other:v1"`, "imagePulls.maxParallel 1, 1 running", "place 1 of 1")
	sharingDone := pull(sharing, "example.com/other:v1")
	events.await(t, sharing.Name, imagepull.ReasonPullShared, "pod default/pod-waiting", "waiting in podgate's queue")
	deletedDone := pull(deleted, "example.com/third:v1")
	events.await(t, deleted.Name, imagepull.ReasonPullQueued, "place 2 of 2")
	pods.delete(deleted)
	if err := <-deletedDone; !errdefs.IsAborted(err) {
		t.Errorf("pull of the deleted pod: %v, want Aborted", err)
	}
	events.await(t, deleted.Name, imagepull.ReasonPullCancelled, `"example.com/third:v1"`, "never reached the runtime")
	// 1 MiB of the 4 MiB layer written, the 1 KiB config committed.
	events.await(t, running.Name, imagepull.ReasonPullProgress, `"example.com/app:v1"`, "1.0 MiB of 4.0 MiB (25%)")
	checkPulls(t, f)

	// The pull ends just after a poll of the content store, a second before the next: a poll
	// between the backend's answer and the caller's Event would forget the pull's bytes, and
	// the Event would not show them (a race of the feature's, outside what this test holds).
	<-polled
	<-polled
	for range 2 {
		backend.release <- struct{}{}
	}
	for _, errc := range []<-chan error{runningDone, waitingDone, sharingDone} {
		if err := <-errc; err != nil {
			t.Errorf("pull: %v", err)
		}
	}
	events.await(t, running.Name, imagepull.ReasonPullProgress, "Pulled image", "4.0 MiB of 4.0 MiB (100%)")
	told := map[podEvent]bool{}
	for _, e := range events.all() {
		if told[e] {
			t.Errorf("Event %s about %s told twice: %s", e.reason, e.pod.Name, e.note)
		}
		told[e] = true
	}
}

// checkPulls checks the pulls view: the running one with its bytes, the waiting one held by
// the node's cap, the sharing one naming the pod it shares with; one pod's pulls alone.
func checkPulls(t *testing.T, f *imagepull.Feature) {
	t.Helper()
	got := map[string]imagepull.PullView{}
	for _, p := range f.Pulls("", "") {
		got[p.Pod.Name] = p
	}
	if p := got["pod-running"]; p.Started.IsZero() || p.Progress.Done != 1<<20+1024 || p.Progress.Total != 4<<20+1024 {
		t.Errorf("running pull: %+v", p)
	}
	if p := got["pod-waiting"]; !p.Started.IsZero() || p.Position != 1 || p.Waiting != imagepull.WaitingNode || p.MaxParallel != 1 || p.InFlight != 1 {
		t.Errorf("waiting pull: %+v", p)
	}
	if p := got["pod-sharing"]; !p.Shared || p.SharedWith.String() != "default/pod-waiting" || p.Image != "example.com/other:v1" {
		t.Errorf("sharing pull: %+v", p)
	}
	if one := f.Pulls("default", "pod-waiting"); len(one) != 1 || one[0].Pod.Name != "pod-waiting" {
		t.Errorf("pulls of pod-waiting: %+v", one)
	}
}
