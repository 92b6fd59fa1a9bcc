package podresources

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"
	v1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/podgate/podgate/test/testfs"
)

// webSource knows the web pod of namespace shop and its spec.
func webSource() *fakeSource {
	src := &fakeSource{specs: map[string][]Container{"uid-web": webSpec()}}
	src.set(1, webPod())
	return src
}

// podgateOnlyWeb is the v1 answer for the web pod without the kubelet: the spec's containers,
// the pod-level claim under both, the gpu claim under app, which names it.
func podgateOnlyWeb() *v1.PodResources {
	return &v1.PodResources{Name: "web", Namespace: "shop", Containers: []*v1.ContainerResources{
		{Name: "sidecar", DynamicResources: []*v1.DynamicResource{
			{ClaimName: "web-net", ClaimNamespace: "shop", ClaimResources: []*v1.ClaimResource{{
				DriverName: "net.example.com", PoolName: "node-a", DeviceName: "dev-web-net",
				CdiDevices: []*v1.CDIDevice{{Name: "net.example.com/nic=eth1"}},
			}}},
		}},
		// The pod-level web-net under the first container only.
		{Name: "app", DynamicResources: []*v1.DynamicResource{
			{ClaimName: "gpu-claim", ClaimNamespace: "shop", ClaimResources: []*v1.ClaimResource{{
				DriverName: "net.example.com", PoolName: "node-a", DeviceName: "dev-gpu-claim",
				CdiDevices: []*v1.CDIDevice{{Name: "gpu.example.com/gpu=0"}},
			}}},
		}},
	}}
}

var webAllocatable = &v1.AllocatableResourcesResponse{CpuIds: []int64{0, 1, 2, 3, 4, 5, 6}}

// checkAnswers calls List, Get and GetAllocatableResources, which must succeed with want (the
// web pod) and wantAlloc.
func checkAnswers(t *testing.T, r *rig, want *v1.PodResources, wantAlloc *v1.AllocatableResourcesResponse) {
	t.Helper()
	ctx := testContext(t)
	list, err := r.v1().List(ctx, &v1.ListPodResourcesRequest{})
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	if got := list.GetPodResources(); len(got) != 1 || !proto.Equal(got[0], want) {
		t.Errorf("List:\n got %s\nwant %s", prototext.Format(list), prototext.Format(want))
	}
	get, err := r.v1().Get(ctx, &v1.GetPodResourcesRequest{PodNamespace: "shop", PodName: "web"})
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	if !proto.Equal(get.GetPodResources(), want) {
		t.Errorf("Get:\n got %s\nwant %s", prototext.Format(get), prototext.Format(want))
	}
	alloc, err := r.v1().GetAllocatableResources(ctx, &v1.AllocatableResourcesRequest{})
	if err != nil {
		t.Fatalf("GetAllocatableResources: %v", err)
	}
	if !proto.Equal(alloc, wantAlloc) {
		t.Errorf("GetAllocatableResources:\n got %s\nwant %s", prototext.Format(alloc), prototext.Format(wantAlloc))
	}
}

// kubeletMetrics is the exposition of the kubelet metrics after one round of checkAnswers,
// every call with result.
func kubeletMetrics(result string, up int) string {
	return `# HELP podgate_podresources_kubelet_requests_total Calls podgate made to the kubelet's PodResources socket, by method and result (ok, not_found, refused: over the kubelet's rate limit, unavailable, not_listening: a socket nobody listens on, absent: no socket, error).
# TYPE podgate_podresources_kubelet_requests_total counter
podgate_podresources_kubelet_requests_total{method="Get",result="` + result + `"} 1
podgate_podresources_kubelet_requests_total{method="GetAllocatableResources",result="` + result + `"} 1
podgate_podresources_kubelet_requests_total{method="List",result="` + result + `"} 1
# HELP podgate_podresources_kubelet_up 1 when the last call to the kubelet's PodResources socket was answered, 0 when it was not.
# TYPE podgate_podresources_kubelet_up gauge
podgate_podresources_kubelet_up ` + string(rune('0'+up)) + "\n"
}

