package imagepull

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// testPriorityLabel is agent/config's DefaultPriorityLabel (which imports this package).
const testPriorityLabel = "podgate.dev/priority-class"

// podMap is the API server's pods, by UID, as agent/kube's PodLookup shows them.
type podMap map[types.UID]*corev1.Pod

var _ Pods = podMap(nil)

func (m podMap) Get(uid types.UID) (*corev1.Pod, bool) {
	p, ok := m[uid]
	return p, ok
}

func (m podMap) OnDeleted(func(*corev1.Pod)) {}

func TestPullPriority(t *testing.T) {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "pod-1", UID: "uid-1"},
		Spec:       corev1.PodSpec{NodeName: "node-a", PriorityClassName: "system-node-critical"},
	}
	prio := podPriority(podMap{pod.UID: pod}, SandboxPriority{Label: testPriorityLabel, Namespaces: []string{"kube-system"}})
	req := func(uid, ns string, labels map[string]string) *runtimeapi.PullImageRequest {
		return &runtimeapi.PullImageRequest{SandboxConfig: &runtimeapi.PodSandboxConfig{
			Metadata: &runtimeapi.PodSandboxMetadata{Uid: uid, Namespace: ns}, Labels: labels}}
	}
	tests := []struct {
		name string
		req  *runtimeapi.PullImageRequest
		want Priority
	}{
		{"from the API server", req("uid-1", "default", nil), PriorityNodeCritical},
		{"unknown pod: sandbox fallback", req("uid-x", "kube-system", map[string]string{testPriorityLabel: "system-cluster-critical"}), PriorityClusterCritical},
		{"unknown pod, no label", req("uid-x", "kube-system", nil), PriorityNormal},
	}
	for _, tt := range tests {
		if got := prio(t.Context(), tt.req); got != tt.want {
			t.Errorf("%s: priority %v, want %v", tt.name, got, tt.want)
		}
	}
}

// pollingPods is a DeletionPoller whose pods are all gone: each poll is recorded and tells the
// polled pods deleted.
type pollingPods struct {
	mu        sync.Mutex
	onDeleted []func(*corev1.Pod)
	polled    chan []types.UID
}

var _ DeletionPoller = (*pollingPods)(nil)

func (p *pollingPods) Get(types.UID) (*corev1.Pod, bool) { return nil, false }

func (p *pollingPods) OnDeleted(fn func(*corev1.Pod)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.onDeleted = append(p.onDeleted, fn)
}

func (p *pollingPods) PollDeleted(_ context.Context, uids []types.UID) {
	select {
	case p.polled <- uids:
	default: // the test reads the first poll only
	}
	p.mu.Lock()
	fns := p.onDeleted
	p.mu.Unlock()
	for _, uid := range uids {
		for _, fn := range fns {
			fn(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{UID: uid}})
		}
	}
}

// TestFeaturePollsQueuedPods: with a DeletionPoller as its pods, the feature asks it about the
// pods whose pulls wait in the queue, and only those (not the pod whose pull runs), and a
// deletion it tells makes the waiting pull leave as for any deleted pod.
func TestFeaturePollsQueuedPods(t *testing.T) {
	pods := &pollingPods{polled: make(chan []types.UID, 1)}
	if f, err := NewFeature(t.Context(), Limits{}, SandboxPriority{}, prometheus.NewRegistry(), WithPods(&pollingPods{})); err != nil {
		t.Fatal(err)
	} else if f.poller == nil || f.pollInterval != queuedPollInterval {
		t.Fatalf("a DeletionPoller given WithPods is not polled (interval %v)", f.pollInterval)
	}
	f, err := NewFeature(t.Context(), Limits{MaxParallel: 1}, SandboxPriority{}, prometheus.NewRegistry(), WithPods(pods), withPollInterval(time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	g := f.governor
	tr := trace(g)
	b := newFakeBackend()
	running := newPull(t, "example.com/running", PriorityNormal, withPod("default", "r", "uid-r"))
	resRunning := goDo(t.Context(), g, running, b.pull(running.Image))
	started := b.next(t)
	queued := newPull(t, "example.com/queued", PriorityNormal, withPod("default", "q", "uid-q"))
	resQueued := goDo(t.Context(), g, queued, b.pull(queued.Image))
	tr.await(t, "queued", queued.Image)

	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { f.Run(ctx); close(done) }()
	select {
	case uids := <-pods.polled:
		if !slices.Equal(uids, []types.UID{"uid-q"}) {
			t.Errorf("polled %v, want only the pod whose pull waits", uids)
		}
	case <-time.After(testTimeout):
		t.Fatal("the feature never asked about the pod whose pull waits")
	}
	if res := wait(t, resQueued); !errdefs.IsAborted(res.err) {
		t.Errorf("the waiting pull of a pod the poller tells deleted returned %v, want aborted", res.err)
	}
	cancel()
	<-done
	started.release <- nil
	wait(t, resRunning)
}
