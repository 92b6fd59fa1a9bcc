package kube

import (
	"context"
	"net"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	podsv1alpha1 "k8s.io/kubelet/pkg/apis/pods/v1alpha1"

	"github.com/podgate/podgate/test/kubefake"
)

// fakeKubelet serves the kubelet's Pods API as the kubelet 1.37 does: pods as protobuf bytes,
// WatchPods an ADDED event per pod, INITIAL_SYNC_COMPLETE, then the changes; a DELETED event
// carries only the name, namespace and UID.
type fakeKubelet struct {
	podsv1alpha1.UnimplementedPodsServer

	mu       sync.Mutex
	pods     map[types.UID][]byte
	watchers map[chan *podsv1alpha1.WatchPodsEvent]struct{}
	// notReady makes every call FailedPrecondition, as a kubelet that initialises.
	notReady bool
	// stop stops the server serve started last.
	stop func()

	gets, lists, watches atomic.Int32
}

func newFakeKubelet(t *testing.T, pods ...*corev1.Pod) *fakeKubelet {
	k := &fakeKubelet{pods: map[types.UID][]byte{}, watchers: map[chan *podsv1alpha1.WatchPodsEvent]struct{}{}}
	for _, p := range pods {
		k.pods[p.UID] = marshalPod(t, p)
	}
	return k
}

func marshalPod(t *testing.T, pod *corev1.Pod) []byte {
	t.Helper()
	b, err := pod.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// serve serves k on socket until the returned function stops the server, which ends the
// streams as a kubelet's exit does.
func (k *fakeKubelet) serve(t *testing.T, socket string) (stop func()) {
	t.Helper()
	lis, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	podsv1alpha1.RegisterPodsServer(srv, k)
	done := make(chan struct{})
	go func() { _ = srv.Serve(lis); close(done) }()
	var once sync.Once
	stop = func() { once.Do(func() { srv.Stop(); <-done }) }
	t.Cleanup(stop)
	k.mu.Lock()
	k.stop = stop
	k.mu.Unlock()
	return stop
}

func (k *fakeKubelet) ready() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.notReady {
		return status.Error(codes.FailedPrecondition, "Kubelet is initializing")
	}
	return nil
}

func (k *fakeKubelet) ListPods(context.Context, *podsv1alpha1.ListPodsRequest) (*podsv1alpha1.ListPodsResponse, error) {
	k.lists.Add(1)
	if err := k.ready(); err != nil {
		return nil, err
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	return &podsv1alpha1.ListPodsResponse{Pods: k.sortedLocked()}, nil
}

func (k *fakeKubelet) sortedLocked() [][]byte {
	uids := make([]types.UID, 0, len(k.pods))
	for uid := range k.pods {
		uids = append(uids, uid)
	}
	slices.Sort(uids)
	out := make([][]byte, len(uids))
	for i, uid := range uids {
		out[i] = k.pods[uid]
	}
	return out
}

func (k *fakeKubelet) GetPod(_ context.Context, req *podsv1alpha1.GetPodRequest) (*podsv1alpha1.GetPodResponse, error) {
	k.gets.Add(1)
	if err := k.ready(); err != nil {
		return nil, err
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	b, ok := k.pods[types.UID(req.GetPodUID())]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "pod with UID %s not found", req.GetPodUID())
	}
	return &podsv1alpha1.GetPodResponse{Pod: b}, nil
}

