package kube

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/klog/v2"
)

// The sources of the node's pods, the values of podgate_kube_pod_source's label.
const (
	sourceKubelet   = "kubelet-pods-api"
	sourceAPIServer = "api-server"
)

const (
	// podsAPIFallbackAfter is how long the kubelet's Pods API, once it has served, may stay
	// unreachable before podgate lists the node's pods from the API server instead. A kubelet
	// restart takes seconds, and meanwhile the cache keeps the pods it listed last (no CRI call
	// comes while the kubelet is down); a kubelet that comes back without the Pods API (its
	// gate turned off, an older version) must not leave the cache stale for good.
	podsAPIFallbackAfter = time.Minute
	// podsAPIProbeInterval is how often, while the pods come from the API server, podgate checks
	// whether the kubelet's Pods API serves: a stat of its socket, and a GetPod when it exists.
	// podgate usually starts before the kubelet, whose socket is not there yet.
	podsAPIProbeInterval = 10 * time.Second
)

// podSource is the pod informer's ListerWatcher: it lists and watches the node's pods from the
// kubelet's Pods API when the kubelet serves it, else from the API server (a spec.nodeName
// field selector). It chooses at each list, the reflector's first and each after a watch that
// could not go on:
//   - the kubelet answers: its Pods API, and no pod list, watch or GET on the API server;
//   - the socket answers Unimplemented: not a Pods API; the API server;
//   - the socket does not answer (absent, nobody listening) and the Pods API never served:
//     a kubelet older than 1.37, its PodsAPI gate off, or the kubelet not started yet; the API
//     server, whose watch ends as soon as a probe finds the Pods API serving;
//   - it does not answer but served before (the kubelet restarts): an error, which the
//     reflector retries with its backoff while the cache keeps its pods, and the API server
//     once it has not answered for podsAPIFallbackAfter;
//   - any other refusal (FailedPrecondition while the kubelet initialises): an error, retried.
type podSource struct {
	api           API
	selector      string
	kubelet       *kubeletPods // nil: the Pods API is off
	fallbackAfter time.Duration
	probeInterval time.Duration
	now           func() time.Time
	sources       *prometheus.GaugeVec
	calls         *prometheus.CounterVec

	mu           sync.Mutex
	current      string    // the source chosen last; "" before the first choice
	served       bool      // the Pods API has answered once
	failingSince time.Time // since when the Pods API, which served, does not answer
	tokens       uint64
	// listToken is the resourceVersion of the kubelet's last list, until a watch takes it up
	// with listed, the pods of that list.
	listToken string
	listed    []*corev1.Pod
}

func newPodSourceMetrics() (*prometheus.GaugeVec, *prometheus.CounterVec) {
	return prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "podgate", Subsystem: "kube", Name: "pod_source",
			Help: "1 for where podgate learns the node's pods from: " + sourceKubelet + " (the kubelet's local Pods API, no API server request) or " + sourceAPIServer + " (the informer's list and watch).",
		}, []string{"source"}),
		prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "podgate", Subsystem: "kube", Name: "pods_api_requests_total",
			Help: "Calls podgate made to the kubelet's Pods API, by method and gRPC code.",
		}, []string{"method", "code"})
}

// source returns the source chosen last.
func (s *podSource) source() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.current
}

// setLocked makes src the source and logs why when it changes. s.mu is held.
func (s *podSource) setLocked(ctx context.Context, src, reason string) {
	if s.current == src {
		return
	}
	s.current = src
	for _, v := range []string{sourceKubelet, sourceAPIServer} {
		g := 0.0
		if v == src {
			g = 1
		}
		s.sources.WithLabelValues(v).Set(g)
	}
	logger := klog.FromContext(ctx)
	socket := ""
	if s.kubelet != nil {
		socket = s.kubelet.socket
	}
	if src == sourceKubelet {
		logger.Info("The node's pods come from the kubelet's Pods API: no pod list, watch or GET on the API server", "socket", socket, "reason", reason)
		return
	}
	logger.Info("The node's pods come from the API server (an informer scoped by spec.nodeName)", "socket", socket, "reason", reason)
}

