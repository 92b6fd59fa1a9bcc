package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podgate/podgate/test/cluster"
	"github.com/podgate/podgate/test/dradriver/driver"
	"github.com/podgate/podgate/test/dranode"
	"github.com/podgate/podgate/test/harness"
	"github.com/podgate/podgate/test/rig"
	"github.com/podgate/podgate/test/testfs"
)

// draDriverName is the test driver's name; its devices nicN are host interfaces pgnicN.
const draDriverName = dranode.DriverName

// draNode is a real single-node cluster whose kubelet talks to podgate in front of a real
// containerd, with the test DRA driver registered and a CNI plugin recording what CNI ADD saw.
type draNode struct {
	rig     *rig.Rig
	cluster *cluster.Cluster
	podgate *harness.Podgate
	pgDir   string
	pgArgs  []string
	kube    kubernetes.Interface
	direct  *rig.Client // containerd, past podgate
	through *rig.Client // podgate, as the kubelet talks to it
	// records is the CNI recorder's file; events the driver's.
	records, events string
	driver          *dranode.Driver
	driverConfig    dranode.DriverConfig
	binDir          string
}

// draNodeOptions vary startDRANodeWith.
type draNodeOptions struct {
	// attach is podgate's dra.attach: the drivers whose devices podgate itself moves into pods.
	attach []string
	// config returns more of podgate's configuration, after its dra and podResources sections.
	config func(n *draNode) string
	// cniPlugins are more CNI plugins to build into the node's CNI bin directory, by import
	// path, with their binary names.
	cniPlugins map[string]string
	// cniChain returns more CNI plugin configurations, chained after the recorder. binDir and
	// pgDir are set when it is called.
	cniChain func(n *draNode) []string
	// containerdMetrics, a loopback host:port, has containerd serve its metrics there.
	containerdMetrics string
}

// startDRANode starts a node whose podgate attaches the test driver's devices itself.
func startDRANode(t *testing.T) *draNode {
	t.Helper()
	return startDRANodeWith(t, draNodeOptions{attach: []string{draDriverName}})
}

func startDRANodeWith(t *testing.T, o draNodeOptions) *draNode {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: runs containerd, a kubelet and a DRA driver that creates host interfaces")
	}
	if err := cluster.CheckInstalled(); err != nil {
		t.Skip(err.Error())
	}
	// The driver's interfaces are this test's own: a failed earlier run may have left some.
	removeTestLinks(t)
	t.Cleanup(func() { removeTestLinks(t) })
	n := &draNode{binDir: testfs.ShortDir(t), pgDir: testfs.ShortDir(t)}
	harness.BuildProgram(t, "github.com/podgate/podgate/test/cni/recorder", n.binDir, "pgrecorder")
	harness.BuildProgram(t, "github.com/podgate/podgate/test/dradriver", n.binDir, "dradriver")
	for pkg, name := range o.cniPlugins {
		harness.BuildProgram(t, pkg, n.binDir, name)
	}
	n.records = filepath.Join(n.binDir, "cni-record.jsonl")
	n.events = filepath.Join(n.binDir, "dra-events.jsonl")

	chain := []string{dranode.RecorderConf(n.records)}
	if o.cniChain != nil {
		chain = append(chain, o.cniChain(n)...)
	}
	n.rig = rig.StartWith(t, rig.Options{CNIBinDir: n.binDir, CNIChain: chain, MetricsAddress: o.containerdMetrics})
	// Registered before the cluster's: cleanups run last first, so podgate and the driver
	// still serve while the cluster's kubelet stops its pods through them.
	t.Cleanup(func() {
		n.stopDriver(t)
		if n.podgate == nil {
			return
		}
		code, err := n.podgate.Stop(30 * time.Second)
		if err != nil || code != 0 {
			t.Errorf("podgate stop: exit %d, %v", code, err)
		}
		if t.Failed() {
			t.Logf("podgate log:\n%s", n.podgate.Log)
		}
	})
	n.cluster = cluster.Start(t, cluster.Options{CRIEndpoint: "unix://" + filepath.Join(n.pgDir, "cri.sock"), DeferKubelet: true})
	n.kube = n.cluster.Client()
	// dra.prepare auto asks the kubelet's PodResources socket whether it manages a pod (and so
	// prepared its claims); a stopped kubelet does not answer and podgate prepares.
	config := fmt.Sprintf("dra:\n  pluginRegistryDir: %s\n  callTimeout: 5s\n  attach: [%s]\n  publishNetworkData: true\n"+
		"podResources:\n  kubeletSocket: %s\n",
		n.cluster.PluginRegistryDir(), strings.Join(o.attach, ", "), n.cluster.PodResourcesSocket())
	if o.config != nil {
		config += o.config(n)
	}
	n.pgArgs = []string{
		"--kubeconfig", n.cluster.Kubeconfig(), "--node-name", n.cluster.NodeName(),
		"--config", writeConfig(t, config),
	}
	n.startPodgate(t)
	n.driverConfig = dranode.DriverConfig{
		Bin: filepath.Join(n.binDir, "dradriver"), NodeName: n.cluster.NodeName(), Kubeconfig: n.cluster.Kubeconfig(),
		RegistryDir: n.cluster.PluginRegistryDir(), PluginDir: filepath.Join(n.cluster.PluginsDir(), draDriverName),
		EventsFile: n.events, LogDir: n.binDir,
	}
	n.startDriver(t)
	n.direct = rig.Connect(t, n.rig.Endpoint)
	n.through = rig.Connect(t, n.podgate.Endpoint)
	waitMetric(t, n.podgate, fmt.Sprintf(`podgate_dra_drivers{driver=%q} 1`, draDriverName))
	return n
}

