package agent

// The DRA feature as the agent wires it: from the Kubernetes API, its stages in the pipeline,
// its runnables, the PodResources server that dra.prepare auto asks. How the feature itself
// behaves is dra/manager's and dra/attach's to test.

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	crifake "k8s.io/cri-client/pkg/fake"
	"k8s.io/klog/v2/ktesting"
	v1 "k8s.io/kubelet/pkg/apis/podresources/v1"
	"k8s.io/utils/ptr"

	"github.com/podgate/podgate/agent/config"
	"github.com/podgate/podgate/agent/kube/kubetest"
	"github.com/podgate/podgate/cri/pipeline"
	"github.com/podgate/podgate/dra/dratest"
	"github.com/podgate/podgate/dra/dratest/rig"
	"github.com/podgate/podgate/dra/manager"
	"github.com/podgate/podgate/test/kubefake"
	"github.com/podgate/podgate/test/otlpfake"
	"github.com/podgate/podgate/test/testfs"
)

// draDirs makes the plugin registry and plugin directories of a DRA test under dir and starts
// the fake driver in them; it returns the registry directory.
func draDirs(t *testing.T, dir string) (string, *dratest.Driver) {
	t.Helper()
	regDir, plugDir := filepath.Join(dir, "reg"), filepath.Join(dir, "plug")
	for _, d := range []string{regDir, plugDir} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return regDir, dratest.Start(t, regDir, plugDir, rig.Driver)
}

// stageNames are the names of the pipeline's stages, in order.
func stageNames(stages []pipeline.Stage) []string {
	var names []string
	for _, st := range stages {
		names = append(names, st.Name)
	}
	return names
}

// runnableNames are the names of the runnables, in order.
func runnableNames(list []runnable) []string {
	var names []string
	for _, r := range list {
		names = append(names, r.name)
	}
	return names
}

// TestAgentWithDRA runs the whole agent with DRA on — a fake API server, a fake driver in a real
// plugin registry directory, the fake runtime — through its own wiring (newKube, newDRA, the
// pipeline, the reconciler): the DRA stages are in the pipeline around the forward stage, its
// runnables run, and the pod's claim is prepared once, before the runtime creates the sandbox,
// and unprepared once after the sandbox is removed and the pod deleted.
func TestAgentWithDRA(t *testing.T) {
	dir := testfs.ShortDir(t)
	regDir, driver := draDirs(t, dir)
	var mu sync.Mutex
	var atRun []string
	f := crifake.NewFakeRemoteRuntime()
	backend := serveRuntime(t, dir, hookedRuntime{RemoteRuntime: f, onRun: func() {
		mu.Lock()
		defer mu.Unlock()
		atRun = driver.Calls()
	}})
	pod := rig.Pod("1", "net")
	client := fake.NewClientset(pod, rig.Claim("net", pod))

	cfg := testConfig(dir, backend)
	cfg.NodeName = rig.Node
	cfg.DRA.PluginRegistryDir = regDir
	a := runAgentWithAPI(t, cfg, client)
	waitGauge(t, a, "podgate_dra_drivers", 1)
	p := proxyOf(t, a)
	want := []string{"sysctl-check", "dra-prepare", "forward", "status", "sysctl-verify", "dra-attach", "pod-resources", "record"}
	if got := stageNames(p.pipeline.Stages()); !slices.Equal(got, want) {
		t.Errorf("stages with DRA on: %v, want %v", got, want)
	}
	for _, name := range []string{"dra drivers", "dra", "dra host interfaces"} {
		if got := runnableNames(a.runnables(p, nil)); !slices.Contains(got, name) {
			t.Errorf("runnables with DRA on: %v, want %q among them", got, name)
		}
	}

	ctx := t.Context()
	cri := criClient(t, cfg.CRISocket)
	resp, err := cri.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: &runtimeapi.PodSandboxConfig{
		Metadata: &runtimeapi.PodSandboxMetadata{Name: pod.Name, Namespace: pod.Namespace, Uid: string(pod.UID)},
	}})
	if err != nil {
		t.Fatalf("RunPodSandbox: %v", err)
	}
	mu.Lock()
	before := atRun
	mu.Unlock()
	if want := []string{"prepare default/net"}; !slices.Equal(before, want) {
		t.Errorf("driver calls when the runtime began the sandbox: %v, want %v", before, want)
	}

	if _, err := cri.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: resp.PodSandboxId}); err != nil {
		t.Fatal(err)
	}
	if _, err := cri.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: resp.PodSandboxId}); err != nil {
		t.Fatal(err)
	}
	if err := client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	calls := []string{"prepare default/net", "unprepare default/net"}
	if err := wait.PollUntilContextTimeout(ctx, 5*time.Millisecond, kubetest.Timeout, true, func(context.Context) (bool, error) {
		return len(driver.Calls()) >= len(calls), nil
	}); err != nil {
		t.Fatalf("driver calls %v: the claim was not unprepared: %v", driver.Calls(), err)
	}
	if got := driver.Calls(); !slices.Equal(got, calls) {
		t.Errorf("driver calls %v, want %v", got, calls)
	}
}