func (s *podSource) count(method string, err error) {
	s.calls.WithLabelValues(method, podsAPICode(err).String()).Inc()
}

// classify learns from a Pods API call's outcome which source to use: the kubelet (use, with
// err to return, nil on success) or the API server.
func (s *podSource) classify(ctx context.Context, err error) (use bool, _ error) {
	code := podsAPICode(err)
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case code == codes.OK:
		s.served, s.failingSince = true, time.Time{}
		s.setLocked(ctx, sourceKubelet, "the kubelet serves its Pods API")
		return true, nil
	case ctx.Err() != nil:
		return true, err // podgate stops: nothing learnt
	case code == codes.Unimplemented:
		s.setLocked(ctx, sourceAPIServer, "the socket answers Unimplemented: no Pods API there")
		return false, nil
	case code != codes.Unavailable && code != codes.DeadlineExceeded:
		// FailedPrecondition while the kubelet initialises, ResourceExhausted: the Pods API is
		// there, and serves later.
		s.failingSince = time.Time{}
		s.setLocked(ctx, sourceKubelet, "the kubelet serves its Pods API, not yet ready: "+err.Error())
		return true, err
	case !s.served:
		s.setLocked(ctx, sourceAPIServer, "the socket does not answer: a kubelet older than 1.37, its PodsAPI feature gate off, or not started yet (podgate switches to the Pods API when it answers): "+err.Error())
		return false, nil
	}
	now := s.now()
	if s.failingSince.IsZero() {
		s.failingSince = now
	}
	if now.Sub(s.failingSince) < s.fallbackAfter {
		return true, fmt.Errorf("%w (the kubelet restarting? the pods listed last are kept meanwhile)", err)
	}
	s.setLocked(ctx, sourceAPIServer, fmt.Sprintf("the kubelet's Pods API has not answered for %s: %v", s.fallbackAfter, err))
	return false, nil
}

// list implements the informer's list.
func (s *podSource) list(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
	if s.kubelet == nil {
		s.mu.Lock()
		s.setLocked(ctx, sourceAPIServer, "the kubelet's Pods API is off (kubeletPodsAPISocket is empty)")
		s.mu.Unlock()
	} else {
		pods, err := s.kubelet.list(ctx)
		s.count("ListPods", err)
		if use, err := s.classify(ctx, err); use {
			if err != nil {
				return nil, err
			}
			return s.podList(pods), nil
		}
	}
	opts.FieldSelector = s.selector
	return s.api.ListPods(ctx, metav1.NamespaceAll, opts)
}

// podList is the kubelet's pods as a list whose resourceVersion a watch takes up once.
func (s *podSource) podList(pods []*corev1.Pod) *corev1.PodList {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.tokens++
	s.listToken = podsAPIToken(s.tokens)
	s.listed = make([]*corev1.Pod, len(pods))
	list := &corev1.PodList{ListMeta: metav1.ListMeta{ResourceVersion: s.listToken}, Items: make([]corev1.Pod, len(pods))}
	for i, p := range pods {
		list.Items[i] = *p
		// What a deletion needs, as the kubelet's DELETED events carry.
		s.listed[i] = &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name, UID: p.UID}}
	}
	return list
}

// takeList returns the pods of the kubelet's list whose resourceVersion is rv, once.
func (s *podSource) takeList(rv string) ([]*corev1.Pod, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if rv == "" || rv != s.listToken {
		return nil, false
	}
	listed := s.listed
	s.listToken, s.listed = "", nil
	if listed == nil {
		listed = []*corev1.Pod{} // not nil: the watch follows a list
	}
	return listed, true
}

func (s *podSource) nextToken() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.tokens++
	return podsAPIToken(s.tokens)
}