func (k *fakeKubelet) WatchPods(_ *podsv1alpha1.WatchPodsRequest, stream grpc.ServerStreamingServer[podsv1alpha1.WatchPodsEvent]) error {
	k.watches.Add(1)
	if err := k.ready(); err != nil {
		return err
	}
	ch := make(chan *podsv1alpha1.WatchPodsEvent, 100)
	k.mu.Lock()
	initial := k.sortedLocked()
	k.watchers[ch] = struct{}{}
	k.mu.Unlock()
	defer func() {
		k.mu.Lock()
		delete(k.watchers, ch)
		k.mu.Unlock()
	}()
	for _, b := range initial {
		if err := stream.Send(&podsv1alpha1.WatchPodsEvent{Type: podsv1alpha1.EventType_ADDED, Pod: b}); err != nil {
			return err
		}
	}
	if err := stream.Send(&podsv1alpha1.WatchPodsEvent{Type: podsv1alpha1.EventType_INITIAL_SYNC_COMPLETE}); err != nil {
		return err
	}
	for {
		select {
		case <-stream.Context().Done():
			return stream.Context().Err()
		case ev := <-ch:
			if err := stream.Send(ev); err != nil {
				return err
			}
		}
	}
}

// set adds or changes a pod and streams it (ADDED or MODIFIED).
func (k *fakeKubelet) set(t *testing.T, pod *corev1.Pod) {
	b := marshalPod(t, pod)
	k.mu.Lock()
	defer k.mu.Unlock()
	typ := podsv1alpha1.EventType_ADDED
	if _, ok := k.pods[pod.UID]; ok {
		typ = podsv1alpha1.EventType_MODIFIED
	}
	k.pods[pod.UID] = b
	k.broadcastLocked(&podsv1alpha1.WatchPodsEvent{Type: typ, Pod: b})
}

// setQuietly adds a pod without streaming it: a watch lagging behind the kubelet.
func (k *fakeKubelet) setQuietly(t *testing.T, pod *corev1.Pod) {
	b := marshalPod(t, pod)
	k.mu.Lock()
	defer k.mu.Unlock()
	k.pods[pod.UID] = b
}

// remove deletes a pod and streams a DELETED event with only its name, namespace and UID.
func (k *fakeKubelet) remove(t *testing.T, pod *corev1.Pod) {
	minimal := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID}}
	b := marshalPod(t, minimal)
	k.mu.Lock()
	defer k.mu.Unlock()
	delete(k.pods, pod.UID)
	k.broadcastLocked(&podsv1alpha1.WatchPodsEvent{Type: podsv1alpha1.EventType_DELETED, Pod: b})
}

func (k *fakeKubelet) broadcastLocked(ev *podsv1alpha1.WatchPodsEvent) {
	for ch := range k.watchers {
		ch <- ev
	}
}

// apiPodRequests counts the fake API server's pod requests by verb.
type apiPodRequests struct{ get, list, watch atomic.Int32 }

func countPodRequests(client *fake.Clientset) *apiPodRequests {
	r := &apiPodRequests{}
	for verb, n := range map[string]*atomic.Int32{"get": &r.get, "list": &r.list} {
		client.PrependReactor(verb, "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
			n.Add(1)
			return false, nil, nil
		})
	}
	client.PrependWatchReactor("pods", func(k8stesting.Action) (bool, watch.Interface, error) {
		r.watch.Add(1)
		return false, nil, nil
	})
	return r
}

func (r *apiPodRequests) total() int32 { return r.get.Load() + r.list.Load() + r.watch.Load() }

// noWatchList hides the fake clientset's "no streaming list" declaration, so that the
// reflector streams its initial list (SendInitialEvents), as it does with podgate's Client.
type noWatchList struct{ API }

// podsAPIHarness is a PodLookup on a fake API server and, at socket, a fake kubelet.
type podsAPIHarness struct {
	client  *fake.Clientset
	api     *apiPodRequests
	kubelet *fakeKubelet
	socket  string
	lookup  *PodLookup
	reg     *prometheus.Registry

	mu      sync.Mutex
	deleted []types.UID
}

type lookupSetup struct {
	watchList             bool
	fallback, probe       time.Duration
	apiPods, kubeletPods  []*corev1.Pod
	serveKubelet, noSync  bool
	unimplementedOnSocket bool
	// notReady has the kubelet refuse its Pods API from the start, as one that initialises.
	notReady bool
}

