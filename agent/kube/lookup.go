package kube

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
)

// uidIndex indexes the pod informer's cache by pod UID: the CRI names pods by UID.
const uidIndex = "uid"

// PodLookup is podgate's view of the pods bound to its node, in an informer's cache. Where the
// kubelet serves its Pods API (1.37, WithKubeletPodsAPI) the informer lists and watches the
// kubelet's pods on that local socket and podgate asks the API server for no pod; elsewhere it
// lists and watches the API server with a spec.nodeName field selector: podgate never watches
// the whole cluster (podSource says when which). Features look pods up by UID and subscribe to
// their deletion; steps that cannot do without the pod fetch it when the informer has not
// delivered it yet (GetOrFetch). It keeps the client for features that need other API objects.
type PodLookup struct {
	client        API
	node          string
	informer      cache.SharedIndexInformer
	source        *podSource
	podsAPISocket string
	fetchTimeout  time.Duration
	registerer    prometheus.Registerer
	requests      *prometheus.CounterVec
	fallbackAfter time.Duration
	probeInterval time.Duration

	mu        sync.Mutex
	onDeleted []func(*corev1.Pod)
	// fetches are the GETs in flight, so that a burst of calls for one pod costs one request.
	fetches map[podFetchKey]*podFetch
	// fetched is broadcast when the last GET in flight ends.
	fetched *sync.Cond
}

// PodLookupOption configures a PodLookup.
type PodLookupOption func(*PodLookup)

// WithMetrics registers the lookup's metrics with reg: podgate_kube_requests_total, the API
// requests made on behalf of pod starts, podgate_kube_pod_informer_synced, podgate_kube_pod_source
// and podgate_kube_pods_api_requests_total. Without it they are counted but not exported.
func WithMetrics(reg prometheus.Registerer) PodLookupOption {
	return func(l *PodLookup) { l.registerer = reg }
}

// WithPodFetchTimeout bounds each GET that GetOrFetch makes, in place of podFetchTimeout. A
// duration that is not positive keeps the default.
func WithPodFetchTimeout(d time.Duration) PodLookupOption {
	return func(l *PodLookup) {
		if d > 0 {
			l.fetchTimeout = d
		}
	}
}

// WithKubeletPodsAPI has the lookup learn the node's pods from the kubelet's Pods API on socket
// (DefaultKubeletPodsAPISocket on a standard node) whenever the kubelet serves it, in place of
// the API server; "" keeps the API server.
func WithKubeletPodsAPI(socket string) PodLookupOption {
	return func(l *PodLookup) { l.podsAPISocket = socket }
}

// withPodsAPITiming replaces podsAPIFallbackAfter and podsAPIProbeInterval, for tests.
func withPodsAPITiming(fallbackAfter, probeInterval time.Duration) PodLookupOption {
	return func(l *PodLookup) { l.fallbackAfter, l.probeInterval = fallbackAfter, probeInterval }
}

// NewPodLookup creates the lookup of the pods bound to nodeName. Start it with Run.
func NewPodLookup(client API, nodeName string, opts ...PodLookupOption) (*PodLookup, error) {
	l := &PodLookup{
		client:        client,
		node:          nodeName,
		fetchTimeout:  podFetchTimeout,
		requests:      newKubeRequests(),
		fetches:       make(map[podFetchKey]*podFetch),
		fallbackAfter: podsAPIFallbackAfter,
		probeInterval: podsAPIProbeInterval,
	}
	l.fetched = sync.NewCond(&l.mu)
	for _, o := range opts {
		o(l)
	}
	sources, calls := newPodSourceMetrics()
	l.source = &podSource{
		api: client, selector: fields.OneTermEqualSelector("spec.nodeName", nodeName).String(),
		fallbackAfter: l.fallbackAfter, probeInterval: l.probeInterval, now: time.Now,
		sources: sources, calls: calls,
	}
	if l.podsAPISocket != "" {
		k, err := newKubeletPods(l.podsAPISocket)
		if err != nil {
			return nil, err
		}
		l.source.kubelet = k
	}
	lw := &cache.ListWatch{ListWithContextFunc: l.source.list, WatchFuncWithContext: l.source.watch}
	// A client that cannot stream the initial list as watch events (a fake) says so, as
	// client-go's generated informers let it; the kubelet's Pods API can either way.
	l.informer = cache.NewSharedIndexInformer(cache.ToListWatcherWithWatchListSemantics(lw, client), &corev1.Pod{}, 0,
		cache.Indexers{uidIndex: podUIDIndex})
	if err := l.informer.SetTransform(stripManagedFields); err != nil {
		return nil, fmt.Errorf("pod informer: %w", err)
	}
	if err := l.registerMetrics(sources, calls); err != nil {
		return nil, err
	}
	if err := l.handleDeletions(); err != nil {
		return nil, fmt.Errorf("pod informer: %w", err)
	}
	return l, nil
}

// registerMetrics registers the lookup's metrics with the WithMetrics registerer, if any.
func (l *PodLookup) registerMetrics(more ...prometheus.Collector) error {
	if l.registerer == nil {
		return nil
	}
	inf := l.informer
	synced := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "podgate", Subsystem: "kube", Name: "pod_informer_synced",
		Help: "1 once the informer of the node's pods has listed them; until then features that need a pod fetch it (GetOrFetch) or do without it.",
	}, func() float64 {
		if inf.HasSynced() {
			return 1
		}
		return 0
	})
	for _, c := range append([]prometheus.Collector{l.requests, synced}, more...) {
		if err := l.registerer.Register(c); err != nil {
			return fmt.Errorf("register kube metrics: %w", err)
		}
	}
	return nil
}