// watch implements the informer's watch.
func (s *podSource) watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	if s.kubelet != nil {
		if w, use, err := s.watchKubelet(ctx, opts); use {
			return w, err
		}
	}
	opts.FieldSelector = s.selector
	w, err := s.api.WatchPods(ctx, metav1.NamespaceAll, opts)
	if err != nil || s.kubelet == nil {
		return w, err
	}
	return newProbingWatch(w, s.probeInterval, func() bool { return s.kubeletServes(ctx) }), nil
}

// watchKubelet starts a watch on the kubelet's Pods API, or says to use the API server.
func (s *podSource) watchKubelet(ctx context.Context, opts metav1.ListOptions) (_ watch.Interface, use bool, _ error) {
	var mode watchMode
	listed, afterList := s.takeList(opts.ResourceVersion)
	switch {
	case opts.SendInitialEvents != nil && *opts.SendInitialEvents:
		mode.bookmark = s.nextToken() // the reflector's streaming list
	case afterList:
		mode.listed = listed // the watch after the reflector's list
	case s.source() == sourceKubelet || s.kubeletServes(ctx):
		// A watch that resumes where one ended: a kubelet's stream cannot.
		return nil, true, apierrors.NewResourceExpired("the kubelet's Pods API cannot resume a watch: list again")
	default:
		return nil, false, nil
	}
	w, err := s.kubelet.watch(ctx, mode)
	s.count("WatchPods", err)
	use, err = s.classify(ctx, err)
	if !use && mode.listed != nil {
		// The list was the kubelet's; the API server cannot go on from it.
		return nil, true, apierrors.NewResourceExpired("the kubelet's Pods API went away after its list: list again")
	}
	return w, use, err
}

// kubeletServes probes the Pods API: its socket exists, and it answers GetPod.
func (s *podSource) kubeletServes(ctx context.Context) bool {
	if fi, err := os.Stat(s.kubelet.socket); err != nil || fi.Mode().Type() != fs.ModeSocket {
		return false
	}
	_, err := s.kubelet.get(ctx, "")
	s.count("GetPod", err)
	code := podsAPICode(err)
	return code == codes.OK || code == codes.NotFound
}

// getPod asks the kubelet's Pods API for the pod with this UID when it is the source, or may
// be (none chosen yet): done is false when the API server must answer instead.
func (s *podSource) getPod(ctx context.Context, uid types.UID) (pod *corev1.Pod, done bool, err error) {
	if s.kubelet == nil || s.source() == sourceAPIServer {
		return nil, false, nil
	}
	pod, err = s.kubelet.get(ctx, uid)
	s.count("GetPod", err)
	code := podsAPICode(err)
	s.mu.Lock()
	served := s.served
	s.mu.Unlock()
	if code == codes.Unimplemented || (code == codes.Unavailable && !served) {
		return nil, false, nil
	}
	return pod, true, err
}

// probingWatch is an API server watch that ends when probe finds the kubelet's Pods API
// serving: the reflector then watches again, and podSource has it list from the kubelet.
type probingWatch struct {
	inner    watch.Interface
	result   chan watch.Event
	done     chan struct{}
	stopOnce sync.Once
}

var _ watch.Interface = (*probingWatch)(nil)

func newProbingWatch(inner watch.Interface, every time.Duration, probe func() bool) *probingWatch {
	w := &probingWatch{inner: inner, result: make(chan watch.Event), done: make(chan struct{})}
	go w.run(every, probe)
	return w
}

// Stop implements watch.Interface.
func (w *probingWatch) Stop() { w.stopOnce.Do(func() { close(w.done) }) }

// ResultChan implements watch.Interface.
func (w *probingWatch) ResultChan() <-chan watch.Event { return w.result }

func (w *probingWatch) run(every time.Duration, probe func() bool) {
	defer close(w.result)
	defer w.inner.Stop()
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case ev, ok := <-w.inner.ResultChan():
			if !ok {
				return
			}
			select {
			case w.result <- ev:
			case <-w.done:
				return
			}
		case <-tick.C:
			if probe() {
				return
			}
		case <-w.done:
			return
		}
	}
}