func startPodsAPILookup(t *testing.T, s lookupSetup) *podsAPIHarness {
	t.Helper()
	h := &podsAPIHarness{socket: filepath.Join(t.TempDir(), "pods-api.sock"), reg: prometheus.NewRegistry()}
	objs := make([]runtime.Object, len(s.apiPods))
	for i, p := range s.apiPods {
		objs[i] = p
	}
	h.client = fake.NewClientset(objs...)
	h.api = countPodRequests(h.client)
	h.kubelet = newFakeKubelet(t, s.kubeletPods...)
	h.kubelet.notReady = s.notReady
	switch {
	case s.serveKubelet:
		h.kubelet.serve(t, h.socket)
	case s.unimplementedOnSocket:
		serveNothing(t, h.socket)
	}
	var api API = kubefake.Wrap(h.client)
	if s.watchList {
		api = noWatchList{api}
	}
	opts := []PodLookupOption{WithMetrics(h.reg), WithKubeletPodsAPI(h.socket)}
	if s.fallback > 0 {
		opts = append(opts, withPodsAPITiming(s.fallback, s.probe))
	}
	l, err := NewPodLookup(api, "node-a", opts...)
	if err != nil {
		t.Fatal(err)
	}
	h.lookup = l
	l.OnDeleted(func(p *corev1.Pod) {
		h.mu.Lock()
		defer h.mu.Unlock()
		h.deleted = append(h.deleted, p.UID)
	})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { l.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	if !s.noSync {
		h.waitSync(t)
	}
	return h
}

func (h *podsAPIHarness) waitSync(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), kubeTimeout)
	defer cancel()
	if !cache.WaitForCacheSync(ctx.Done(), h.lookup.HasSynced) {
		t.Fatal("pod informer did not sync")
	}
}

// serveNothing serves gRPC on socket with no service: every call is Unimplemented, as on a
// socket that is not a kubelet's Pods API.
func serveNothing(t *testing.T, socket string) {
	lis, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
}

// eventually polls cond until it holds, failing the test after kubeTimeout.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	err := wait.PollUntilContextTimeout(t.Context(), 5*time.Millisecond, kubeTimeout, true, func(context.Context) (bool, error) {
		return cond(), nil
	})
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

func (h *podsAPIHarness) wasDeleted(uid types.UID) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Contains(h.deleted, uid)
}

func (h *podsAPIHarness) source(t *testing.T) string {
	t.Helper()
	for _, s := range []string{sourceKubelet, sourceAPIServer} {
		if testutil.ToFloat64(h.lookup.source.sources.WithLabelValues(s)) == 1 {
			return s
		}
	}
	return ""
}