// handleDeletions calls the OnDeleted subscribers from the informer's events.
func (l *PodLookup) handleDeletions() error {
	_, err := l.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		UpdateFunc: func(_, obj any) {
			// Graceful deletion sets deletionTimestamp long before the object goes: the pod
			// will not start, so what waits for it may stop now.
			if pod, ok := obj.(*corev1.Pod); ok && pod.DeletionTimestamp != nil {
				l.deleted(pod)
			}
		},
		DeleteFunc: func(obj any) {
			if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = tomb.Obj
			}
			if pod, ok := obj.(*corev1.Pod); ok {
				l.deleted(pod)
			}
		},
	})
	return err
}

// stripManagedFields drops a pod's managedFields before the informer caches it: server-side
// apply's field ownership is a few KiB per pod that podgate never reads, held for every pod of
// the node for as long as it runs.
func stripManagedFields(obj any) (any, error) {
	if pod, ok := obj.(*corev1.Pod); ok {
		pod.ManagedFields = nil
	}
	return obj, nil
}

func podUIDIndex(obj any) ([]string, error) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return nil, fmt.Errorf("pod index: unexpected %T", obj)
	}
	return []string{string(pod.UID)}, nil
}

// Run runs the informer until ctx ends, then waits for the GETs in flight, each bounded by the
// fetch timeout, so that nothing of the lookup outlives it, and closes the connection to the
// kubelet's Pods API.
func (l *PodLookup) Run(ctx context.Context) {
	l.informer.RunWithContext(ctx)
	l.WaitFetches()
	if k := l.source.kubelet; k != nil {
		if err := k.close(); err != nil {
			klog.FromContext(ctx).V(2).Info("Closing the kubelet's Pods API connection failed", "err", err)
		}
	}
}

// WaitFetches waits until no GET is in flight. Each is bounded by the fetch timeout. A caller
// that stops the callers of GetOrFetch first (podgate's shutdown: the CRI server) then knows
// that nothing of the lookup runs.
func (l *PodLookup) WaitFetches() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for len(l.fetches) > 0 {
		l.fetched.Wait()
	}
}

// HasSynced reports whether the informer has listed the node's pods once, from either source.
func (l *PodLookup) HasSynced() bool { return l.informer.HasSynced() }

// Client returns the Kubernetes client (the informer's, when the pods come from the API
// server), for features that need other API objects, e.g. the ResourceClaims of a pod. Its requests are the caller's to bound in time.
func (l *PodLookup) Client() API { return l.client }

// NodeName returns the name of the node whose pods the lookup holds.
func (l *PodLookup) NodeName() string { return l.node }

// nodeGetTimeout bounds one GET of the Node: one small object.
const nodeGetTimeout = 10 * time.Second

// Node reads the Node object of the lookup's node: one GET, bounded by nodeGetTimeout.
func (l *PodLookup) Node(ctx context.Context) (*corev1.Node, error) {
	ctx, cancel := context.WithTimeout(ctx, nodeGetTimeout)
	defer cancel()
	return l.client.GetNode(ctx, l.node)
}

// Get returns the pod with this UID, if it is bound to this node and the informer knows it.
// The pod is the cache's: do not modify it.
func (l *PodLookup) Get(uid types.UID) (*corev1.Pod, bool) {
	objs, err := l.informer.GetIndexer().ByIndex(uidIndex, string(uid))
	if err != nil || len(objs) == 0 {
		return nil, false
	}
	pod, ok := objs[0].(*corev1.Pod)
	return pod, ok
}

// OnDeleted calls fn when a pod of this node is deleted: when its deletionTimestamp is set
// (possibly more than once, on later updates) and when it is removed. fn must not block.
func (l *PodLookup) OnDeleted(fn func(*corev1.Pod)) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.onDeleted = append(l.onDeleted, fn)
}

func (l *PodLookup) deleted(pod *corev1.Pod) {
	l.mu.Lock()
	fns := l.onDeleted
	l.mu.Unlock()
	for _, fn := range fns {
		fn(pod)
	}
}

// PollDeleted asks the kubelet's Pods API, when it is the source of the node's pods, about
// the pods with these UIDs, and tells OnDeleted's subscribers of each one the kubelet no longer
// has or has marked for deletion. The Pods API's watch tells a deletion only with the pod's
// next status change, which for a pod whose image pull waits comes when the pull is over;
// its GetPod reads the kubelet's pod manager, which has the deletion at once. With the API
// server as the source it does nothing: the informer's watch tells deletions as they happen.
// A pod the Pods API cannot answer for (an error other than NotFound) is left alone.
func (l *PodLookup) PollDeleted(ctx context.Context, uids []types.UID) {
	s := l.source
	if s.kubelet == nil || s.source() != sourceKubelet {
		return
	}
	for _, uid := range uids {
		pod, err := s.kubelet.get(ctx, uid)
		s.count("GetPod", err)
		switch code := podsAPICode(err); {
		case code == codes.NotFound:
			gone, ok := l.Get(uid)
			if !ok {
				gone = &corev1.Pod{ObjectMeta: metav1.ObjectMeta{UID: uid}}
			}
			l.deleted(gone)
		case err != nil:
			klog.FromContext(ctx).V(2).Info("Asking the kubelet's Pods API about a pod failed", "podUID", uid, "err", err)
		case pod.DeletionTimestamp != nil:
			l.deleted(pod)
		}
	}
}
