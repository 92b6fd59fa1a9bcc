package kube

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/containerd/errdefs"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
)

// podFetchTimeout bounds the GET of a pod the informer has not delivered. RunPodSandbox waits on
// it, and the kubelet gives that call minutes (--runtime-request-timeout, 2m by default). A
// healthy API server answers in milliseconds, a busy one that queues the request (API Priority
// and Fairness) in seconds; no answer after 10s means it is down or overloaded, and failing the
// sandbox as Unavailable lets the kubelet retry on its next sync instead of holding the call.
const podFetchTimeout = 10 * time.Second

// kubeNoAnswer is the code label of a request that got no HTTP answer (unreachable, timed out),
// as in client-go's rest_client_requests_total.
const kubeNoAnswer = "<error>"

func newKubeRequests() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "podgate", Subsystem: "kube", Name: "requests_total",
		Help: "Requests podgate made to the Kubernetes API server on behalf of pod starts (not the pod informer's list and watch), by verb, resource and HTTP status code (" + kubeNoAnswer + ": no answer).",
	}, []string{"verb", "resource", "code"})
}

// requestCode is the code label of a request that ended with err.
func requestCode(err error) string {
	if err == nil {
		return "200"
	}
	var s apierrors.APIStatus
	if errors.As(err, &s) && s.Status().Code != 0 {
		return strconv.Itoa(int(s.Status().Code))
	}
	return kubeNoAnswer
}

// podFetchKey names one GET: the pod by name, and the UID it must have.
type podFetchKey struct {
	uid             types.UID
	namespace, name string
}

// podFetch is one GET in flight, shared by the calls for the same pod that come meanwhile.
type podFetch struct {
	done    chan struct{} // closed once pod and err are set
	pod     *corev1.Pod
	err     error
	callers int // the calls that started or joined it; under PodLookup.mu
}

// GetOrFetch returns the pod with this UID, bound to this node, for steps that cannot do without
// it: from the informer's cache or, when the informer has not delivered the pod yet, from one GET
// of namespace/name on the API server, accepted only if the pod has this UID (a pod re-created
// under the same name is another pod) and is bound to this node. Where the pods come from the
// kubelet's Pods API, the one request is its GetPod of the UID instead, accepted only if the pod
// has this namespace and name, and the API server is not asked. Calls for the same pod while a
// request is in flight share it; the fetched pod is not added to the cache, which the informer
// fills. The pod is shared: do not modify it.
//
// Errors are classed with errdefs, for the CRI boundary to map to gRPC codes:
//   - ErrNotFound: the API server has no pod of that name, or its pod has another UID (the
//     kubelet has no pod of that UID, or its pod has another name): the pod the caller means is
//     gone.
//   - ErrFailedPrecondition: the pod exists but is bound to another node, or to none. It is not
//     gone, so not-found would mislead; this node must not run it while the API says otherwise.
//   - ErrUnavailable: no answer within the fetch timeout, or any other failed GET: unreachable,
//     throttled, 5xx, and also 401/403 (podgate's credentials or RBAC, which an operator fixes
//     while the kubelet retries; PermissionDenied would blame the kubelet); the kubelet's
//     refusal while it initialises or restarts.
//   - context.Canceled or context.DeadlineExceeded: ctx ended first.
//
// From the API server, static pods are not found: the kubelet knows them by a UID of its own
// (their config hash), which their mirror pod in the API does not carry. The kubelet's Pods
// API knows them by that UID.
func (l *PodLookup) GetOrFetch(ctx context.Context, uid types.UID, namespace, name string) (*corev1.Pod, error) {
	if pod, ok := l.Get(uid); ok {
		return pod, nil
	}
	ref := klog.KRef(namespace, name)
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("get pod %s uid %s: %w", ref, uid, err)
	}
	key := podFetchKey{uid: uid, namespace: namespace, name: name}
	f := l.startFetch(ctx, key)
	// The GET ends by its own timeout; the wait has one too, so that it stays bounded even
	// with a client that does not honour its context.
	timer := time.NewTimer(l.fetchTimeout)
	defer timer.Stop()
	select {
	case <-f.done:
		return f.pod, f.err
	case <-ctx.Done():
		return nil, fmt.Errorf("get pod %s uid %s: %w", ref, uid, ctx.Err())
	case <-timer.C:
		return nil, l.noAnswer(key)
	}
}

// startFetch returns the GET in flight for key, starting it if there is none.
func (l *PodLookup) startFetch(ctx context.Context, key podFetchKey) *podFetch {
	l.mu.Lock()
	defer l.mu.Unlock()
	f, ok := l.fetches[key]
	if !ok {
		f = &podFetch{done: make(chan struct{})}
		l.fetches[key] = f
		// The GET outlives the call that starts it: the calls that join it wait for its answer.
		go l.fetch(context.WithoutCancel(ctx), key, f)
	}
	f.callers++
	return f
}

