package kube

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// answerGets makes the API server answer each GET of a pod with answer(name), and counts the
// GETs. The informer only lists and watches, so the GETs are GetOrFetch's.
func answerGets(client *fake.Clientset, answer func(name string) (runtime.Object, error)) *atomic.Int32 {
	var gets atomic.Int32
	client.PrependReactor("get", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		gets.Add(1)
		obj, err := answer(a.(k8stesting.GetAction).GetName())
		return true, obj, err
	})
	return &gets
}

// podGets returns podgate_kube_requests_total{verb="get",resource="pods"} from reg, by code.
func podGets(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "podgate_kube_requests_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, lp := range m.GetLabel() {
				labels[lp.GetName()] = lp.GetValue()
			}
			if labels["verb"] == "get" && labels["resource"] == "pods" {
				got[labels["code"]] = m.GetCounter().GetValue()
			}
		}
	}
	return got
}

func onNode(pod *corev1.Pod, node string) *corev1.Pod {
	pod = pod.DeepCopy()
	pod.Spec.NodeName = node
	return pod
}

func TestGetOrFetch(t *testing.T) {
	pod := testPod("1", "")
	other := testPod("9", "")
	other.Name = pod.Name // the same name re-created: another UID
	tests := []struct {
		name      string
		cached    []runtime.Object
		answer    func(name string) (runtime.Object, error) // the API server's answer to a GET
		wantClass error                                     // errdefs class; nil: want the pod
		wantGets  map[string]float64                        // GETs by code
	}{
		{
			name:   "informer hit: no request",
			cached: []runtime.Object{pod},
			answer: func(string) (runtime.Object, error) { return nil, errors.New("must not be asked") },
		},
		{
			name:     "informer miss: one GET",
			answer:   func(string) (runtime.Object, error) { return pod, nil },
			wantGets: map[string]float64{"200": 1},
		},
		{
			name:      "UID mismatch",
			answer:    func(string) (runtime.Object, error) { return other, nil },
			wantClass: errdefs.ErrNotFound,
			wantGets:  map[string]float64{"200": 1},
		},
		{
			name:      "no such pod",
			answer:    func(n string) (runtime.Object, error) { return nil, apierrors.NewNotFound(corev1.Resource("pods"), n) },
			wantClass: errdefs.ErrNotFound,
			wantGets:  map[string]float64{"404": 1},
		},
		{
			name:      "bound to another node",
			answer:    func(string) (runtime.Object, error) { return onNode(pod, "node-b"), nil },
			wantClass: errdefs.ErrFailedPrecondition,
			wantGets:  map[string]float64{"200": 1},
		},
		{
			name:      "not scheduled",
			answer:    func(string) (runtime.Object, error) { return onNode(pod, ""), nil },
			wantClass: errdefs.ErrFailedPrecondition,
			wantGets:  map[string]float64{"200": 1},
		},
		{
			name:      "API server unavailable",
			answer:    func(string) (runtime.Object, error) { return nil, apierrors.NewServiceUnavailable("etcd down") },
			wantClass: errdefs.ErrUnavailable,
			wantGets:  map[string]float64{"503": 1},
		},
		{
			name: "API server unreachable",
			answer: func(string) (runtime.Object, error) {
				return nil, errors.New("dial tcp 127.0.0.1:6443: connect: connection refused")
			},
			wantClass: errdefs.ErrUnavailable,
			wantGets:  map[string]float64{kubeNoAnswer: 1},
		},
		{
			name: "podgate forbidden",
			answer: func(n string) (runtime.Object, error) {
				return nil, apierrors.NewForbidden(corev1.Resource("pods"), n, errors.New("RBAC"))
			},
			wantClass: errdefs.ErrUnavailable,
			wantGets:  map[string]float64{"403": 1},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			client, l, _ := startLookup(t, []PodLookupOption{WithMetrics(reg)}, tt.cached...)
			gets := answerGets(client, tt.answer)

			got, err := l.GetOrFetch(t.Context(), pod.UID, pod.Namespace, pod.Name)
			switch {
			case tt.wantClass == nil && err != nil:
				t.Fatalf("GetOrFetch: %v", err)
			case tt.wantClass == nil && (got == nil || got.UID != pod.UID):
				t.Errorf("GetOrFetch = %v, want pod %s", got, pod.UID)
			case tt.wantClass != nil && err == nil:
				t.Fatalf("GetOrFetch = pod %s, want an error of class %v", got.UID, tt.wantClass)
			case tt.wantClass != nil:
				if class := errdefs.Resolve(err); !errors.Is(class, tt.wantClass) {
					t.Errorf("GetOrFetch error %q has class %v, want %v", err, class, tt.wantClass)
				}
				if msg := err.Error(); !strings.Contains(msg, "default/pod-1") || !strings.Contains(msg, "uid-1") {
					t.Errorf("GetOrFetch error %q does not name pod default/pod-1 uid uid-1", msg)
				}
			}
			var want int32
			for _, n := range tt.wantGets {
				want += int32(n)
			}
			if n := gets.Load(); n != want {
				t.Errorf("GetOrFetch made %d GETs, want %d", n, want)
			}
			if m := podGets(t, reg); !equalCounts(m, tt.wantGets) {
				t.Errorf("podgate_kube_requests_total{verb=get,resource=pods} = %v, want %v", m, tt.wantGets)
			}
		})
	}
}

