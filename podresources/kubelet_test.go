package podresources

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

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
		{Name: "sidecar", DynamicResources: []*v1.DynamicResource{drOf(netClaim())}},
		{Name: "app", DynamicResources: []*v1.DynamicResource{drOf(netClaim()), drOf(gpuClaim())}},
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
	return `# HELP podgate_podresources_kubelet_requests_total Calls podgate made to the kubelet's PodResources socket, by method and result (ok, not_found, unavailable, error).
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

func TestKubeletSocketMissing(t *testing.T) {
	dir := testfs.ShortDir(t)
	r := newRigIn(t, dir, Options{Source: webSource(), KubeletSocket: filepath.Join(dir, "absent.sock")})
	checkAnswers(t, r, podgateOnlyWeb(), &v1.AllocatableResourcesResponse{})
	compareMetrics(t, r.metrics, kubeletMetrics("unavailable", 0))
}

// TestKubeletAnswerErrors: a kubelet that answers with an error leaves podgate's part, and the
// error is counted by kind: over its rate limit is unavailable, anything else error.
func TestKubeletAnswerErrors(t *testing.T) {
	tests := []struct {
		name   string
		err    error
		result string
	}{
		{"rate limited", status.Error(codes.ResourceExhausted, "rejected by rate limit"), "unavailable"},
		{"unavailable", status.Error(codes.Unavailable, "restarting"), "unavailable"},
		{"internal", status.Error(codes.Internal, "broken"), "error"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRigWithKubelet(t, webSource(), &fakeKubelet{fail: tt.err})
			checkAnswers(t, r, podgateOnlyWeb(), &v1.AllocatableResourcesResponse{})
			compareMetrics(t, r.metrics, kubeletMetrics(tt.result, 0))
		})
	}
}

// TestKubeletStopsAndReturns: the kubelet stops (its socket removed, as on a clean exit, or left
// behind, as when it is killed); podgate answers with its own part, counts the kubelet
// unavailable and down, and merges the kubelet's part again once it is back.
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
			checkAnswers(t, r, podgateOnlyWeb(), &v1.AllocatableResourcesResponse{})
			for _, method := range []string{"List", "Get", "GetAllocatableResources"} {
				if got := metricValue(t, r.metrics, "podgate_podresources_kubelet_requests_total", "method", method, "result", "unavailable"); got != 1 {
					t.Errorf("kubelet_requests_total{%s,unavailable} = %v, want 1", method, got)
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
			ctx := testContext(t)
			eventually(t, "podgate merges the restarted kubelet's answer", func() bool {
				list, err := r.v1().List(ctx, &v1.ListPodResourcesRequest{})
				if err != nil {
					t.Fatalf("List: %v", err)
				}
				return len(list.GetPodResources()) == 1 && proto.Equal(list.GetPodResources()[0], mergedWebIn("shop"))
			})
			if got := metricValue(t, r.metrics, "podgate_podresources_kubelet_up"); got != 1 {
				t.Errorf("kubelet_up = %v once the kubelet answers again, want 1", got)
			}
			checkAnswers(t, r, mergedWebIn("shop"), webAllocatable)
		})
	}
}

// TestKubeletCallerGaveUp: when podgate's own caller gives up during the kubelet's call, the
// call says nothing of the kubelet: it is not counted and kubelet_up does not change.
func TestKubeletCallerGaveUp(t *testing.T) {
	dir := testfs.ShortDir(t)
	ksock := filepath.Join(dir, "kubelet.sock")
	k := &fakeKubelet{entered: make(chan struct{}, 1)}
	serveKubelet(t, ksock, k, false)
	reg := prometheus.NewRegistry()
	m := newMetrics(reg)
	m.kubeletUp.Set(1)
	client := newKubeletClient(ksock, m)
	t.Cleanup(func() { client.Close() })

	ctx, cancel := context.WithCancel(testContext(t))
	go func() {
		<-k.entered
		cancel()
	}()
	if _, err := client.List(ctx); status.Code(err) != codes.Canceled {
		t.Fatalf("List with a canceled caller: %v, want Canceled", err)
	}
	if n := gatherCount(t, reg, "podgate_podresources_kubelet_requests_total"); n != 0 {
		t.Errorf("kubelet_requests_total has %d series, want none", n)
	}
	if got := testutil.ToFloat64(m.kubeletUp); got != 1 {
		t.Errorf("kubelet_up = %v, want it unchanged (1)", got)
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
