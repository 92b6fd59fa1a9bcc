//go:build linux

package cluster_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2/ktesting"
	v1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/podgate/podgate/test/cluster"
	"github.com/podgate/podgate/test/scrape"
	"github.com/podgate/podgate/test/testfs"
)

// The kubelet 1.36's limit on its PodResources socket (pkg/kubelet/apis/podresources/
// constants.go, not configurable): a token bucket of 100 QPS with a burst of 10 over every call
// of every client; a call over it is ResourceExhausted, "rejected by rate limit".
const (
	kubeletPodResourcesQPS   = 100
	kubeletPodResourcesBurst = 10
)

// burstCallers is the number of v1 List calls at once: the pods of a drained node starting
// together, each CNI ADD asking (issue 18).
const burstCallers = 50

// vfResource is the test device plugin's extended resource, an SR-IOV plugin's VFs stand-in.
const vfResource = "podgate.test/vf"

// countingProxy stands between podgate and the kubelet's PodResources socket and counts what the
// kubelet is asked and how it answers, refusals over its rate limit included, which the
// kubelet's own metric does not count.
type countingProxy struct {
	socket  string
	kubelet v1.PodResourcesListerClient

	mu    sync.Mutex
	calls []proxiedCall
}

// proxiedCall is one call the kubelet received.
type proxiedCall struct {
	method string
	code   codes.Code
	at     time.Time
}

// startCountingProxy serves on a new socket a v1.PodResourcesLister that forwards each call to
// the kubelet's socket.
func startCountingProxy(t *testing.T, kubeletSocket string) *countingProxy {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+kubeletSocket, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(16<<20)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	p := &countingProxy{socket: filepath.Join(testfs.ShortDir(t), "kubelet-proxy.sock"), kubelet: v1.NewPodResourcesListerClient(conn)}
	l, err := net.Listen("unix", p.socket)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.MaxSendMsgSize(16<<20), grpc.UnaryInterceptor(p.count))
	v1.RegisterPodResourcesListerServer(srv, &forwarder{kubelet: p.kubelet})
	done := make(chan error, 1)
	go func() { done <- srv.Serve(l) }()
	t.Cleanup(func() {
		srv.Stop()
		if err := <-done; err != nil {
			t.Errorf("counting proxy: Serve: %v", err)
		}
	})
	return p
}

func (p *countingProxy) count(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	at := time.Now()
	resp, err := handler(ctx, req)
	p.mu.Lock()
	p.calls = append(p.calls, proxiedCall{method: filepath.Base(info.FullMethod), code: status.Code(err), at: at})
	p.mu.Unlock()
	return resp, err
}

// since returns the calls made from start on.
func (p *countingProxy) since(start time.Time) []proxiedCall {
	p.mu.Lock()
	defer p.mu.Unlock()
	i := slices.IndexFunc(p.calls, func(c proxiedCall) bool { return !c.at.Before(start) })
	if i < 0 {
		return nil
	}
	return slices.Clone(p.calls[i:])
}

// forwarder passes each v1 call to the kubelet, answer or error as it is.
type forwarder struct {
	v1.UnimplementedPodResourcesListerServer
	kubelet v1.PodResourcesListerClient
}

func (f *forwarder) List(ctx context.Context, req *v1.ListPodResourcesRequest) (*v1.ListPodResourcesResponse, error) {
	return f.kubelet.List(ctx, req)
}

func (f *forwarder) Get(ctx context.Context, req *v1.GetPodResourcesRequest) (*v1.GetPodResourcesResponse, error) {
	return f.kubelet.Get(ctx, req)
}

func (f *forwarder) GetAllocatableResources(ctx context.Context, req *v1.AllocatableResourcesRequest) (*v1.AllocatableResourcesResponse, error) {
	return f.kubelet.GetAllocatableResources(ctx, req)
}

