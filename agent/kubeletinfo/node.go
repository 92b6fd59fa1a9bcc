package kubeletinfo

// The node's Node object: the one place podgate reads it (NodeReader), until one read succeeds.

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"
)

// nodeReadInterval spaces the reads of the Node that pod starts make while it has not been
// read (Now): a Node podgate may not read costs one GET per interval, not one per pod
// start.
const nodeReadInterval = 10 * time.Second

// NodeSource reads this node's Node object (agent/kube's PodLookup).
type NodeSource interface {
	// Node reads the Node object, one GET bounded in time.
	Node(ctx context.Context) (*corev1.Node, error)
	// NodeName is the node's name.
	NodeName() string
}

// NodeReader reads this node's Node object until one read succeeds: at start-up, retried with
// a backoff while the API server does not answer or the kubelet has not registered its Node
// (Run), and meanwhile at a pod start that needs the kubelet's version (Now). The one
// read that succeeds is handed to learn, which tells the kubelet's description its version and
// each part of podgate that depends on the Node. The Node is not read again: a kubelet upgraded
// while podgate runs is seen when podgate next starts.
type NodeReader struct {
	source NodeSource
	// kubelet is the kubelet's description that learn tells the version.
	kubelet *View
	learn   func(ctx context.Context, node *corev1.Node)
	// logger is podgate's, for what learn logs of the node: a read made at a pod start logs
	// it without the pod's keys.
	logger klog.Logger
	now    func() time.Time

	// done is set once a read succeeded and learn returned.
	done atomic.Bool
	// mu serialises the reads: a pod start waits for a read in flight rather than making its
	// own; readAt is when the last read for a pod start began (run's reads are spaced by its
	// backoff, and do not hold a pod start back).
	mu     sync.Mutex
	readAt time.Time
}

// NewNodeReader reads the Node from source, handing the read to learn, which logs with
// logger; kubelet is the description learn updates.
func NewNodeReader(logger klog.Logger, source NodeSource, kubelet *View, learn func(context.Context, *corev1.Node)) *NodeReader {
	return &NodeReader{source: source, kubelet: kubelet, learn: learn, logger: logger, now: time.Now}
}

// Run reads the Node, retried with backoff until it is read (here or at a pod start) or ctx
// ends.
func (n *NodeReader) Run(ctx context.Context, backoff wait.Backoff) {
	_ = wait.ExponentialBackoffWithContext(ctx, backoff, func(ctx context.Context) (bool, error) {
		return n.read(ctx, false), nil
	})
}

// Now is the kubelet as known now. While the Node has not been read (podgate started
// before the kubelet registered it, and run retries with a backoff of up to 30 s), it is read
// now, by one GET at most every nodeReadInterval, which the callers meanwhile wait for: without
// it, the claims of the pods the kubelet starts right after it registered would be prepared
// twice.
func (n *NodeReader) Now(ctx context.Context) Kubelet {
	if !n.done.Load() {
		n.read(ctx, true)
	}
	return n.kubelet.Get()
}

// PreparesDRA tells dra.prepare auto whether the kubelet prepares claims itself, by its
// version as known now (dra/manager's WithKubeletPrepares).
func (n *NodeReader) PreparesDRA(ctx context.Context) bool {
	prepares, known, _ := n.Now(ctx).PreparesDRAClaims()
	return known && prepares
}

// read reads the Node unless it was read; spaced (a pod start's), not within nodeReadInterval
// of the last spaced read. It reports whether the Node has been read.
func (n *NodeReader) read(ctx context.Context, spaced bool) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.done.Load() {
		return true
	}
	if spaced {
		if !n.readAt.IsZero() && n.now().Sub(n.readAt) < nodeReadInterval {
			return false
		}
		n.readAt = n.now()
	}
	node, err := n.source.Node(ctx)
	if err != nil {
		klog.FromContext(ctx).V(1).Info("Node not read yet", "node", n.source.NodeName(), "err", err)
		return false
	}
	n.learn(klog.NewContext(ctx, n.logger), node)
	n.done.Store(true)
	return true
}
