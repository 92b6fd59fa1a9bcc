package podresources

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/time/rate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
	v1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/podgate/podgate/test/testfs"
)

// burstSize is the number of pods starting at once after a drain in issue 18's account, each
// asking PodResources during its CNI ADD.
const burstSize = 50

// Burst fixtures: the kubelet's own limit (pkg/kubelet/apis/podresources/constants.go).
const (
	kubeletQPS   = 100
	kubeletBurst = 10
)

// vfPods are burstSize pods the kubelet knows, each with one device-plugin VF, as the kubelet
// lists them: what podgate must never leave out of an answer.
func vfPods() []*v1.PodResources {
	var pods []*v1.PodResources
	for i := range burstSize {
		pods = append(pods, vfPod(i))
	}
	return pods
}

func vfPod(i int) *v1.PodResources {
	return &v1.PodResources{Name: fmt.Sprintf("p%02d", i), Namespace: "burst", Containers: []*v1.ContainerResources{{
		Name: "c", Devices: []*v1.ContainerDevices{{ResourceName: "example.com/vf", DeviceIds: []string{fmt.Sprintf("vf%02d", i)}}},
	}}}
}

// hasVF reports whether pr holds pod i's VF.
func hasVF(pr *v1.PodResources, i int) bool {
	want := fmt.Sprintf("vf%02d", i)
	return pr.GetNamespace() == "burst" && pr.GetName() == fmt.Sprintf("p%02d", i) && slices.ContainsFunc(pr.GetContainers(), func(c *v1.ContainerResources) bool {
		return slices.ContainsFunc(c.GetDevices(), func(d *v1.ContainerDevices) bool { return slices.Contains(d.GetDeviceIds(), want) })
	})
}

// burstRig is podgate with its defaults in front of a fake kubelet with the kubelet's token
// bucket, and one client connection per caller, as each CNI plugin process has its own.
func burstRig(t *testing.T, k *fakeKubelet) (*rig, []v1.PodResourcesListerClient) {
	t.Helper()
	dir := testfs.ShortDir(t)
	ksock := filepath.Join(dir, "kubelet.sock")
	serveKubelet(t, ksock, k, false)
	// The callers stand for a process each, but are one: the socket's connections are theirs.
	r := newRigIn(t, dir, Options{Source: &fakeSource{}, KubeletSocket: ksock,
		MaxConnectionsPerProcess: DefaultMaxConnections, MaxConnectionsPerUser: DefaultMaxConnections, MaxStreamsPerProcess: burstSize})
	clients := make([]v1.PodResourcesListerClient, burstSize)
	for i := range clients {
		clients[i] = v1.NewPodResourcesListerClient(dial(t, r.path))
	}
	return r, clients
}

// atOnce runs call for every client at the same moment and returns the errors.
func atOnce(clients []v1.PodResourcesListerClient, call func(i int, c v1.PodResourcesListerClient) error) []error {
	errs := make([]error, len(clients))
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i, c := range clients {
		wg.Go(func() {
			<-start
			errs[i] = call(i, c)
		})
	}
	close(start)
	wg.Wait()
	return errs
}

