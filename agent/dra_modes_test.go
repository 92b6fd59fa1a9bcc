package agent

import (
	"context"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2/ktesting"
	v1 "k8s.io/kubelet/pkg/apis/podresources/v1"
	"k8s.io/utils/ptr"

	"github.com/podgate/podgate/agent/config"
	"github.com/podgate/podgate/dra"
	"github.com/podgate/podgate/dra/manager"
	"github.com/podgate/podgate/podresources"
	"github.com/podgate/podgate/test/kubefake"
)

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

// serveKubeletKnows serves a kubeletKnows on dir/kubelet.sock until the test ends.
func serveKubeletKnows(t *testing.T, dir string, pods ...string) string {
	t.Helper()
	path := filepath.Join(dir, "kubelet.sock")
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	v1.RegisterPodResourcesListerServer(s, &kubeletKnows{pods: pods})
	served := make(chan struct{})
	go func() { defer close(served); _ = s.Serve(l) }()
	t.Cleanup(func() { s.Stop(); <-served })
	return path
}

// TestDRAPrepareModes: dra.prepare decides who prepares a pod's claims. Beside a kubelet that
// prepares (auto with a kubelet ≥ 1.34 that manages the pod, or never) the driver sees no call
// from podgate, which still records the claim's devices from its allocation (for attach,
// network data and PodResources) and never unprepares it; otherwise podgate prepares before
// the sandbox, as always.
func TestDRAPrepareModes(t *testing.T) {
	for _, tt := range []struct {
		name    string
		mode    string
		kubelet string // version on the Node read at start-up; "" not read
		node    string // version on the Node in the API server now; "" no Node
		knows   bool   // the kubelet's PodResources knows the pod
		socket  bool   // a kubelet socket is there
		by      string
	}{
		{"always", config.PrepareAlways, "v1.36.3", "", true, true, manager.PreparedByPodgate},
		{"never", config.PrepareNever, "", "", false, false, manager.PreparedByKubelet},
		{"auto: kubelet 1.36 manages the pod", config.PrepareAuto, "v1.36.3", "", true, true, manager.PreparedByKubelet},
		{"auto: kubelet does not know the pod (another CRI client)", config.PrepareAuto, "v1.36.3", "", false, true, manager.PreparedByPodgate},
		{"auto: kubelet stopped", config.PrepareAuto, "v1.36.3", "", true, false, manager.PreparedByPodgate},
		{"auto: kubelet 1.33", config.PrepareAuto, "v1.33.5", "", true, true, manager.PreparedByPodgate},
		{"auto: kubelet version not known, no Node", config.PrepareAuto, "", "", true, true, manager.PreparedByPodgate},
		// podgate started before the kubelet registered the Node: the pod start reads it.
		{"auto: kubelet version not read yet, the Node says 1.36", config.PrepareAuto, "", "v1.36.3", true, true, manager.PreparedByKubelet},
	} {
		t.Run(tt.name, func(t *testing.T) {
			pod := draPod("1", "net")
			// The driver's slice names the device's host interface: its network data.
			slice := &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: "net-slice"}, Spec: resourceapi.ResourceSliceSpec{
				Driver: testDriver, NodeName: ptr.To("node-a"), Pool: resourceapi.ResourcePool{Name: "pool", Generation: 1, ResourceSliceCount: 1},
				Devices: []resourceapi.Device{{Name: "dev-net", Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
					dra.DefaultInterfaceNameAttribute: {StringValue: ptr.To("eth7")},
				}}},
			}}
			dr := newDRARigWith(t, 5*time.Second, draOptions{manager: func(dr *draRig) []manager.Option {
				dr.hostIfs = dra.NewHostInterfaces(kubefake.Wrap(dr.kube), "node-a", "")
				return []manager.Option{manager.WithPrepare(tt.mode), manager.WithHostInterfaces(dr.hostIfs)}
			}}, pod, draClaim("net", pod), slice)
			hostIfsDone := make(chan struct{})
			go func() {
				defer close(hostIfsDone)
				dr.hostIfs.Run(t.Context())
			}()
			t.Cleanup(func() { <-hostIfsDone })
			if tt.kubelet != "" {
				setKubeletVersion(t, dr.dra, tt.kubelet)
			}
			if tt.node != "" {
				node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}, Status: corev1.NodeStatus{NodeInfo: corev1.NodeSystemInfo{KubeletVersion: tt.node}}}
				if _, err := dr.kube.CoreV1().Nodes().Create(t.Context(), node, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			socket := filepath.Join(dr.dir, "kubelet.sock")
			if tt.socket {
				var known []string
				if tt.knows {
					known = []string{pod.Namespace + "/" + pod.Name}
				}
				socket = serveKubeletKnows(t, dr.dir, known...)
			}
			pr, err := podresources.NewServer(podresources.Options{Source: &podResourcesSource{registry: dr.registry, claims: dr.claimStore}, KubeletSocket: socket})
			if err != nil {
				t.Fatal(err)
			}
			dr.kubelet = kubeletAsker{pr}

			id, err := dr.runPod(t, pod)
			if err != nil {
				t.Fatal(err)
			}
			wantCalls := []string{"prepare default/net"}
			if tt.by == manager.PreparedByKubelet {
				wantCalls = nil
			}
			if calls := dr.driver.Calls(); !slices.Equal(calls, wantCalls) {
				t.Errorf("driver calls %v, want %v", calls, wantCalls)
			}
			c, ok := dr.claimStore.Claim("claim-net")
			if !ok || !c.Prepared || c.PreparedBy != tt.by || len(c.Devices) != 1 || c.Devices[0].Device != "dev-net" ||
				c.Devices[0].Network == nil || c.Devices[0].Network.HostInterface != "eth7" {
				t.Errorf("claim record %+v, want prepared by %s with device dev-net, host interface eth7", c, tt.by)
			}

			dr.removeSandbox(t, id)
			if err := dr.kube.CoreV1().Pods("default").Delete(t.Context(), pod.Name, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			waitPodGoneFromInformer(t, dr, pod.UID)
			dr.dra.Reconcile(t.Context())
			if tt.by == manager.PreparedByPodgate {
				wantCalls = append(wantCalls, "unprepare default/net")
			}
			if calls := dr.driver.Calls(); !slices.Equal(calls, wantCalls) {
				t.Errorf("driver calls after the pod is gone %v, want %v", calls, wantCalls)
			}
			if _, ok := dr.claimStore.Claim("claim-net"); ok {
				t.Error("claim still recorded after its pod is gone")
			}
			// Nor remembered: a claim read after that is read from the API server.
			gets := dr.gets.Load()
			if _, err := dr.claims.Claim(t.Context(), "default", "net"); err != nil {
				t.Fatal(err)
			}
			if dr.gets.Load() == gets {
				t.Error("claim still remembered by the resolver after its pod is gone")
			}
		})
	}
}