// TestPodLookupFromKubeletPodsAPI: where the kubelet serves its Pods API, the lookup's pods
// come from it, in the reflector's list-then-watch and in its streaming list: lookups after
// the sync, pods created, modified and deleted through the stream, GetOrFetch through GetPod,
// and not one pod request to the API server, which holds other pods to tell them apart.
func TestPodLookupFromKubeletPodsAPI(t *testing.T) {
	for _, watchList := range []bool{false, true} {
		t.Run(map[bool]string{false: "list-then-watch", true: "streaming-list"}[watchList], func(t *testing.T) {
			h := startPodsAPILookup(t, lookupSetup{
				watchList: watchList, serveKubelet: true,
				kubeletPods: []*corev1.Pod{testPod("1", "system-node-critical"), testPod("2", "")},
				apiPods:     []*corev1.Pod{testPod("api-only", "")},
			})
			if pod, ok := h.lookup.Get("uid-1"); !ok || pod.Spec.PriorityClassName != "system-node-critical" {
				t.Fatalf("Get(uid-1) after the sync = %v, %v; want the kubelet's pod", pod, ok)
			}
			if _, ok := h.lookup.Get("uid-api-only"); ok {
				t.Error("Get found the API server's pod: the lookup listed the API server")
			}
			if got := h.source(t); got != sourceKubelet {
				t.Errorf("podgate_kube_pod_source = %q, want %q", got, sourceKubelet)
			}
			wantLists := map[bool]int32{false: 1, true: 0}[watchList]
			if l, w := h.kubelet.lists.Load(), h.kubelet.watches.Load(); l != wantLists || w != 1 {
				t.Errorf("the sync made %d ListPods and %d WatchPods calls, want %d and 1", l, w, wantLists)
			}

			h.kubelet.set(t, testPod("3", ""))
			eventually(t, "a pod created through the stream reaching Get", func() bool {
				_, ok := h.lookup.Get("uid-3")
				return ok
			})
			modified := testPod("2", "system-cluster-critical")
			modified.DeletionTimestamp = &metav1.Time{Time: time.Now()}
			h.kubelet.set(t, modified)
			eventually(t, "a pod's deletionTimestamp through the stream reaching OnDeleted", func() bool { return h.wasDeleted("uid-2") })
			if pod, ok := h.lookup.Get("uid-2"); !ok || pod.Spec.PriorityClassName != "system-cluster-critical" {
				t.Errorf("Get(uid-2) after MODIFIED = %v, %v; want the modified pod", pod, ok)
			}
			h.kubelet.remove(t, testPod("1", ""))
			eventually(t, "a DELETED pod reaching OnDeleted", func() bool { return h.wasDeleted("uid-1") })
			if _, ok := h.lookup.Get("uid-1"); ok {
				t.Error("Get(uid-1) still finds the pod the kubelet deleted")
			}

			h.kubelet.setQuietly(t, testPod("4", "system-node-critical"))
			gets := h.kubelet.gets.Load()
			pod, err := h.lookup.GetOrFetch(t.Context(), "uid-4", "default", "pod-4")
			if err != nil || pod.Spec.PriorityClassName != "system-node-critical" {
				t.Fatalf("GetOrFetch of a pod not streamed yet = %v, %v; want the kubelet's pod", pod, err)
			}
			if n := h.kubelet.gets.Load() - gets; n != 1 {
				t.Errorf("GetOrFetch made %d GetPod calls, want 1", n)
			}
			if _, err := h.lookup.GetOrFetch(t.Context(), "uid-gone", "default", "pod-gone"); !errdefs.IsNotFound(err) {
				t.Errorf("GetOrFetch of a pod the kubelet does not have: %v, want not found", err)
			}
			if _, err := h.lookup.GetOrFetch(t.Context(), "uid-4", "default", "other-name"); !errdefs.IsNotFound(err) {
				t.Errorf("GetOrFetch of a UID whose pod has another name: %v, want not found", err)
			}
			if n := h.api.total(); n != 0 {
				t.Errorf("the API server got %d pod requests (get %d, list %d, watch %d), want none",
					n, h.api.get.Load(), h.api.list.Load(), h.api.watch.Load())
			}
			if got := podGets(t, h.reg); len(got) != 0 {
				t.Errorf("podgate_kube_requests_total{verb=get,resource=pods} = %v, want none", got)
			}
		})
	}
}

// kubeletCalls is podgate_kube_pods_api_requests_total for method and code.
func (h *podsAPIHarness) kubeletCalls(method string, code codes.Code) float64 {
	return testutil.ToFloat64(h.lookup.source.calls.WithLabelValues(method, code.String()))
}

// TestPodLookupPodsAPIUnimplemented: a socket that answers Unimplemented is no Pods API (an
// older kubelet, something else): the pods come from the API server, as without the socket.
func TestPodLookupPodsAPIUnimplemented(t *testing.T) {
	h := startPodsAPILookup(t, lookupSetup{unimplementedOnSocket: true, apiPods: []*corev1.Pod{testPod("1", "")}})
	if _, ok := h.lookup.Get("uid-1"); !ok {
		t.Error("Get(uid-1): the API server's pod not found")
	}
	if h.api.list.Load() == 0 {
		t.Error("the informer did not list the API server")
	}
	if got := h.source(t); got != sourceAPIServer {
		t.Errorf("podgate_kube_pod_source = %q, want %q", got, sourceAPIServer)
	}
	if n := h.kubeletCalls("ListPods", codes.Unimplemented); n == 0 {
		t.Error("no ListPods answered Unimplemented: the socket was not asked")
	}
	if _, err := h.lookup.GetOrFetch(t.Context(), "uid-2", "default", "pod-2"); !errdefs.IsNotFound(err) {
		t.Errorf("GetOrFetch of a pod the API server does not have: %v, want not found", err)
	}
	if h.api.get.Load() != 1 {
		t.Errorf("GetOrFetch made %d GETs on the API server, want 1", h.api.get.Load())
	}
}