// fetchCallers returns how many calls share the GET in flight for key; 0 without one.
func (l *PodLookup) fetchCallers(key podFetchKey) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	if f, ok := l.fetches[key]; ok {
		return f.callers
	}
	return 0
}

// fetch makes the GET for key and hands its outcome to the calls waiting on f.
func (l *PodLookup) fetch(ctx context.Context, key podFetchKey, f *podFetch) {
	ctx, cancel := context.WithTimeout(ctx, l.fetchTimeout)
	defer cancel()
	pod, err := l.get(ctx, key)

	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.fetches, key)
	f.pod, f.err = pod, err
	close(f.done)
	klog.FromContext(ctx).V(3).Info("Fetched a pod the informer has not delivered",
		"pod", klog.KRef(key.namespace, key.name), "uid", key.uid, "callers", f.callers, "err", err)
	if len(l.fetches) == 0 {
		l.fetched.Broadcast()
	}
}

// get is fetch's one request: GetPod on the kubelet's Pods API when the pods come from it,
// else a GET on the API server.
func (l *PodLookup) get(ctx context.Context, key podFetchKey) (*corev1.Pod, error) {
	if pod, done, err := l.source.getPod(ctx, key.uid); done {
		return l.checkKubeletPod(ctx, key, pod, err)
	}
	pod, err := l.client.GetPod(ctx, key.namespace, key.name)
	l.requests.WithLabelValues("get", "pods", requestCode(err)).Inc()
	if err != nil && ctx.Err() != nil {
		return nil, l.noAnswer(key)
	}
	return l.checkFetched(key, pod, err)
}

// checkKubeletPod classes the kubelet's answer to GetPod for key, as checkFetched the API
// server's.
func (l *PodLookup) checkKubeletPod(ctx context.Context, key podFetchKey, pod *corev1.Pod, err error) (*corev1.Pod, error) {
	ref := klog.KRef(key.namespace, key.name)
	switch {
	case err != nil && ctx.Err() != nil:
		return nil, l.noAnswer(key)
	case podsAPICode(err) == codes.NotFound:
		return nil, fmt.Errorf("get pod %s uid %s: %w: the kubelet has no pod of that UID", ref, key.uid, errdefs.ErrNotFound)
	case err != nil:
		return nil, fmt.Errorf("get pod %s uid %s: %w: %w", ref, key.uid, errdefs.ErrUnavailable, err)
	case pod.UID != key.uid || pod.Namespace != key.namespace || pod.Name != key.name:
		return nil, fmt.Errorf("get pod %s uid %s: %w: the kubelet's pod of that UID is %s uid %s",
			ref, key.uid, errdefs.ErrNotFound, klog.KObj(pod), pod.UID)
	}
	return l.checkFetched(key, pod, nil)
}

// checkFetched classes the API server's answer to the GET for key.
func (l *PodLookup) checkFetched(key podFetchKey, pod *corev1.Pod, err error) (*corev1.Pod, error) {
	ref := klog.KRef(key.namespace, key.name)
	switch {
	case apierrors.IsNotFound(err):
		return nil, fmt.Errorf("get pod %s uid %s: %w", ref, key.uid, errdefs.ErrNotFound)
	case err != nil:
		return nil, fmt.Errorf("get pod %s uid %s: %w: %w", ref, key.uid, errdefs.ErrUnavailable, err)
	case pod.UID != key.uid:
		return nil, fmt.Errorf("get pod %s uid %s: %w: the name holds another pod, uid %s",
			ref, key.uid, errdefs.ErrNotFound, pod.UID)
	case pod.Spec.NodeName == "":
		return nil, fmt.Errorf("get pod %s uid %s: %w: bound to no node, not to %s",
			ref, key.uid, errdefs.ErrFailedPrecondition, l.node)
	case pod.Spec.NodeName != l.node:
		return nil, fmt.Errorf("get pod %s uid %s: %w: bound to node %s, not to %s",
			ref, key.uid, errdefs.ErrFailedPrecondition, pod.Spec.NodeName, l.node)
	}
	return pod, nil
}

// noAnswer is the error of a GET for key that the fetch timeout ended.
func (l *PodLookup) noAnswer(key podFetchKey) error {
	return fmt.Errorf("get pod %s uid %s: %w: no answer within %s",
		klog.KRef(key.namespace, key.name), key.uid, errdefs.ErrUnavailable, l.fetchTimeout)
}