func compareMetrics(t *testing.T, reg *prometheus.Registry, want string) {
	t.Helper()
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want),
		"podgate_podresources_kubelet_requests_total", "podgate_podresources_kubelet_up"); err != nil {
		t.Error(err)
	}
}

// TestKubeletSocketMissing: without a kubelet socket there is no kubelet whose devices could be
// missing: podgate answers with its own part, counts the kubelet absent, and spends no time.
func TestKubeletSocketMissing(t *testing.T) {
	dir := testfs.ShortDir(t)
	r := newRigIn(t, dir, Options{Source: webSource(), KubeletSocket: filepath.Join(dir, "absent.sock")})
	checkAnswers(t, r, podgateOnlyWeb(), &v1.AllocatableResourcesResponse{})
	compareMetrics(t, r.metrics, kubeletMetrics("absent", 0))
}

// v1Calls are the three v1 calls, for tests that expect the same of each.
func v1Calls(r *rig) map[string]func(context.Context) error {
	return map[string]func(context.Context) error{
		"List": func(ctx context.Context) error {
			_, err := r.v1().List(ctx, &v1.ListPodResourcesRequest{})
			return err
		},
		"Get": func(ctx context.Context) error {
			_, err := r.v1().Get(ctx, &v1.GetPodResourcesRequest{PodNamespace: "shop", PodName: "web"})
			return err
		},
		"GetAllocatableResources": func(ctx context.Context) error {
			_, err := r.v1().GetAllocatableResources(ctx, &v1.AllocatableResourcesRequest{})
			return err
		},
	}
}

// withDeadline is the test's context bounded by d, as a CNI plugin bounds its call.
func withDeadline(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(testContext(t), d)
	t.Cleanup(cancel)
	return ctx
}

// TestKubeletFailureIsUnavailable: a kubelet that answers with an error leaves podgate without
// its part, so every v1 call fails Unavailable naming the kubelet's socket and its error, never
// an answer without the kubelet's devices. A failure that may pass (over the kubelet's rate
// limit, unavailable) is tried again until the caller's deadline is near; another fails at once.
func TestKubeletFailureIsUnavailable(t *testing.T) {
	tests := []struct {
		name   string
		err    error
		result string
		reason string
	}{
		{"rate limited", status.Error(codes.ResourceExhausted, "rejected by rate limit"), "refused", "timeout"},
		{"unavailable", status.Error(codes.Unavailable, "restarting"), "unavailable", "timeout"},
		{"internal", status.Error(codes.Internal, "broken"), "error", "error"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := testfs.ShortDir(t)
			ksock := filepath.Join(dir, "kubelet.sock")
			serveKubelet(t, ksock, &fakeKubelet{fail: tt.err}, false)
			r := newRigIn(t, dir, Options{Source: webSource(), KubeletSocket: ksock})
			tries := 0.0
			for method, call := range v1Calls(r) {
				err := call(withDeadline(t, time.Second))
				st := status.Convert(err)
				if st.Code() != codes.Unavailable || !strings.Contains(st.Message(), ksock) || !strings.Contains(st.Message(), status.Convert(tt.err).Message()) {
					t.Errorf("%s: %v; want Unavailable naming %s and the kubelet's error", method, err, ksock)
				}
				if got := metricValue(t, r.metrics, "podgate_podresources_kubelet_unavailable_total", "method", method, "reason", tt.reason); got != 1 {
					t.Errorf("%s: kubelet_unavailable_total{%s} = %v, want 1", method, tt.reason, got)
				}
				n := metricValue(t, r.metrics, "podgate_podresources_kubelet_requests_total", "method", method, "result", tt.result)
				if tt.reason == "error" && n != 1 {
					t.Errorf("%s: kubelet_requests_total{%s} = %v; a failure that does not pass is answered at once, after one try", method, tt.result, n)
				}
				tries += n
			}
			// The delay between tries grows with the failures in a row, whatever the method: the
			// first call is tried several times, the later ones perhaps once.
			if retried := tries > 3; retried != (tt.reason == "timeout") {
				t.Errorf("kubelet_requests_total{%s} = %v for 3 calls; want more than one try each only for a failure that may pass", tt.result, tries)
			}
			if got := metricValue(t, r.metrics, "podgate_podresources_kubelet_up"); got != boolFloat(tt.result == "refused") {
				t.Errorf("kubelet_up = %v; want 1 only for a kubelet that refuses (it answers)", got)
			}
		})
	}
}