func equalCounts(got, want map[string]float64) bool {
	if len(got) != len(want) {
		return false
	}
	for k, v := range want {
		if got[k] != v {
			return false
		}
	}
	return true
}

// hangGets makes every GET of a pod hang until the test ends, as a client that does not honour
// its context would; entered receives once per GET.
func hangGets(t *testing.T, client *fake.Clientset) (entered <-chan struct{}) {
	t.Helper()
	hang := make(chan struct{})
	t.Cleanup(func() { close(hang) })
	in := make(chan struct{}, 10)
	answerGets(client, func(string) (runtime.Object, error) {
		in <- struct{}{}
		<-hang
		return nil, errors.New("test over")
	})
	return in
}

func TestGetOrFetchTimeout(t *testing.T) {
	const timeout = 50 * time.Millisecond
	client, l, _ := startLookup(t, []PodLookupOption{WithPodFetchTimeout(timeout)})
	hangGets(t, client)

	start := time.Now()
	_, err := l.GetOrFetch(t.Context(), "uid-1", "default", "pod-1")
	elapsed := time.Since(start)
	if err == nil {
		t.Fatal("GetOrFetch of a hanging GET returned a pod")
	}
	if class := errdefs.Resolve(err); !errors.Is(class, errdefs.ErrUnavailable) {
		t.Errorf("GetOrFetch of a hanging GET = %v (class %v), want Unavailable", err, class)
	}
	if !strings.Contains(err.Error(), "default/pod-1 uid uid-1") || !strings.Contains(err.Error(), timeout.String()) {
		t.Errorf("GetOrFetch error %q does not name the pod and the timeout", err)
	}
	if elapsed < timeout || elapsed > kubeTimeout {
		t.Errorf("GetOrFetch returned after %v, want the fetch timeout %v", elapsed, timeout)
	}
}

func TestGetOrFetchCallerGone(t *testing.T) {
	client, l, _ := startLookup(t, nil)
	entered := hangGets(t, client)

	ctx, cancel := context.WithCancel(t.Context())
	res := make(chan error, 1)
	go func() {
		_, err := l.GetOrFetch(ctx, "uid-1", "default", "pod-1")
		res <- err
	}()
	<-entered
	cancel()
	select {
	case err := <-res:
		if !errors.Is(errdefs.Resolve(err), context.Canceled) {
			t.Errorf("GetOrFetch after its caller left = %v, want context.Canceled", err)
		}
	case <-time.After(kubeTimeout):
		t.Fatal("GetOrFetch still waits after its caller left")
	}
}

// TestGetOrFetchBurst checks that the calls for one pod that come while its GET is in flight
// share it, and that the fetched pod is not cached: a later call asks again.
func TestGetOrFetchBurst(t *testing.T) {
	const callers = 8
	pod := testPod("1", "")
	reg := prometheus.NewRegistry()
	client, l, _ := startLookup(t, []PodLookupOption{WithMetrics(reg)})
	release := make(chan struct{})
	var once sync.Once
	t.Cleanup(func() { once.Do(func() { close(release) }) })
	gets := answerGets(client, func(string) (runtime.Object, error) {
		<-release
		return pod, nil
	})

	errs := make(chan error, callers)
	for range callers {
		go func() {
			got, err := l.GetOrFetch(t.Context(), pod.UID, pod.Namespace, pod.Name)
			if err == nil && got.UID != pod.UID {
				err = errors.New("another pod: " + string(got.UID))
			}
			errs <- err
		}()
	}
	key := podFetchKey{uid: pod.UID, namespace: pod.Namespace, name: pod.Name}
	if err := wait.PollUntilContextTimeout(t.Context(), time.Millisecond, kubeTimeout, true, func(context.Context) (bool, error) {
		return l.fetchCallers(key) == callers, nil
	}); err != nil {
		t.Fatalf("%d calls never shared one GET (%d do): %v", callers, l.fetchCallers(key), err)
	}
	once.Do(func() { close(release) })
	for range callers {
		if err := <-errs; err != nil {
			t.Errorf("GetOrFetch: %v", err)
		}
	}
	if n := gets.Load(); n != 1 {
		t.Errorf("%d calls made %d GETs, want 1", callers, n)
	}

	if _, err := l.GetOrFetch(t.Context(), pod.UID, pod.Namespace, pod.Name); err != nil {
		t.Fatalf("GetOrFetch after the burst: %v", err)
	}
	if m := podGets(t, reg); m["200"] != 2 {
		t.Errorf("podgate_kube_requests_total{code=200} = %v after the burst and one more call, want 2", m["200"])
	}
}