// TestDRAPrepareBesideADeadKubelet: with dra.prepare auto beside a kubelet 1.36 that died and
// left its PodResources socket behind (nobody listens on it), a pod start does not wait for
// that kubelet: the one Get podgate sends is refused at connect and not tried again, podgate
// prepares the claims itself; the next pod start asks nothing while nobody listens.
func TestDRAPrepareBesideADeadKubelet(t *testing.T) {
	p1, p2 := draPod("1", "net1"), draPod("2", "net2")
	dr := newDRARigWith(t, 5*time.Second, draOptions{manager: func(*draRig) []manager.Option {
		return []manager.Option{manager.WithPrepare(config.PrepareAuto)}
	}}, p1, p2, draClaim("net1", p1), draClaim("net2", p2))
	setKubeletVersion(t, dr.dra, "v1.36.3")
	socket := filepath.Join(dr.dir, "kubelet.sock")
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: socket, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	l.SetUnlinkOnClose(false)
	l.Close() // the socket file stays, nobody listens
	metrics := prometheus.NewRegistry()
	pr, err := podresources.NewServer(podresources.Options{Source: &podResourcesSource{registry: dr.registry, claims: dr.claimStore}, KubeletSocket: socket, Registerer: metrics})
	if err != nil {
		t.Fatal(err)
	}
	dr.kubelet = kubeletAsker{pr}

	for i, start := range []struct {
		pod   *corev1.Pod
		claim string
	}{{p1, "net1"}, {p2, "net2"}} {
		pod, claim := start.pod, start.claim
		if _, err := dr.runPod(t, pod); err != nil {
			t.Fatal(err)
		}
		if at := dr.atRun.Load(); at == nil || !slices.Contains(*at, "prepare default/"+claim) {
			t.Errorf("pod %d: driver calls when the runtime got the sandbox %v, want its claim prepared by podgate", i+1, at)
		}
		if c, ok := dr.claimStore.Claim(types.UID("claim-" + claim)); !ok || !c.Prepared || c.PreparedBy != manager.PreparedByPodgate {
			t.Errorf("pod %d: claim record %+v, want prepared by podgate", i+1, c)
		}
		if got := counterValue(t, metrics, "podgate_podresources_kubelet_requests_total", "result", "not_listening"); got != float64(i+1) {
			t.Errorf("after pod %d: kubelet_requests_total{not_listening} = %v, want %d (one per pod start)", i+1, got, i+1)
		}
		if got := counterValue(t, metrics, "podgate_podresources_kubelet_requests_total", "result", "unavailable"); got != 0 {
			t.Errorf("after pod %d: kubelet_requests_total{unavailable} = %v: podgate waited for a kubelet that is not there", i+1, got)
		}
	}
	if n := counterValue(t, dr.metrics, "podgate_dra_pod_claims_prepared_total", "by", manager.PreparedByPodgate); n != 2 {
		t.Errorf("pod_claims_prepared_total{by=podgate} = %v, want 2", n)
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

// setKubeletVersion gives the manager the kubelet's version as read from its Node at start-up.
func setKubeletVersion(t *testing.T, d *manager.Manager, v string) {
	t.Helper()
	d.SetKubeletVersion(t.Context(), &corev1.Node{Status: corev1.NodeStatus{NodeInfo: corev1.NodeSystemInfo{KubeletVersion: v}}})
}