// TestPodLookupPodsAPIAppears: podgate usually starts before the kubelet. Without the socket
// the pods come from the API server; once the kubelet serves its Pods API they come from it.
func TestPodLookupPodsAPIAppears(t *testing.T) {
	h := startPodsAPILookup(t, lookupSetup{
		fallback: time.Minute, probe: 20 * time.Millisecond,
		apiPods:     []*corev1.Pod{testPod("api", "")},
		kubeletPods: []*corev1.Pod{testPod("kubelet", "")},
	})
	if _, ok := h.lookup.Get("uid-api"); !ok || h.source(t) != sourceAPIServer {
		t.Fatalf("without the socket: Get(uid-api) found %v, source %q; want the API server's pod", ok, h.source(t))
	}
	h.kubelet.serve(t, h.socket)
	eventually(t, "the kubelet's pod once its Pods API serves", func() bool {
		_, ok := h.lookup.Get("uid-kubelet")
		return ok
	})
	if got := h.source(t); got != sourceKubelet {
		t.Errorf("podgate_kube_pod_source = %q, want %q", got, sourceKubelet)
	}
	eventually(t, "the API server's pod gone from the cache", func() bool {
		_, ok := h.lookup.Get("uid-api")
		return !ok && h.wasDeleted("uid-api")
	})
	requests := h.api.total()
	h.kubelet.set(t, testPod("later", ""))
	eventually(t, "a pod streamed after the switch", func() bool {
		_, ok := h.lookup.Get("uid-later")
		return ok
	})
	if _, err := h.lookup.GetOrFetch(t.Context(), "uid-kubelet", "default", "pod-kubelet"); err != nil {
		t.Errorf("GetOrFetch(uid-kubelet): %v", err)
	}
	if n := h.api.total() - requests; n != 0 {
		t.Errorf("%d pod requests to the API server after the switch, want none", n)
	}
}

// TestPodLookupPodsAPIKubeletRestart: the stream ends when the kubelet stops. Meanwhile the
// cache keeps its pods and podgate asks the API server nothing; once the kubelet serves again,
// podgate lists it again: a pod gone meanwhile is deleted, a new one added.
func TestPodLookupPodsAPIKubeletRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("waits out client-go's reflector backoff in real time (seconds): not in -short (make unit); make test runs it")
	}
	for _, watchList := range []bool{false, true} {
		t.Run(map[bool]string{false: "list-then-watch", true: "streaming-list"}[watchList], func(t *testing.T) {
			testKubeletRestart(t, watchList)
		})
	}
}

func testKubeletRestart(t *testing.T, watchList bool) {
	h := startPodsAPILookup(t, lookupSetup{watchList: watchList, serveKubelet: true, kubeletPods: []*corev1.Pod{testPod("1", ""), testPod("2", "")}})
	h.stopKubelet(t)
	eventually(t, "podgate failing to reach the stopped kubelet", func() bool {
		return h.kubeletCalls("ListPods", codes.Unavailable)+h.kubeletCalls("WatchPods", codes.Unavailable) > 0
	})
	for _, uid := range []types.UID{"uid-1", "uid-2"} {
		if _, ok := h.lookup.Get(uid); !ok {
			t.Errorf("Get(%s) while the kubelet is down: the cache lost the pod", uid)
		}
	}
	if !h.lookup.HasSynced() {
		t.Error("HasSynced false while the kubelet is down")
	}
	h.kubelet.mu.Lock()
	delete(h.kubelet.pods, "uid-1")
	h.kubelet.mu.Unlock()
	h.kubelet.setQuietly(t, testPod("3", ""))
	h.kubelet.serve(t, h.socket)
	eventually(t, "the restarted kubelet's pods", func() bool {
		_, has3 := h.lookup.Get("uid-3")
		_, has1 := h.lookup.Get("uid-1")
		return has3 && !has1 && h.wasDeleted("uid-1")
	})
	if _, ok := h.lookup.Get("uid-2"); !ok {
		t.Error("Get(uid-2) after the restart: not found")
	}
	if n := h.api.total(); n != 0 {
		t.Errorf("the API server got %d pod requests, want none", n)
	}
}