// TestBurstStaysWithinKubeletLimit: 50 v1 calls at once, with podgate's defaults, in front of a
// kubelet that refuses what is over its token bucket (100 QPS, burst 10). The kubelet refuses
// nothing and every caller gets every pod's VF: identical calls share the kubelet's calls, and
// Gets of 50 different pods, which cannot, wait for podgate's own bucket instead.
func TestBurstStaysWithinKubeletLimit(t *testing.T) {
	t.Run("List", func(t *testing.T) {
		k := &fakeKubelet{pods: vfPods(), limiter: rate.NewLimiter(kubeletQPS, kubeletBurst)}
		r, clients := burstRig(t, k)
		ctx := withDeadline(t, 10*time.Second) // multus's
		start := time.Now()
		errs := atOnce(clients, func(_ int, c v1.PodResourcesListerClient) error {
			resp, err := c.List(ctx, &v1.ListPodResourcesRequest{})
			if err != nil {
				return err
			}
			for i := range burstSize {
				if !slices.ContainsFunc(resp.GetPodResources(), func(pr *v1.PodResources) bool { return hasVF(pr, i) }) {
					return fmt.Errorf("answer lacks pod p%02d's VF: %v", i, resp)
				}
			}
			return nil
		})
		took := time.Since(start)
		checkCallers(t, errs)
		calls, refused := k.counts()
		coalesced := metricValue(t, r.metrics, "podgate_podresources_kubelet_coalesced_total", "method", "List")
		t.Logf("%d v1 List calls at once, answered in %s: the kubelet got %d List calls, refused %d; %v v1 calls shared another's",
			burstSize, took.Round(time.Millisecond), calls["List"], refused, coalesced)
		// Its bucket allows burst + qps × t calls in t seconds; on a busy machine the calls
		// arrive spread out, and share less.
		if allowed := kubeletBurst + int(kubeletQPS*took.Seconds()); refused != 0 || calls["List"] > allowed {
			t.Errorf("the kubelet got %d List calls in %s and refused %d; want at most what its bucket allows, %d, and none refused", calls["List"], took, refused, allowed)
		}
		if got := float64(calls["List"]) + coalesced; got != burstSize {
			t.Errorf("kubelet calls (%d) + v1 calls that shared one (%v) = %v, want %d: each v1 call makes a call or shares one", calls["List"], coalesced, got, burstSize)
		}
	})
	t.Run("Get of one pod each", func(t *testing.T) {
		k := &fakeKubelet{pods: vfPods(), limiter: rate.NewLimiter(kubeletQPS, kubeletBurst)}
		r, clients := burstRig(t, k)
		ctx := withDeadline(t, 10*time.Second)
		errs := atOnce(clients, func(i int, c v1.PodResourcesListerClient) error {
			resp, err := c.Get(ctx, &v1.GetPodResourcesRequest{PodNamespace: "burst", PodName: fmt.Sprintf("p%02d", i)})
			if err == nil && !hasVF(resp.GetPodResources(), i) {
				err = fmt.Errorf("answer lacks the pod's VF: %v", resp)
			}
			return err
		})
		checkCallers(t, errs)
		calls, refused := k.counts()
		t.Logf("%d v1 Get calls of different pods at once: the kubelet got %d Get calls, refused %d; waits for podgate's bucket: %v s in all",
			burstSize, calls["Get"], refused, histogramSum(t, r, "podgate_podresources_kubelet_throttle_seconds"))
		if refused != 0 || calls["Get"] != burstSize {
			t.Errorf("the kubelet got %d Get calls and refused %d; want one per pod, %d, and none refused", calls["Get"], refused, burstSize)
		}
	})
}

func checkCallers(t *testing.T, errs []error) {
	t.Helper()
	failed := 0
	for i, err := range errs {
		if err != nil {
			failed++
			if failed <= 3 {
				t.Errorf("caller %d: %v", i, err)
			}
		}
	}
	if failed > 0 {
		t.Errorf("%d of %d callers failed", failed, len(errs))
	}
}

// histogramSum is the sum of a histogram's observations.
func histogramSum(t *testing.T, r *rig, name string) float64 {
	t.Helper()
	mfs, err := r.metrics.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetHistogram().GetSampleSum()
		}
	}
	return 0
}

// pendingWaiters is the number of v1 calls waiting for the kubelet List call not sent yet.
func pendingWaiters(r *rig) int {
	g := r.server.kubelet.lists
	g.mu.Lock()
	defer g.mu.Unlock()
	if f := g.pending[struct{}{}]; f != nil {
		return f.waiters
	}
	return 0
}

// listAsync calls List in the background; the answer comes on the channel.
func listAsync(ctx context.Context, r *rig) <-chan *v1.ListPodResourcesResponse {
	ch := make(chan *v1.ListPodResourcesResponse, 1)
	go func() {
		resp, err := r.v1().List(ctx, &v1.ListPodResourcesRequest{})
		if err != nil {
			resp = &v1.ListPodResourcesResponse{PodResources: []*v1.PodResources{{Name: "error: " + err.Error()}}}
		}
		ch <- resp
	}()
	return ch
}

func names(resp *v1.ListPodResourcesResponse) []string {
	var out []string
	for _, pr := range resp.GetPodResources() {
		out = append(out, pr.GetName())
	}
	return out
}