// TestDRAOffAddsNothing: without the Kubernetes API, DRA is off: no DRA stage in the pipeline,
// no DRA runnable.
func TestDRAOffAddsNothing(t *testing.T) {
	dir := testfs.ShortDir(t)
	_, backend := startFakeRuntime(t, dir)
	a := newAgent(t, testConfig(dir, backend))
	stop := runAgentOf(t, a)
	defer func() {
		if err := stop(); err != nil {
			t.Error(err)
		}
	}()
	p := proxyOf(t, a)
	want := []string{"sysctl-check", "forward", "status", "sysctl-verify", "pod-resources", "record"}
	if got := stageNames(p.pipeline.Stages()); !slices.Equal(got, want) {
		t.Errorf("stages with DRA off: %v, want %v", got, want)
	}
	if p.dra != nil {
		t.Errorf("DRA built without the Kubernetes API: %+v", p.dra)
	}
	for _, name := range runnableNames(a.runnables(p, nil)) {
		if strings.HasPrefix(name, "dra") || name == "kubernetes" || name == "node" || name == "pod events" {
			t.Errorf("runnable %q without the Kubernetes API", name)
		}
	}
}

// kubeletKnows is the kubelet's PodResources Get for the pods it manages: others are NotFound.
type kubeletKnows struct {
	v1.UnimplementedPodResourcesListerServer
	pods []string // namespace/name
}

func (k *kubeletKnows) Get(_ context.Context, req *v1.GetPodResourcesRequest) (*v1.GetPodResourcesResponse, error) {
	if !slices.Contains(k.pods, req.GetPodNamespace()+"/"+req.GetPodName()) {
		return nil, status.Errorf(codes.NotFound, "pod %s not found", req.GetPodName())
	}
	return &v1.GetPodResourcesResponse{PodResources: &v1.PodResources{Name: req.GetPodName(), Namespace: req.GetPodNamespace()}}, nil
}

// serveKubeletKnows serves a kubeletKnows on path until the test ends.
func serveKubeletKnows(t *testing.T, path string, pods ...string) {
	t.Helper()
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	v1.RegisterPodResourcesListerServer(s, &kubeletKnows{pods: pods})
	served := make(chan struct{})
	go func() { defer close(served); _ = s.Serve(l) }()
	t.Cleanup(func() { s.Stop(); <-served })
}