// TestKubeletStopsAndReturns: the kubelet stops. With its socket removed, there is no kubelet:
// podgate answers with its own part. With its socket left behind, as when it is killed, the
// kubelet is down: v1 calls wait for it within their deadline, then fail Unavailable. Once the
// kubelet is back, podgate merges its part again, within the call that waits for it.
func TestKubeletStopsAndReturns(t *testing.T) {
	for _, keepSocket := range []bool{false, true} {
		name := "socket removed"
		if keepSocket {
			name = "stale socket left behind"
		}
		t.Run(name, func(t *testing.T) {
			dir := testfs.ShortDir(t)
			ksock := filepath.Join(dir, "kubelet.sock")
			k := &fakeKubelet{pods: []*v1.PodResources{kubeletWeb()}, allocatable: webAllocatable}
			kubelet := serveKubelet(t, ksock, k, keepSocket)
			r := newRigIn(t, dir, Options{Source: webSource(), KubeletSocket: ksock})

			checkAnswers(t, r, mergedWebIn("shop"), webAllocatable)
			compareMetrics(t, r.metrics, kubeletMetrics("ok", 1))

			kubelet.stop()
			if _, err := os.Stat(ksock); (err == nil) != keepSocket {
				t.Fatalf("after the kubelet stopped, stat %s: %v (want the socket kept: %v)", ksock, err, keepSocket)
			}
			if !keepSocket {
				checkAnswers(t, r, podgateOnlyWeb(), &v1.AllocatableResourcesResponse{})
				for _, method := range []string{"List", "Get", "GetAllocatableResources"} {
					if got := metricValue(t, r.metrics, "podgate_podresources_kubelet_requests_total", "method", method, "result", "absent"); got != 1 {
						t.Errorf("kubelet_requests_total{%s,absent} = %v, want 1", method, got)
					}
				}
			} else {
				for method, call := range v1Calls(r) {
					err := call(withDeadline(t, time.Second))
					if st := status.Convert(err); st.Code() != codes.Unavailable || !strings.Contains(st.Message(), ksock) {
						t.Errorf("%s with the kubelet down: %v, want Unavailable naming %s", method, err, ksock)
					}
				}
			}
			if got := metricValue(t, r.metrics, "podgate_podresources_kubelet_up"); got != 0 {
				t.Errorf("kubelet_up = %v after the kubelet stopped, want 0", got)
			}

			if keepSocket {
				if err := os.Remove(ksock); err != nil {
					t.Fatal(err)
				}
			}
			serveKubelet(t, ksock, k, false)
			checkAnswers(t, r, mergedWebIn("shop"), webAllocatable)
			if got := metricValue(t, r.metrics, "podgate_podresources_kubelet_up"); got != 1 {
				t.Errorf("kubelet_up = %v once the kubelet answers again, want 1", got)
			}
		})
	}
}

// TestKubeletCallerGaveUp: a caller that gives up while the kubelet's call is in flight gets
// its own Canceled at once; the call, sent, ends on its own and says how the kubelet is.
func TestKubeletCallerGaveUp(t *testing.T) {
	dir := testfs.ShortDir(t)
	ksock := filepath.Join(dir, "kubelet.sock")
	k := &fakeKubelet{pods: []*v1.PodResources{kubeletWeb()}, listing: make(chan struct{}, 1), hold: make(chan struct{})}
	serveKubelet(t, ksock, k, false)
	r := newRigIn(t, dir, Options{Source: webSource(), KubeletSocket: ksock})

	ctx, cancel := context.WithCancel(testContext(t))
	go func() {
		<-k.listing
		cancel()
	}()
	if _, err := r.v1().List(ctx, &v1.ListPodResourcesRequest{}); status.Code(err) != codes.Canceled {
		t.Fatalf("List with a canceled caller: %v, want Canceled", err)
	}
	close(k.hold)
	eventually(t, "the kubelet's call, sent before the caller gave up, is answered", func() bool {
		return metricValue(t, r.metrics, "podgate_podresources_kubelet_requests_total", "method", "List", "result", "ok") == 1
	})
	if got := gatherCount(t, r.metrics, "podgate_podresources_kubelet_unavailable_total"); got != 0 {
		t.Errorf("kubelet_unavailable_total has %d series; a caller that gave up is not answered Unavailable", got)
	}
	if got := metricValue(t, r.metrics, "podgate_podresources_kubelet_up"); got != 1 {
		t.Errorf("kubelet_up = %v, want 1", got)
	}
}