// stopKubelet stops the fake kubelet's server: serve's stop, kept per harness.
func (h *podsAPIHarness) stopKubelet(t *testing.T) {
	t.Helper()
	h.kubelet.mu.Lock()
	stop := h.kubelet.stop
	h.kubelet.mu.Unlock()
	stop()
}

// TestPodLookupPodsAPIFallback: a kubelet that stays away longer than the fallback delay (one
// that came back without the Pods API) leaves the pods to the API server; when its Pods API
// serves again, the pods come from it again.
func TestPodLookupPodsAPIFallback(t *testing.T) {
	if testing.Short() {
		t.Skip("waits out client-go's reflector backoff in real time (seconds): not in -short (make unit); make test runs it")
	}
	h := startPodsAPILookup(t, lookupSetup{
		serveKubelet: true, fallback: 100 * time.Millisecond, probe: 20 * time.Millisecond,
		kubeletPods: []*corev1.Pod{testPod("1", "")},
		apiPods:     []*corev1.Pod{testPod("1", ""), testPod("api", "")},
	})
	if h.source(t) != sourceKubelet {
		t.Fatalf("source %q, want %q", h.source(t), sourceKubelet)
	}
	h.stopKubelet(t)
	eventually(t, "the API server's pods once the kubelet stayed away", func() bool {
		_, ok := h.lookup.Get("uid-api")
		return ok
	})
	if got := h.source(t); got != sourceAPIServer {
		t.Errorf("podgate_kube_pod_source = %q, want %q", got, sourceAPIServer)
	}
	h.kubelet.serve(t, h.socket)
	eventually(t, "the kubelet's Pods API as the source again", func() bool {
		_, ok := h.lookup.Get("uid-api")
		return !ok && h.source(t) == sourceKubelet
	})
}

// TestPodLookupPodsAPIInitialising: a kubelet that initialises refuses its Pods API
// (FailedPrecondition). podgate waits for it, not for the API server, and GetOrFetch is
// Unavailable meanwhile, for the kubelet to retry.
func TestPodLookupPodsAPIInitialising(t *testing.T) {
	h := startPodsAPILookup(t, lookupSetup{serveKubelet: true, notReady: true, noSync: true, kubeletPods: []*corev1.Pod{testPod("1", "")}})
	eventually(t, "a refusal of the initialising kubelet", func() bool {
		return h.kubeletCalls("ListPods", codes.FailedPrecondition)+h.kubeletCalls("WatchPods", codes.FailedPrecondition) > 0
	})
	if _, err := h.lookup.GetOrFetch(t.Context(), "uid-1", "default", "pod-1"); !errdefs.IsUnavailable(err) {
		t.Errorf("GetOrFetch while the kubelet initialises: %v, want unavailable", err)
	}
	if h.lookup.HasSynced() {
		t.Error("synced while the kubelet refuses its Pods API")
	}
	h.kubelet.mu.Lock()
	h.kubelet.notReady = false
	h.kubelet.mu.Unlock()
	h.waitSync(t)
	if _, ok := h.lookup.Get("uid-1"); !ok {
		t.Error("Get(uid-1) after the kubelet is ready: not found")
	}
	if n := h.api.total(); n != 0 {
		t.Errorf("the API server got %d pod requests, want none", n)
	}
}