func (n *draNode) startPodgate(t *testing.T) {
	t.Helper()
	p, err := harness.Start(t.Context(), podgateBin, harness.Options{Dir: n.pgDir, RuntimeEndpoint: n.rig.Endpoint, Args: n.pgArgs})
	if err != nil {
		t.Fatal(err)
	}
	n.podgate = p
}

func (n *draNode) startDriver(t *testing.T) {
	t.Helper()
	d, err := dranode.StartDriver(n.driverConfig)
	if err != nil {
		t.Fatal(err)
	}
	n.driver = d
}

// stopDriver stops the driver with SIGTERM (it removes its sockets).
func (n *draNode) stopDriver(t *testing.T) {
	t.Helper()
	if n.driver == nil {
		return
	}
	if err := n.driver.Stop(); err != nil {
		t.Error(err)
	}
	n.driver = nil
}

// draPod makes claim (allocated to device nicN of the driver, as the scheduler would) and a pod
// using it, reserves the claim for the pod and binds the pod to the node, in the order that
// keeps the kubelet from trying to prepare an unreserved claim (kubernetes#139836).
func (n *draNode) draPod(t *testing.T, name string, device int) *corev1.Pod {
	t.Helper()
	return n.draPodWith(t, name, device, "")
}

// draPodWith is draPod with an opaque configuration of the claim for the driver.
func (n *draNode) draPodWith(t *testing.T, name string, device int, opaque string) *corev1.Pod {
	t.Helper()
	return n.makeDRAPod(t, name, device, opaque, false)
}

// makeDRAPod is draPodWith; with podLevel, no container names the claim in resources.claims:
// the claim is the pod's, as a network device's usually is.
func (n *draNode) makeDRAPod(t *testing.T, name string, device int, opaque string, podLevel bool) *corev1.Pod {
	t.Helper()
	pod, err := dranode.Pod{
		Namespace: "default", Name: name, Node: n.cluster.NodeName(), Device: device, Opaque: opaque, PodLevel: podLevel,
	}.Create(t.Context(), n.kube)
	if err != nil {
		t.Fatal(err)
	}
	return pod
}

// waitSlice waits for the driver's ResourceSlice, which it publishes once the Node exists:
// podgate reads the host interface of an attached device there.
func (n *draNode) waitSlice(t *testing.T) {
	t.Helper()
	if err := dranode.WaitSlice(t.Context(), n.kube, n.cluster.NodeName(), time.Minute); err != nil {
		t.Fatal(err)
	}
}

func (n *draNode) deletePod(t *testing.T, pod *corev1.Pod) {
	t.Helper()
	if err := dranode.DeletePod(t.Context(), n.kube, pod); err != nil {
		t.Fatal(err)
	}
}

// runSandbox starts the pod's sandbox through podgate as a CRI client, as the kubelet would.
func (n *draNode) runSandbox(t *testing.T, pod *corev1.Pod) (string, error) {
	t.Helper()
	return n.through.Runtime.RunPodSandbox(t.Context(), dranode.SandboxConfig(pod, filepath.Join(n.rig.Dir, "pods")), "")
}

// waitWithin polls cond until it holds, failing the test after limit.
func waitWithin(t testing.TB, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), limit)
	defer cancel()
	waitFor(ctx, t, what, cond)
}

func (n *draNode) driverEvents(t *testing.T, claim string) []driver.Event {
	t.Helper()
	evs, err := dranode.Events(n.events, claim)
	if err != nil {
		t.Fatal(err)
	}
	return evs
}

// cniAdd returns whether the pod's CNI ADD found the interface on the host; ok is false when no
// ADD for the pod was recorded.
func (n *draNode) cniAdd(t *testing.T, pod, iface string) (existed, ok bool) {
	t.Helper()
	add, ok, err := dranode.CNIAdd(n.records, "default", pod)
	if err != nil {
		t.Fatal(err)
	}
	return add.Interfaces[iface], ok
}

// removeTestLinks deletes the host interfaces the test driver makes (pgnicN and its peer).
func removeTestLinks(t *testing.T) {
	t.Helper()
	if err := dranode.RemoveLinks(); err != nil {
		t.Fatal(err)
	}
}

// execInPod runs a command in the pod's container, past podgate, and returns its output.
func (n *draNode) execInPod(t *testing.T, pod *corev1.Pod, cmd ...string) string {
	t.Helper()
	ctrs, err := n.direct.Runtime.ListContainers(t.Context(), &runtimeapi.ContainerFilter{
		LabelSelector: map[string]string{"io.kubernetes.pod.uid": string(pod.UID)},
		State:         &runtimeapi.ContainerStateValue{State: runtimeapi.ContainerState_CONTAINER_RUNNING},
	})
	if err != nil || len(ctrs) == 0 {
		t.Fatalf("pod %s's running container: %v %v", pod.Name, ctrs, err)
	}
	out, stderr, err := n.direct.Runtime.ExecSync(t.Context(), ctrs[0].Id, cmd, 10*time.Second)
	if err != nil {
		t.Fatalf("exec %v in pod %s: %v %s", cmd, pod.Name, err, stderr)
	}
	return string(out)
}

func hostHasLink(name string) bool { return dranode.HostHasLink(name) }
