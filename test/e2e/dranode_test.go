package e2e

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/utils/ptr"

	"github.com/podgate/podgate/test/cluster"
	"github.com/podgate/podgate/test/cni/record"
	"github.com/podgate/podgate/test/dradriver/driver"
	"github.com/podgate/podgate/test/harness"
	"github.com/podgate/podgate/test/rig"
	"github.com/podgate/podgate/test/testfs"
)

// draDriverName is the test driver's name; its devices nicN are host interfaces pgnicN.
const draDriverName = "net.podgate.test"

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
	driver          *exec.Cmd
	driverArgs      []string
	binDir          string
}

// goBuild builds the program at import path pkg into dir.
func goBuild(t testing.TB, dir, pkg, name string) string {
	t.Helper()
	out := filepath.Join(dir, name)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	if b, err := exec.CommandContext(ctx, "go", "build", "-o", out, pkg).CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", pkg, err, b)
	}
	return out
}

// draNodeOptions vary startDRANodeWith.
type draNodeOptions struct {
	// attach is podgate's dra.attach: the drivers whose devices podgate itself moves into pods.
	attach []string
	// config returns more of podgate's configuration, after its dra section.
	config func(n *draNode) string
	// cniPlugins are more CNI plugins to build into the node's CNI bin directory, by import
	// path, with their binary names.
	cniPlugins map[string]string
	// cniChain returns more CNI plugin configurations, chained after the recorder. binDir and
	// pgDir are set when it is called.
	cniChain func(n *draNode) []string
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
	goBuild(t, n.binDir, "github.com/podgate/podgate/test/cni/recorder", "pgrecorder")
	goBuild(t, n.binDir, "github.com/podgate/podgate/test/dradriver", "dradriver")
	for pkg, name := range o.cniPlugins {
		goBuild(t, n.binDir, pkg, name)
	}
	n.records = filepath.Join(n.binDir, "cni-record.jsonl")
	n.events = filepath.Join(n.binDir, "dra-events.jsonl")

	chain := []string{fmt.Sprintf(`{"type": "pgrecorder", "recordFile": %q, "watchPrefixes": ["pgnic"]}`, n.records)}
	if o.cniChain != nil {
		chain = append(chain, o.cniChain(n)...)
	}
	n.rig = rig.StartWith(t, rig.Options{CNIBinDir: n.binDir, CNIChain: chain})
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
	config := fmt.Sprintf("dra:\n  pluginRegistryDir: %s\n  callTimeout: 5s\n  attach: [%s]\n  publishNetworkData: true\n",
		n.cluster.PluginRegistryDir(), strings.Join(o.attach, ", "))
	if o.config != nil {
		config += o.config(n)
	}
	n.pgArgs = []string{
		"--kubeconfig", n.cluster.Kubeconfig(), "--node-name", n.cluster.NodeName(),
		"--config", writeConfig(t, config),
	}
	n.startPodgate(t)
	n.driverArgs = []string{
		"--node-name", n.cluster.NodeName(), "--kubeconfig", n.cluster.Kubeconfig(),
		"--registry-dir", n.cluster.PluginRegistryDir(), "--plugin-dir", filepath.Join(n.cluster.PluginsDir(), draDriverName),
		"--cdi-dir", "", "--events-file", n.events,
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
	cmd := exec.Command(filepath.Join(n.binDir, "dradriver"), n.driverArgs...)
	log, err := os.Create(filepath.Join(n.binDir, fmt.Sprintf("dradriver-%d.log", time.Now().UnixNano())))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	n.driver = cmd
}

// stopDriver stops the driver with SIGTERM (it removes its sockets) and waits for podgate to
// see it go.
func (n *draNode) stopDriver(t *testing.T) {
	t.Helper()
	if n.driver == nil {
		return
	}
	_ = n.driver.Process.Signal(syscall.SIGTERM)
	_ = n.driver.Wait()
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
	ctx := t.Context()
	spec := resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
		Name: "nic", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: draDriverName},
	}}}}
	if opaque != "" {
		spec.Devices.Config = []resourceapi.DeviceClaimConfiguration{{DeviceConfiguration: resourceapi.DeviceConfiguration{
			Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: draDriverName, Parameters: runtime.RawExtension{Raw: []byte(opaque)}},
		}}}
	}
	claim, err := n.kube.ResourceV1().ResourceClaims("default").Create(ctx, &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       spec,
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ctr := corev1.Container{
		Name: "c", Image: rig.BusyboxImage, ImagePullPolicy: corev1.PullNever,
		Command:   []string{"sleep", "3600"},
		Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "nic"}}},
	}
	if podLevel {
		ctr.Resources.Claims = nil
	}
	pod, err := n.kube.CoreV1().Pods("default").Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{
			AutomountServiceAccountToken:  ptr.To(false),
			TerminationGracePeriodSeconds: ptr.To[int64](0),
			ResourceClaims:                []corev1.PodResourceClaim{{Name: "nic", ResourceClaimName: ptr.To(name)}},
			Containers:                    []corev1.Container{ctr},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	node := n.cluster.NodeName()
	claim.Status.Allocation = &resourceapi.AllocationResult{
		Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{{
			Request: "nic", Driver: draDriverName, Pool: node, Device: fmt.Sprintf("nic%d", device),
		}}},
		NodeSelector: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
			MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{node}}},
		}}},
	}
	// The scheduler copies the claim's configuration into the allocation.
	for _, c := range claim.Spec.Devices.Config {
		claim.Status.Allocation.Devices.Config = append(claim.Status.Allocation.Devices.Config, resourceapi.DeviceAllocationConfiguration{
			Source: resourceapi.AllocationConfigSourceClaim, Requests: c.Requests, DeviceConfiguration: c.DeviceConfiguration,
		})
	}
	claim.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: pod.Name, UID: pod.UID}}
	if _, err := n.kube.ResourceV1().ResourceClaims("default").UpdateStatus(ctx, claim, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := n.kube.CoreV1().Pods("default").Bind(ctx, &corev1.Binding{
		ObjectMeta: metav1.ObjectMeta{Name: pod.Name, UID: pod.UID},
		Target:     corev1.ObjectReference{Kind: "Node", Name: node},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod.Spec.NodeName = node
	return pod
}

// waitSlice waits for the driver's ResourceSlice, which it publishes once the Node exists:
// podgate reads the host interface of an attached device there.
func (n *draNode) waitSlice(t *testing.T) {
	t.Helper()
	waitWithin(t, time.Minute, "the driver's ResourceSlice", func() bool {
		slices, err := n.kube.ResourceV1().ResourceSlices().List(t.Context(), metav1.ListOptions{})
		if err != nil {
			return false
		}
		for _, s := range slices.Items {
			if s.Spec.Driver == draDriverName && s.Spec.NodeName != nil && *s.Spec.NodeName == n.cluster.NodeName() && len(s.Spec.Devices) > 0 {
				return true
			}
		}
		return false
	})
}

func (n *draNode) deletePod(t *testing.T, pod *corev1.Pod) {
	t.Helper()
	if err := n.kube.CoreV1().Pods(pod.Namespace).Delete(t.Context(), pod.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
		t.Fatal(err)
	}
}

// runSandbox starts the pod's sandbox through podgate as a CRI client, as the kubelet would.
func (n *draNode) runSandbox(t *testing.T, pod *corev1.Pod) (string, error) {
	t.Helper()
	return n.through.Runtime.RunPodSandbox(t.Context(), &runtimeapi.PodSandboxConfig{
		Metadata:     &runtimeapi.PodSandboxMetadata{Name: pod.Name, Namespace: pod.Namespace, Uid: string(pod.UID)},
		Labels:       map[string]string{"io.kubernetes.pod.uid": string(pod.UID), "io.kubernetes.pod.name": pod.Name, "io.kubernetes.pod.namespace": pod.Namespace},
		LogDirectory: filepath.Join(n.rig.Dir, "pods", pod.Name),
	}, "")
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
	evs, err := driver.ReadEvents(n.events)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return slices.DeleteFunc(evs, func(e driver.Event) bool { return e.Name != claim })
}

// cniAdd returns whether the pod's CNI ADD found the interface on the host; ok is false when no
// ADD for the pod was recorded.
func (n *draNode) cniAdd(t *testing.T, pod, iface string) (existed, ok bool) {
	t.Helper()
	entries, err := record.Read(n.records)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	adds := record.Find(entries, "ADD", "default", pod)
	if len(adds) == 0 {
		return false, false
	}
	return adds[0].Interfaces[iface], true
}

// removeTestLinks deletes the host interfaces the test driver makes (pgnicN and its peer).
func removeTestLinks(t *testing.T) {
	t.Helper()
	ifaces, err := net.Interfaces()
	if err != nil {
		t.Fatal(err)
	}
	for _, i := range ifaces {
		if strings.HasPrefix(i.Name, "pgnic") {
			// Deleting one end of a veth pair deletes the other: "not found" is fine.
			_ = exec.Command("ip", "link", "del", i.Name).Run()
		}
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

func hostHasLink(name string) bool {
	_, err := net.InterfaceByName(name)
	return err == nil
}