// TestKubeletGetNotFound: the kubelet's answer for a pod it does not know (an error without a
// code saying "not found", or NotFound) is not_found, not a failure.
func TestKubeletGetNotFound(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want bool
	}{
		{"the kubelet's own error", status.Error(codes.Unknown, "pod web in namespace shop not found"), true},
		{"NotFound", status.Error(codes.NotFound, "no such pod"), true},
		{"Unknown, another message", status.Error(codes.Unknown, "boom"), false},
		{"Internal saying not found", status.Error(codes.Internal, "state not found"), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := isKubeletNotFound(tt.err); got != tt.want {
				t.Errorf("isKubeletNotFound(%v) = %v, want %v", tt.err, got, tt.want)
			}
		})
	}
}

// TestKubeletKnowsPodWithoutAKubelet: KubeletKnowsPod (the DRA decision) does not wait for a
// kubelet that is not there. A socket nobody listens on, as a killed kubelet leaves it, ends it
// at once: one call refused at connect, counted not_listening, never tried again within the
// wait; the next asks nothing while nobody listens. A kubelet that is there but over its rate
// limit is waited for, and its answer taken.
func TestKubeletKnowsPodWithoutAKubelet(t *testing.T) {
	t.Run("stale socket", func(t *testing.T) {
		dir := testfs.ShortDir(t)
		ksock := filepath.Join(dir, "kubelet.sock")
		l, err := net.ListenUnix("unix", &net.UnixAddr{Name: ksock, Net: "unix"})
		if err != nil {
			t.Fatal(err)
		}
		l.SetUnlinkOnClose(false)
		l.Close() // the socket file stays, nobody listens: a killed kubelet's
		r := newRigIn(t, dir, Options{Source: webSource(), KubeletSocket: ksock})
		for i := 1; i <= 2; i++ {
			known, err := r.server.KubeletKnowsPod(testContext(t), "shop", "web")
			if known || !IsKubeletNotListening(err) || !strings.Contains(err.Error(), ksock) {
				t.Fatalf("KubeletKnowsPod %d with nobody listening: %v, %v; want not listening, naming %s", i, known, err, ksock)
			}
			if got := metricValue(t, r.metrics, "podgate_podresources_kubelet_requests_total", "method", "Get", "result", "not_listening"); got != float64(i) {
				t.Errorf("after KubeletKnowsPod %d: kubelet_requests_total{Get,not_listening} = %v, want %d", i, got, i)
			}
			if got := metricValue(t, r.metrics, "podgate_podresources_kubelet_requests_total", "method", "Get", "result", "unavailable"); got != 0 {
				t.Errorf("after KubeletKnowsPod %d: kubelet_requests_total{Get,unavailable} = %v: it waited for a kubelet that is not there", i, got)
			}
		}
	})
	t.Run("kubelet over its rate limit", func(t *testing.T) {
		dir := testfs.ShortDir(t)
		ksock := filepath.Join(dir, "kubelet.sock")
		k := &fakeKubelet{pods: []*v1.PodResources{kubeletWeb()}, refuse: 2}
		serveKubelet(t, ksock, k, false)
		r := newRigIn(t, dir, Options{Source: webSource(), KubeletSocket: ksock})
		known, err := r.server.KubeletKnowsPod(testContext(t), "shop", "web")
		if !known || err != nil {
			t.Fatalf("KubeletKnowsPod: %v, %v; want the kubelet's answer after its refusals", known, err)
		}
		if calls, refused := k.counts(); refused != 2 || calls["Get"] != 1 {
			t.Errorf("the kubelet refused %d calls and answered %v; want 2 refused, then one Get", refused, calls)
		}
	})
}