// TestAgentDRAAsksTheKubelet: with dra.prepare auto beside a kubelet 1.36 (its Node in the API
// server), the agent's DRA manager asks the kubelet through podgate's PodResources server,
// built before it: a kubelet that manages the pod prepared its claims (the driver sees no call
// from podgate); a kubelet that died and left its socket behind is asked once per pod start,
// refused at connect and not waited for (podgate prepares, before the sandbox). A Node the
// kubelet registers after podgate started is read by the pod start (or the start-up read,
// whichever comes first): the kubelet's version is agent's to hand the manager.
func TestAgentDRAAsksTheKubelet(t *testing.T) {
	for _, tc := range []struct {
		name     string
		kubelet  bool // the kubelet listens, managing the pods; else its socket is left behind
		late     bool // the Node is created once podgate runs
		preparer string
	}{
		{"the kubelet manages the pod", true, false, manager.PreparedByKubelet},
		{"the kubelet died", false, false, manager.PreparedByPodgate},
		{"the kubelet registered its Node after podgate started", true, true, manager.PreparedByKubelet},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := testfs.ShortDir(t)
			regDir, driver := draDirs(t, dir)
			backend := serveRuntime(t, dir, hookedRuntime{RemoteRuntime: crifake.NewFakeRemoteRuntime()})
			p1, p2 := rig.Pod("1", "net1"), rig.Pod("2", "net2")
			node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: rig.Node}, Status: corev1.NodeStatus{NodeInfo: corev1.NodeSystemInfo{KubeletVersion: "v1.36.3"}}}
			socket := filepath.Join(dir, "kubelet.sock")
			if tc.kubelet {
				serveKubeletKnows(t, socket, "default/"+p1.Name, "default/"+p2.Name)
			} else {
				l, err := net.ListenUnix("unix", &net.UnixAddr{Name: socket, Net: "unix"})
				if err != nil {
					t.Fatal(err)
				}
				l.SetUnlinkOnClose(false)
				l.Close() // the socket file stays, nobody listens
			}
			cfg := testConfig(dir, backend)
			cfg.NodeName = rig.Node
			cfg.DRA.PluginRegistryDir = regDir
			cfg.DRA.Prepare = config.PrepareAuto
			cfg.PodResources.KubeletSocket = &socket
			client := fake.NewClientset(p1, p2, rig.Claim("net1", p1), rig.Claim("net2", p2))
			var nodeGets atomic.Int32
			client.PrependReactor("get", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
				nodeGets.Add(1)
				return false, nil, nil // the tracker answers
			})
			if !tc.late {
				if err := client.Tracker().Add(node); err != nil {
					t.Fatal(err)
				}
			}
			a := runAgentWithAPI(t, cfg, client)
			waitGauge(t, a, "podgate_dra_drivers", 1)
			if tc.late {
				// The start-up read has found no Node: the kubelet's version is not known.
				if err := wait.PollUntilContextTimeout(t.Context(), 10*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
					return nodeGets.Load() > 0, nil
				}); err != nil {
					t.Fatalf("podgate never read the Node: %v", err)
				}
				if _, err := client.CoreV1().Nodes().Create(t.Context(), node, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			cri := criClient(t, cfg.CRISocket)
			for i, pod := range []*corev1.Pod{p1, p2} {
				if _, err := cri.RunPodSandbox(t.Context(), &runtimeapi.RunPodSandboxRequest{Config: &runtimeapi.PodSandboxConfig{
					Metadata: &runtimeapi.PodSandboxMetadata{Name: pod.Name, Namespace: pod.Namespace, Uid: string(pod.UID)},
				}}); err != nil {
					t.Fatalf("RunPodSandbox of pod %d: %v", i+1, err)
				}
				claim := types.UID("claim-" + pod.Spec.ResourceClaims[0].Name)
				if c, ok := proxyOf(t, a).state.Claims.Claim(claim); !ok || !c.Prepared || c.PreparedBy != tc.preparer {
					t.Errorf("pod %d: claim record %+v, want prepared by %s", i+1, c, tc.preparer)
				}
				if tc.kubelet {
					continue
				}
				if got := counterValue(t, a.registry, "podgate_podresources_kubelet_requests_total", "result", "not_listening"); got != float64(i+1) {
					t.Errorf("after pod %d: kubelet_requests_total{not_listening} = %v, want %d (one per pod start)", i+1, got, i+1)
				}
				if got := counterValue(t, a.registry, "podgate_podresources_kubelet_requests_total", "result", "unavailable"); got != 0 {
					t.Errorf("after pod %d: kubelet_requests_total{unavailable} = %v: podgate waited for a kubelet that is not there", i+1, got)
				}
			}
			want := []string{"prepare default/net1", "prepare default/net2"}
			if tc.preparer == manager.PreparedByKubelet {
				want = nil
			}
			if calls := driver.Calls(); !slices.Equal(calls, want) {
				t.Errorf("driver calls %v, want %v", calls, want)
			}
		})
	}
}

