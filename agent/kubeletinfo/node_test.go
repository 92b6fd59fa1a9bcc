package kubeletinfo

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2/ktesting"
)

// fakeNode is the API server's Node as NodeReader reads it: NotFound until registered, then
// the Node with the kubelet's version; reads counts the GETs.
type fakeNode struct {
	mu      sync.Mutex
	version string // "" not registered
	reads   int
}

var _ NodeSource = (*fakeNode)(nil)

func (f *fakeNode) Node(context.Context) (*corev1.Node, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reads++
	if f.version == "" {
		return nil, apierrors.NewNotFound(corev1.Resource("nodes"), "node-a")
	}
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}, Status: corev1.NodeStatus{NodeInfo: corev1.NodeSystemInfo{KubeletVersion: f.version}}}, nil
}

func (*fakeNode) NodeName() string { return "node-a" }

func (f *fakeNode) register(version string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.version = version
}

func (f *fakeNode) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.reads
}

// testNodeReader reads src on a clock the test moves; learned counts the reads handed on, each
// telling the kubelet's description its version.
func testNodeReader(t *testing.T, src *fakeNode) (n *NodeReader, advance func(time.Duration), learned *atomic.Int32) {
	logger := ktesting.NewLogger(t, ktesting.NewConfig())
	view := NewView(Kubelet{})
	learned = &atomic.Int32{}
	n = NewNodeReader(logger, src, view, func(_ context.Context, node *corev1.Node) {
		learned.Add(1)
		view.LearnVersion(logger, node.Status.NodeInfo.KubeletVersion, false)
	})
	var mu sync.Mutex
	now := time.Unix(1_000_000, 0)
	n.now = func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	return n, func(d time.Duration) { mu.Lock(); defer mu.Unlock(); now = now.Add(d) }, learned
}

// TestNodeReadAtPodStart: while the Node has not been read (the kubelet registers it after
// podgate started), a pod start that needs the kubelet's version reads it, whatever start-up's
// retries did, at most once every nodeReadInterval; once read, the version decides
// (dra.prepare auto: a kubelet 1.36 prepares), it is handed on once, and nobody reads again.
func TestNodeReadAtPodStart(t *testing.T) {
	ctx := t.Context()
	src := &fakeNode{}
	n, advance, learned := testNodeReader(t, src)

	if n.read(ctx, false) { // start-up's first try
		t.Fatal("a Node read before the kubelet registered it")
	}
	if n.PreparesDRA(ctx) {
		t.Error("the kubelet prepares, with no Node")
	}
	if got := src.count(); got != 2 {
		t.Errorf("%d GETs of the Node, want 2: start-up's and the pod start's", got)
	}
	src.register("v1.36.3")
	if n.PreparesDRA(ctx) {
		t.Error("the Node read again within nodeReadInterval of the pod start's last read")
	}
	if got := src.count(); got != 2 {
		t.Errorf("%d GETs of the Node within nodeReadInterval, want still 2", got)
	}
	advance(nodeReadInterval)
	if !n.PreparesDRA(ctx) {
		t.Error("kubelet v1.36.3 does not prepare claims")
	}
	if v := n.Now(ctx).Version; v != "v1.36.3" {
		t.Errorf("kubelet version %q, want v1.36.3", v)
	}
	advance(nodeReadInterval)
	n.Run(ctx, wait.Backoff{Duration: time.Hour, Steps: 2}) // returns at once: the Node is read
	if got, l := src.count(), learned.Load(); got != 3 || l != 1 {
		t.Errorf("%d GETs of the Node, handed on %d times; want 3 and once", got, l)
	}
}

// TestNodeReadOncePerBurst: the pod starts of a burst before the Node is read make one GET
// between them, and after the interval, once the Node is there, one more; the read is handed on
// once.
func TestNodeReadOncePerBurst(t *testing.T) {
	ctx := t.Context()
	src := &fakeNode{}
	n, advance, learned := testNodeReader(t, src)
	burst := func() {
		var wg sync.WaitGroup
		for range 20 {
			wg.Go(func() { n.Now(ctx) })
		}
		wg.Wait()
	}
	burst()
	if got := src.count(); got != 1 {
		t.Errorf("%d GETs of the Node for a burst of 20 pod starts, want 1", got)
	}
	src.register("v1.33.5")
	advance(nodeReadInterval)
	burst()
	if got, l := src.count(), learned.Load(); got != 2 || l != 1 {
		t.Errorf("%d GETs of the Node, handed on %d times; want 2 and once", got, l)
	}
	if n.PreparesDRA(ctx) {
		t.Error("kubelet v1.33.5 prepares claims")
	}
}

// TestNodeReadRetried: start-up's read is retried until the Node is there, and stops then.
func TestNodeReadRetried(t *testing.T) {
	src := &fakeNode{}
	n, _, learned := testNodeReader(t, src)
	var tries atomic.Int32
	n.source = nodeFunc(func(ctx context.Context) (*corev1.Node, error) {
		if tries.Add(1) == 3 {
			src.register("v1.37.2")
		}
		return src.Node(ctx)
	})
	n.Run(t.Context(), wait.Backoff{Duration: time.Millisecond, Steps: 100})
	if got, l := tries.Load(), learned.Load(); got != 3 || l != 1 {
		t.Errorf("%d tries, handed on %d times; want 3 (two without a Node) and once", got, l)
	}
	if v := n.kubelet.Get().Version; v != "v1.37.2" {
		t.Errorf("kubelet version %q, want v1.37.2", v)
	}
}

// nodeFunc is a nodeSource of a function.
type nodeFunc func(ctx context.Context) (*corev1.Node, error)

func (f nodeFunc) Node(ctx context.Context) (*corev1.Node, error) { return f(ctx) }
func (nodeFunc) NodeName() string                                 { return "node-a" }