// TestListAnswerIsFresh: a v1 List never gets an answer the kubelet made before the call
// arrived. A pod the kubelet admits while a List call is in flight is not in that call's
// answer; the v1 calls that arrive meanwhile wait for the next kubelet call, share it, and
// find the pod there.
func TestListAnswerIsFresh(t *testing.T) {
	k := &fakeKubelet{pods: []*v1.PodResources{vfPod(0)}, listing: make(chan struct{}, 1), hold: make(chan struct{})}
	r, _ := burstRig(t, k)
	r.server.kubelet.callTimeout = time.Minute // the calls are answered when the test says
	ctx := testContext(t)

	first := listAsync(ctx, r)
	<-k.listing // the kubelet's first List call has taken its answer: p00 alone
	k.setPods(vfPod(0), vfPod(1))
	second, third := listAsync(ctx, r), listAsync(ctx, r)
	eventually(t, "two v1 calls waiting for the next kubelet call", func() bool { return pendingWaiters(r) == 2 })

	k.hold <- struct{}{} // the first call answers
	if got := names(<-first); !slices.Equal(got, []string{"p00"}) {
		t.Errorf("first v1 List: %v, want [p00], the kubelet's state when it arrived", got)
	}
	<-k.listing // the second kubelet call, sent after the first ended, finds p01
	k.hold <- struct{}{}
	for i, ch := range []<-chan *v1.ListPodResourcesResponse{second, third} {
		if got := names(<-ch); !slices.Equal(got, []string{"p00", "p01"}) {
			t.Errorf("v1 List %d, arrived after p01 was admitted: %v, want [p00 p01]", i+2, got)
		}
	}
	if calls, _ := k.counts(); calls["List"] != 2 {
		t.Errorf("the kubelet got %d List calls, want 2", calls["List"])
	}
	if got := metricValue(t, r.metrics, "podgate_podresources_kubelet_coalesced_total", "method", "List"); got != 1 {
		t.Errorf("kubelet_coalesced_total{List} = %v, want 1 (the third call shared the second's)", got)
	}
}

// TestCallerLeavesCallNotSent: a v1 call that gives up while waiting behind the kubelet call in
// flight is answered Unavailable before its deadline, saying what it waited for, and the kubelet
// call it waited for, which nobody waits for any more, is never sent.
func TestCallerLeavesCallNotSent(t *testing.T) {
	k := &fakeKubelet{pods: []*v1.PodResources{vfPod(0)}, listing: make(chan struct{}, 1), hold: make(chan struct{})}
	r, _ := burstRig(t, k)
	// The first call is answered when the test says, however long the second waits.
	r.server.kubelet.callTimeout = time.Minute

	first := listAsync(testContext(t), r)
	<-k.listing
	_, err := r.v1().List(withDeadline(t, time.Second), &v1.ListPodResourcesRequest{})
	if st := status.Convert(err); st.Code() != codes.Unavailable || !strings.Contains(st.Message(), "waiting for the kubelet to answer the previous List") {
		t.Errorf("v1 List behind a kubelet call that does not end: %v; want Unavailable saying what it waited for", err)
	}
	if n := pendingWaiters(r); n != 0 {
		t.Errorf("%d v1 calls still wait for the next kubelet call, want none", n)
	}
	k.hold <- struct{}{}
	if got := names(<-first); !slices.Equal(got, []string{"p00"}) {
		t.Errorf("first v1 List: %v, want [p00]", got)
	}
	r.shutdown(t) // waits for every kubelet call podgate started
	if calls, _ := k.counts(); calls["List"] != 1 {
		t.Errorf("the kubelet got %d List calls, want 1: the call nobody waited for is not sent", calls["List"])
	}
	if got := metricValue(t, r.metrics, "podgate_podresources_kubelet_unavailable_total", "method", "List", "reason", "timeout"); got != 1 {
		t.Errorf("kubelet_unavailable_total{List,timeout} = %v, want 1", got)
	}
}