// TestPodResourcesBurst: 50 v1 List calls at once on podgate's PodResources socket, with the
// real kubelet's socket behind and pods holding devices of a real device plugin registered with
// the kubelet. Counted by a proxy in front of the kubelet's socket and by the kubelet's own
// metric: the kubelet is asked within its limit and refuses nothing, and every caller gets every
// pod's devices as the kubelet reports them. Then a pod starts, and a burst made once the
// kubelet lists its device finds it in every answer: no answer older than its call.
func TestPodResourcesBurst(t *testing.T) {
	n := startNode(t)
	_, ctx := ktesting.NewTestContext(t)
	c := n.cluster
	proxy := startCountingProxy(t, c.PodResourcesSocket())
	// The burst's callers stand for 50 CNI plugin processes but are this one: the socket's
	// connections and calls are theirs, not one process's quarter.
	restartPodgateWith(t, n, fmt.Sprintf("podResources:\n  kubeletSocket: %s\n  maxConnectionsPerProcess: 64\n  maxConnectionsPerUser: 64\n  maxStreamsPerProcess: 64\n", proxy.socket))

	plugin := startDevicePlugin(t, c.PluginRegistryDir(), vfResource, []string{"vf0", "vf1", "vf2", "vf3", "vf4", "vf5", "vf6", "vf7"})
	regCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := plugin.waitRegistered(regCtx); err != nil {
		t.Fatal(err)
	}
	// The kubelet admits a pod asking for the resource only once its Node shows it.
	waitFor(t, time.Minute, "the node's allocatable "+vfResource, func() (bool, error) {
		node, err := c.Client().CoreV1().Nodes().Get(ctx, c.NodeName(), metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		q := node.Status.Allocatable[vfResource]
		return q.Value() == 8, nil
	})

	var pods []string
	for i := range 3 {
		pods = append(pods, startVFPod(t, c, fmt.Sprintf("vf-%d", i)))
	}
	want := kubeletDevices(t, c, pods)
	t.Logf("the kubelet's devices: %v", want)

	burstCounted(t, n, proxy, want)

	// A pod starts: once the kubelet's own List shows its device, every v1 List that starts
	// later must show it too.
	pods = append(pods, startVFPod(t, c, "vf-late"))
	want = kubeletDevices(t, c, pods)
	burstCounted(t, n, proxy, want)
	t.Logf("devices allocated by the plugin: %v", plugin.allocatedDevices())
}

// burstCounted is burst, with the kubelet's own count of the calls it served checked against the
// proxy's: the proxy sees every call podgate makes, and nothing else calls the kubelet meanwhile.
func burstCounted(t *testing.T, n *node, proxy *countingProxy, want map[string][]string) {
	t.Helper()
	before := kubeletPodResourcesRequests(t, n.cluster)
	served := burst(t, n, proxy, want)
	after := kubeletPodResourcesRequests(t, n.cluster)
	if before < 0 || after < 0 {
		return // logged: the kubelet's metrics could not be read
	}
	t.Logf("the kubelet's own count, kubelet_pod_resources_endpoint_requests_total{server_api_version=\"v1\"}: %v more", after-before)
	if after-before != float64(served) {
		t.Errorf("the kubelet counted %v calls served, the proxy %d", after-before, served)
	}
}

// burst makes burstCallers v1 List calls at once on podgate's socket, each on its own
// connection as CNI plugins do, with multus's 10 s deadline, and checks every answer holds
// the devices want (pod → devices) and that the kubelet was asked within its limit. It returns
// the number of calls the kubelet served.
func burst(t *testing.T, n *node, proxy *countingProxy, want map[string][]string) (served int) {
	t.Helper()
	clients := make([]v1.PodResourcesListerClient, burstCallers)
	for i := range clients {
		conn, err := grpc.NewClient("unix://"+n.podgate.PodResourcesSocket, grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(16<<20)))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		clients[i] = v1.NewPodResourcesListerClient(conn)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	errs := make([]error, burstCallers)
	ready := make(chan struct{})
	var wg sync.WaitGroup
	for i, client := range clients {
		wg.Go(func() {
			<-ready
			resp, err := client.List(ctx, &v1.ListPodResourcesRequest{})
			if err == nil {
				err = hasDevices(resp, want)
			}
			errs[i] = err
		})
	}
	start := time.Now()
	close(ready)
	wg.Wait()
	took := time.Since(start)

	failed := 0
	for i, err := range errs {
		if err != nil {
			if failed++; failed <= 3 {
				t.Errorf("caller %d: %v", i, err)
			}
		}
	}
	calls := proxy.since(start)
	refused := 0
	for _, c := range calls {
		if c.code == codes.ResourceExhausted {
			refused++
		}
	}
	allowed := kubeletPodResourcesBurst + int(kubeletPodResourcesQPS*took.Seconds())
	t.Logf("%d v1 List calls at once on podgate's socket, answered in %s: %d failed; the kubelet got %d calls (its bucket allows %d in that time), refused %d",
		burstCallers, took.Round(time.Millisecond), failed, len(calls), allowed, refused)
	if failed > 0 {
		t.Errorf("%d of %d callers did not get the kubelet's devices", failed, burstCallers)
	}
	if refused > 0 || len(calls) > allowed {
		t.Errorf("the kubelet got %d calls in %s and refused %d; want at most %d, none refused", len(calls), took, refused, allowed)
	}
	return len(calls) - refused
}

// hasDevices checks that the answer lists, for each pod of want, its devices.
func hasDevices(resp *v1.ListPodResourcesResponse, want map[string][]string) error {
	got := devicesOf(resp.GetPodResources())
	for pod, ids := range want {
		if !slices.Equal(got[pod], ids) {
			return fmt.Errorf("pod %s: devices %v, want the kubelet's %v", pod, got[pod], ids)
		}
	}
	return nil
}

// devicesOf is the device IDs of vfResource per pod (namespace/name), sorted.
func devicesOf(prs []*v1.PodResources) map[string][]string {
	out := map[string][]string{}
	for _, pr := range prs {
		for _, c := range pr.GetContainers() {
			for _, d := range c.GetDevices() {
				if d.GetResourceName() == vfResource {
					key := pr.GetNamespace() + "/" + pr.GetName()
					out[key] = append(out[key], d.GetDeviceIds()...)
				}
			}
		}
	}
	for _, ids := range out {
		slices.Sort(ids)
	}
	return out
}

// kubeletDevices waits until the kubelet's own List shows a device for each pod, and returns
// them.
func kubeletDevices(t testing.TB, c *cluster.Cluster, pods []string) map[string][]string {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+c.PodResourcesSocket(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var got map[string][]string
	waitFor(t, time.Minute, "the kubelet listing the pods' devices", func() (bool, error) {
		resp, err := v1.NewPodResourcesListerClient(conn).List(t.Context(), &v1.ListPodResourcesRequest{})
		if err != nil {
			return false, err
		}
		got = devicesOf(resp.GetPodResources())
		for _, p := range pods {
			if len(got[p]) != 1 {
				return false, fmt.Errorf("pod %s: devices %v", p, got[p])
			}
		}
		return true, nil
	})
	out := map[string][]string{}
	for _, p := range pods {
		out[p] = got[p]
	}
	return out
}

// startVFPod runs a busybox pod asking for one device of vfResource and returns its
// namespace/name once it runs.
func startVFPod(t *testing.T, c *cluster.Cluster, name string) string {
	t.Helper()
	pod := testPod(name, c.NodeName())
	vf := corev1.ResourceList{vfResource: resource.MustParse("1")}
	pod.Spec.Containers[0].Resources = corev1.ResourceRequirements{Requests: vf, Limits: vf}
	if _, err := c.Client().CoreV1().Pods(pod.Namespace).Create(t.Context(), pod, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create pod %s: %v", name, err)
	}
	waitPod(t, c, pod.Namespace, pod.Name, func(p *corev1.Pod) bool {
		if p.Status.Phase == corev1.PodFailed {
			t.Fatalf("pod %s failed: %s %s", name, p.Status.Reason, p.Status.Message)
		}
		return p.Status.Phase == corev1.PodRunning
	})
	return pod.Namespace + "/" + pod.Name
}

// restartPodgateWith restarts the node's podgate with more configuration appended to its
// configuration file.
func restartPodgateWith(t testing.TB, n *node, more string) {
	t.Helper()
	i := slices.Index(n.podgateOpts.Args, "--config")
	if i < 0 || i+1 >= len(n.podgateOpts.Args) {
		t.Fatalf("podgate's arguments %v name no configuration file", n.podgateOpts.Args)
	}
	f, err := os.OpenFile(n.podgateOpts.Args[i+1], os.O_APPEND|os.O_WRONLY, 0)
	if err == nil {
		_, err = io.WriteString(f, more)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	if code, err := n.podgate.Stop(30 * time.Second); err != nil || code != 0 {
		t.Fatalf("podgate stop: exit %d, %v", code, err)
	}
	n.startPodgate(t)
}

// kubeletPodResourcesRequests reads the kubelet's own count of the PodResources v1 calls it
// served, kubelet_pod_resources_endpoint_requests_total, from its /metrics on loopback with the
// cluster's admin token; -1 when it cannot.
func kubeletPodResourcesRequests(t *testing.T, c *cluster.Cluster) float64 {
	t.Helper()
	node, err := c.Client().CoreV1().Nodes().Get(t.Context(), c.NodeName(), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	port := node.Status.DaemonEndpoints.KubeletEndpoint.Port
	// The kubelet's serving certificate is self-signed; the address is the loopback its
	// configuration binds.
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // loopback, self-signed
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, fmt.Sprintf("https://127.0.0.1:%d/metrics", port), nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+c.RESTConfig().BearerToken)
	resp, err := client.Do(req)
	if err != nil {
		t.Logf("the kubelet's metrics: %v", err)
		return -1
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Logf("the kubelet's metrics: %s, %v: %.200s", resp.Status, err, body)
		return -1
	}
	m, err := scrape.Parse(string(body))
	if err != nil {
		t.Logf("the kubelet's metrics: %v", err)
		return -1
	}
	v, _ := m.Value("kubelet_pod_resources_endpoint_requests_total", "server_api_version", "v1")
	return v
}