// TestDRAPrepareSpanPerDriver: with tracing on, a pod start's DRA prepare shows one span per
// driver, named with it, under the dra-prepare stage's span.
func TestDRAPrepareSpanPerDriver(t *testing.T) {
	collector := otlpfake.Start(t)
	dir := testfs.ShortDir(t)
	regDir, _ := draDirs(t, dir)
	backend := serveRuntime(t, dir, hookedRuntime{RemoteRuntime: crifake.NewFakeRemoteRuntime()})
	pod := rig.Pod("1", "net")
	cfg := testConfig(dir, backend)
	cfg.NodeName = rig.Node
	cfg.DRA.PluginRegistryDir = regDir
	cfg.DRA.Prepare = config.PrepareAlways
	cfg.Tracing = &config.Tracing{Endpoint: collector.Endpoint}
	cfg.SetDefaults()
	a := New(cfg, "test", WithKubernetesAPI(kubefake.Wrap(fake.NewClientset(pod, rig.Claim("net", pod)))))
	stop := runAgentOf(t, a)
	waitGauge(t, a, "podgate_kube_pod_informer_synced", 1)
	waitGauge(t, a, "podgate_dra_drivers", 1)
	ctx := metadata.AppendToOutgoingContext(t.Context(), "traceparent", "00-"+kubeletTrace+"-"+kubeletSpan+"-01")
	if _, err := criClient(t, cfg.CRISocket).RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: &runtimeapi.PodSandboxConfig{
		Metadata: &runtimeapi.PodSandboxMetadata{Name: pod.Name, Namespace: pod.Namespace, Uid: string(pod.UID)},
	}}); err != nil {
		t.Fatal(err)
	}
	if err := stop(); err != nil { // the shutdown exports the spans left
		t.Fatal(err)
	}
	spans := collector.Spans()
	stage := otlpfake.Find(spans, "podgate", "RunPodSandbox/dra-prepare")
	drivers := otlpfake.Find(spans, "podgate", "dra prepare")
	if len(stage) != 1 || len(drivers) != 1 || drivers[0].ParentID != stage[0].SpanID || drivers[0].Attributes["driver"] != rig.Driver {
		t.Errorf("dra-prepare stage spans %+v, driver spans %+v: want one span for %s under the stage's", stage, drivers, rig.Driver)
	}
}

// TestDRAAutoWithoutTheKubeletWarns: dra.prepare auto with podgate's PodResources socket off,
// or without the kubelet's socket to ask, warns at start-up that every claim is prepared by
// podgate, twice beside a kubelet that prepares, naming the key to set; otherwise it is quiet.
func TestDRAAutoWithoutTheKubeletWarns(t *testing.T) {
	for _, tt := range []struct {
		name                string
		prepare             string
		socket, kubeletSock string
		want                string // the key the warning names; "" no warning
	}{
		{name: "both sockets", prepare: config.PrepareAuto, socket: "/run/pg/pr.sock", kubeletSock: "/run/kubelet.sock"},
		{name: "podResources.socket off", prepare: config.PrepareAuto, socket: "", kubeletSock: "/run/kubelet.sock", want: "podResources.socket"},
		{name: "no kubelet socket", prepare: config.PrepareAuto, socket: "/run/pg/pr.sock", kubeletSock: "", want: "podResources.kubeletSocket"},
		{name: "always asks nobody", prepare: config.PrepareAlways, socket: ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := &config.Configuration{}
			cfg.DRA.Prepare = tt.prepare
			cfg.PodResources.Socket, cfg.PodResources.KubeletSocket = ptr.To(tt.socket), ptr.To(tt.kubeletSock)
			logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true)))
			warnAutoBlind(logger, cfg)
			logged := logger.GetSink().(ktesting.Underlier).GetBuffer().String()
			if tt.want == "" {
				if logged != "" {
					t.Errorf("logged %q, want nothing", logged)
				}
				return
			}
			for _, s := range []string{"dra.prepare auto", "prepared twice", "Set " + tt.want, "dra.prepare never"} {
				if !strings.Contains(logged, s) {
					t.Errorf("logged %q, want it to say %q", logged, s)
				}
			}
		})
	}
}

// TestPrepareMode: every dra.prepare the configuration accepts reaches the manager as itself.
func TestPrepareMode(t *testing.T) {
	for in, want := range map[string]manager.Prepare{
		config.PrepareAlways: manager.PrepareAlways,
		config.PrepareNever:  manager.PrepareNever,
		config.PrepareAuto:   manager.PrepareAuto,
	} {
		if got := prepareMode(in); got != want {
			t.Errorf("prepareMode(%q) = %v, want %v", in, got, want)
		}
	}
}