// TestKubeletRefusesThenAnswers: other clients have emptied the kubelet's bucket, so the
// kubelet refuses podgate's first calls. podgate tries again, later each time, and every caller
// still gets the kubelet's devices within its deadline.
func TestKubeletRefusesThenAnswers(t *testing.T) {
	const refuse = 3
	k := &fakeKubelet{pods: vfPods(), refuse: refuse}
	r, clients := burstRig(t, k)
	ctx := withDeadline(t, 10*time.Second)
	errs := atOnce(clients, func(_ int, c v1.PodResourcesListerClient) error {
		resp, err := c.List(ctx, &v1.ListPodResourcesRequest{})
		if err == nil && len(resp.GetPodResources()) != burstSize {
			err = fmt.Errorf("answer has %d pods, want %d", len(resp.GetPodResources()), burstSize)
		}
		return err
	})
	checkCallers(t, errs)
	calls, refused := k.counts()
	if refused != refuse || calls["List"] < 1 || calls["List"] > kubeletBurst {
		t.Errorf("the kubelet refused %d and answered %d List calls; want %d refused, then at least one and at most %d answered", refused, calls["List"], refuse, kubeletBurst)
	}
	if got := metricValue(t, r.metrics, "podgate_podresources_kubelet_requests_total", "method", "List", "result", "refused"); got != refuse {
		t.Errorf("kubelet_requests_total{List,refused} = %v, want %d", got, refuse)
	}
	if got := metricValue(t, r.metrics, "podgate_podresources_kubelet_up"); got != 1 {
		t.Errorf("kubelet_up = %v, want 1", got)
	}
}

// TestWaitWithoutDeadlineIsBounded: a caller without a deadline (grpcurl) waits for a kubelet
// that does not answer at most the client's maxWait, then gets Unavailable naming the socket and
// the kubelet's error, and podgate logs why.
func TestWaitWithoutDeadlineIsBounded(t *testing.T) {
	dir := testfs.ShortDir(t)
	ksock := filepath.Join(dir, "kubelet.sock")
	serveKubelet(t, ksock, &fakeKubelet{fail: status.Error(codes.Unavailable, "kubelet restarting")}, false)
	logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true)))
	r := newRigIn(t, dir, Options{Source: webSource(), KubeletSocket: ksock, Logger: logger})
	r.server.kubelet.maxWait = 300 * time.Millisecond

	ctx := klog.NewContext(context.WithoutCancel(testContext(t)), logger) // no deadline
	start := time.Now()
	_, err := r.v1().List(ctx, &v1.ListPodResourcesRequest{}, grpc.WaitForReady(true))
	took := time.Since(start)
	st := status.Convert(err)
	if st.Code() != codes.Unavailable || !strings.Contains(st.Message(), ksock) || !strings.Contains(st.Message(), "kubelet restarting") {
		t.Errorf("List: %v; want Unavailable naming %s and the kubelet's error", err, ksock)
	}
	if took < 300*time.Millisecond || took > 5*time.Second {
		t.Errorf("List answered after %s; want after maxWait, 300ms, and soon after", took)
	}
	logs := logger.GetSink().(ktesting.Underlier).GetBuffer().String()
	if !strings.Contains(logs, "Answering Unavailable") || !strings.Contains(logs, `method="List"`) || !strings.Contains(logs, "kubelet restarting") {
		t.Errorf("podgate's log lacks the Unavailable answer to List and why:\n%s", logs)
	}
}

// TestCloseEndsWaits: when podgate stops, a call waiting for a kubelet that does not answer
// ends at once, saying podgate is stopping.
func TestCloseEndsWaits(t *testing.T) {
	dir := testfs.ShortDir(t)
	ksock := filepath.Join(dir, "kubelet.sock")
	serveKubelet(t, ksock, &fakeKubelet{fail: status.Error(codes.Unavailable, "kubelet restarting")}, false)
	m := newMetrics(nil)
	client := newKubeletClient(ksock, m, DefaultKubeletQPS, DefaultKubeletBurst)
	done := make(chan error, 1)
	go func() {
		_, err := client.List(klog.NewContext(context.WithoutCancel(testContext(t)), klog.Background()))
		done <- err
	}()
	eventually(t, "a failed kubelet call", func() bool {
		client.mu.Lock()
		defer client.mu.Unlock()
		return client.failures > 0
	})
	if err := client.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, errKubeletClosed) {
			t.Errorf("List waiting when the client closed: %v, want %v", err, errKubeletClosed)
		}
	case <-testContext(t).Done():
		t.Fatal("List still waits after Close")
	}
}
