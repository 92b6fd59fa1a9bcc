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

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
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
func goBuild(t *testing.T, dir, pkg, name string) string {
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

func TestDRAWithTheKubelet(t *testing.T) {
	n := startDRANode(t)
	if err := n.cluster.StartKubelet(t.Context()); err != nil {
		t.Fatal(err)
	}
	n.waitSlice(t)
	pod := n.draPodWith(t, "web", 0, `{"interface": {"name": "net1", "mtu": 1400, "addresses": ["192.0.2.10/24"]}}`)
	waitWithin(t, 2*time.Minute, "pod web running", func() bool {
		p, err := n.kube.CoreV1().Pods("default").Get(t.Context(), "web", metav1.GetOptions{})
		return err == nil && p.Status.Phase == corev1.PodRunning
	})
	// (c) The device is inside the pod, as the claim's configuration asks, and the claim's
	// status shows its network data.
	out := n.execInPod(t, pod, "ip", "-o", "addr", "show", "dev", "net1")
	if !strings.Contains(out, "192.0.2.10/24") {
		t.Errorf("in the pod, ip addr show net1: %q; want 192.0.2.10/24", out)
	}
	if out := n.execInPod(t, pod, "cat", "/sys/class/net/net1/mtu"); strings.TrimSpace(out) != "1400" {
		t.Errorf("in the pod, net1's MTU is %q, want 1400", out)
	}
	if hostHasLink("pgnic0") {
		t.Error("pgnic0 is still on the host although attached to the pod")
	}
	claim, err := n.kube.ResourceV1().ResourceClaims("default").Get(t.Context(), "web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(claim.Status.Devices) != 1 || claim.Status.Devices[0].NetworkData == nil || claim.Status.Devices[0].NetworkData.InterfaceName != "net1" ||
		!slices.Contains(claim.Status.Devices[0].NetworkData.IPs, "192.0.2.10/24") {
		t.Errorf("claim status devices %+v, want net1's network data", claim.Status.Devices)
	}
	if existed, ok := n.cniAdd(t, "web", "pgnic0"); !ok || !existed {
		t.Errorf("CNI ADD of pod web: recorded %v, pgnic0 existed %v; want it there before CNI", ok, existed)
	}
	prepares := n.driverEvents(t, "web")
	// Who prepared first (the kubelet prepares before it calls RunPodSandbox; podgate before it
	// forwards it): shown for the reader, both are fine.
	for _, e := range prepares {
		t.Logf("driver: %s %s by %s (created %v)", e.Time.Format(time.StampMicro), e.Op, e.Caller.Comm, e.Created)
	}
	if !slices.ContainsFunc(prepares, func(e driver.Event) bool { return e.Op == driver.OpPrepare && e.Caller.Comm == "podgate" }) {
		t.Errorf("podgate did not prepare the claim: driver events %+v", prepares)
	}
	waitMetric(t, n.podgate, "podgate_dra_claims_prepared 1")

	n.deletePod(t, pod)
	// The kubelet stops the sandbox through podgate, which gives the device back first.
	waitMetric(t, n.podgate, `podgate_dra_attach_operations_total{operation="detach",result="success"} 1`)
	waitWithin(t, 3*time.Minute, "claim web unprepared after its pod was deleted", func() bool {
		evs := n.driverEvents(t, "web")
		return slices.ContainsFunc(evs, func(e driver.Event) bool { return e.Op == driver.OpUnprepare && e.Error == "" }) && !hostHasLink("pgnic0")
	})
	waitMetric(t, n.podgate, "podgate_dra_claims_prepared 0")
}

func TestDRAWithoutTheKubelet(t *testing.T) {
	n := startDRANode(t)
	ctx := t.Context()
	// The node registered once (its Node object holds the driver's ResourceSlice), then its
	// kubelet stopped: podgate is the only one to act on sandboxes.
	if err := n.cluster.StartKubelet(ctx); err != nil {
		t.Fatal(err)
	}
	if err := n.cluster.StopKubelet(ctx); err != nil {
		t.Fatal(err)
	}
	n.waitSlice(t)

	// (b) podgate alone prepares, before CNI.
	pod := n.draPod(t, "alone", 1)
	id, err := n.runSandbox(t, pod)
	if err != nil {
		t.Fatalf("RunPodSandbox through podgate: %v", err)
	}
	if existed, ok := n.cniAdd(t, "alone", "pgnic1"); !ok || !existed {
		t.Errorf("CNI ADD: recorded %v, pgnic1 existed %v; want it there before CNI", ok, existed)
	}
	evs := n.driverEvents(t, "alone")
	if len(evs) != 1 || evs[0].Op != driver.OpPrepare || evs[0].Caller.Comm != "podgate" || !slices.Contains(evs[0].Created, "pgnic1") {
		t.Errorf("driver events %+v, want one prepare by podgate that created pgnic1", evs)
	}

	// Driver gone: the sandbox is refused and containerd creates nothing.
	before, err := n.direct.Runtime.ListPodSandbox(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	n.stopDriver(t)
	waitWithin(t, time.Minute, "podgate seeing the driver go", func() bool {
		m, err := n.podgate.Metrics(t.Context())
		return err == nil && !strings.Contains(m, "podgate_dra_drivers{driver=\""+draDriverName+"\"} 1")
	})
	refused := n.draPod(t, "refused", 2)
	_, err = n.runSandbox(t, refused)
	if st := status.Convert(err); st.Code() != codes.Unavailable || !strings.Contains(st.Message(), draDriverName) || !strings.Contains(st.Message(), "default/refused") {
		t.Errorf("RunPodSandbox with the driver gone: %v, want Unavailable naming the driver and the claim", err)
	}
	after, err := n.direct.Runtime.ListPodSandbox(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(after) != len(before) {
		t.Errorf("containerd holds %d sandboxes, %d before the refusal", len(after), len(before))
	}
	if _, ok := n.cniAdd(t, "refused", "pgnic2"); ok {
		t.Error("CNI ran for the refused sandbox")
	}
	n.startDriver(t)
	waitMetric(t, n.podgate, "podgate_dra_drivers{driver=\""+draDriverName+"\"} 1")

	// The pod is deleted and its sandbox removed: podgate unprepares.
	if err := n.through.Runtime.StopPodSandbox(ctx, id); err != nil {
		t.Fatal(err)
	}
	if err := n.through.Runtime.RemovePodSandbox(ctx, id); err != nil {
		t.Fatal(err)
	}
	n.deletePod(t, pod)
	waitWithin(t, time.Minute, "claim alone unprepared by podgate", func() bool {
		return slices.ContainsFunc(n.driverEvents(t, "alone"), func(e driver.Event) bool {
			return e.Op == driver.OpUnprepare && e.Caller.Comm == "podgate"
		}) && !hostHasLink("pgnic1")
	})

	// (d) podgate killed after preparing, before the sandbox exists: the restarted podgate
	// unprepares from its checkpoint once the pod is gone.
	crash := n.draPod(t, "crash", 3)
	if err := n.rig.StopContainerd(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := n.runSandbox(t, crash); status.Code(err) != codes.Unavailable {
		t.Fatalf("RunPodSandbox with containerd down: %v, want Unavailable", err)
	}
	if evs := n.driverEvents(t, "crash"); len(evs) != 1 || evs[0].Op != driver.OpPrepare {
		t.Fatalf("driver events %+v, want the claim prepared before forwarding", evs)
	}
	n.podgate.Kill()
	if err := n.rig.RestartContainerd(ctx); err != nil {
		t.Fatal(err)
	}
	n.startPodgate(t)
	n.deletePod(t, crash)
	waitWithin(t, time.Minute, "claim crash unprepared after podgate's restart", func() bool {
		return slices.ContainsFunc(n.driverEvents(t, "crash"), func(e driver.Event) bool {
			return e.Op == driver.OpUnprepare && e.Caller.Comm == "podgate"
		}) && !hostHasLink("pgnic3")
	})
}