// TestPodsWatchDeletesWhatTheListHad: a watch that follows the reflector's list deletes, at
// INITIAL_SYNC_COMPLETE, the listed pods the kubelet no longer has (gone between the list and
// the watch), and goes on with the kubelet's events.
func TestPodsWatchDeletesWhatTheListHad(t *testing.T) {
	socket := filepath.Join(t.TempDir(), "pods-api.sock")
	k := newFakeKubelet(t, testPod("kept", ""))
	k.serve(t, socket)
	c, err := newKubeletPods(socket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.close() })
	gone := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "pod-gone", UID: "uid-gone"}}
	w, err := c.watch(t.Context(), watchMode{listed: []*corev1.Pod{gone, testPod("kept", "")}})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	next := func() watch.Event {
		t.Helper()
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				t.Fatal("watch ended")
			}
			return ev
		case <-time.After(kubeTimeout):
			t.Fatal("no event")
		}
		return watch.Event{}
	}
	for _, want := range []struct {
		typ watch.EventType
		uid types.UID
	}{{watch.Added, "uid-kept"}, {watch.Deleted, "uid-gone"}} {
		ev := next()
		if pod, ok := ev.Object.(*corev1.Pod); !ok || ev.Type != want.typ || pod.UID != want.uid {
			t.Fatalf("event %s %v, want %s of %s", ev.Type, ev.Object, want.typ, want.uid)
		}
	}
	k.set(t, testPod("new", ""))
	if ev := next(); ev.Type != watch.Added || ev.Object.(*corev1.Pod).UID != "uid-new" {
		t.Errorf("event after the sync %s %v, want Added of uid-new", ev.Type, ev.Object)
	}
}

// TestPodLookupPollDeleted: the Pods API's watch may not tell a deletion yet (the kubelet tells
// it with the pod's next status change); PollDeleted asks GetPod, which knows at once, and tells
// OnDeleted of a pod the kubelet no longer has and of one marked for deletion, not of one that
// lives. With the API server as the source it asks nothing.
func TestPodLookupPollDeleted(t *testing.T) {
	h := startPodsAPILookup(t, lookupSetup{
		serveKubelet: true,
		kubeletPods:  []*corev1.Pod{testPod("removed", ""), testPod("marked", ""), testPod("alive", "")},
	})
	// The kubelet's pod manager changes without a watch event, as the kubelet 1.37.2's does.
	h.kubelet.mu.Lock()
	delete(h.kubelet.pods, "uid-removed")
	h.kubelet.mu.Unlock()
	marked := testPod("marked", "")
	marked.DeletionTimestamp = &metav1.Time{Time: time.Now()}
	h.kubelet.setQuietly(t, marked)

	gets := h.kubelet.gets.Load()
	h.lookup.PollDeleted(t.Context(), []types.UID{"uid-removed", "uid-marked", "uid-alive"})
	if n := h.kubelet.gets.Load() - gets; n != 3 {
		t.Errorf("PollDeleted made %d GetPod calls, want 3", n)
	}
	for uid, want := range map[types.UID]bool{"uid-removed": true, "uid-marked": true, "uid-alive": false} {
		if got := h.wasDeleted(uid); got != want {
			t.Errorf("OnDeleted told of %s: %v, want %v", uid, got, want)
		}
	}
	if n := h.api.total(); n != 0 {
		t.Errorf("the API server got %d pod requests, want none", n)
	}

	api := startPodsAPILookup(t, lookupSetup{apiPods: []*corev1.Pod{testPod("a", "")}})
	gets = api.kubelet.gets.Load()
	api.lookup.PollDeleted(t.Context(), []types.UID{"uid-a"})
	if n := api.kubelet.gets.Load() - gets; n != 0 || api.wasDeleted("uid-a") {
		t.Errorf("with the API server as the source PollDeleted made %d GetPod calls (deleted: %v), want none", n, api.wasDeleted("uid-a"))
	}
}
