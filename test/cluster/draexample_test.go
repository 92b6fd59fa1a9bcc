//go:build linux

package cluster_test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/utils/ptr"

	pb "github.com/podgate/podgate/podresources/api/v1alpha1"
	"github.com/podgate/podgate/test/cluster"
	"github.com/podgate/podgate/test/cni/record"
	"github.com/podgate/podgate/test/dranode"
	"github.com/podgate/podgate/test/harness"
	"github.com/podgate/podgate/test/rig"
	"github.com/podgate/podgate/test/testfs"
)

// draExampleNode is a node (startNodeOf: containerd, podgate, a kubelet on podgate) with
// dra-example-driver's kubelet plugin, net profile, beside them, and the recorder CNI chained
// after the rig's bridge, recording at each ADD which of the driver's CDI spec files exist.
type draExampleNode struct {
	*node
	driver *cluster.DRAExampleDriver
	// records is the recorder's file.
	records string
	// cri is podgate's CRI socket, as a CRI client (crictl, or the kubelet) talks to it.
	cri *rig.Client
}

// startDRAExampleNode starts the node and the driver, creates the driver's DeviceClass, and
// waits until the driver has published nic-0 ... nic-3 and podgate has found it in the cluster's
// plugin registry. The driver runs from its built neighbour binary; the test skips when it is
// not built.
func startDRAExampleNode(t *testing.T) *draExampleNode {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: runs containerd, a kubelet and a DRA driver")
	}
	for _, check := range []func() error{cluster.CheckInstalled, rig.CheckInstalled, func() error { return rig.CheckNeighbour(rig.DRAExampleDriver) }} {
		if err := check(); err != nil {
			t.Skip(err.Error())
		}
	}
	dir := testfs.ShortDir(t)
	n := &draExampleNode{records: filepath.Join(dir, "cni-record.jsonl")}
	// The recorder under its type's name, pgrecorder.
	harness.BuildProgram(t, "github.com/podgate/podgate/test/cni/recorder", dir, "pgrecorder")
	cdiRoot := filepath.Join(dir, "cdi")
	// The driver stops after the cluster, whose Down has the kubelet stop the pods (and
	// unprepare their claims) through it: this cleanup is registered before startNodeOf's.
	t.Cleanup(func() {
		if n.driver == nil {
			return
		}
		if err := n.driver.Stop(); err != nil {
			t.Errorf("dra-example-driver: %v", err)
		}
		if t.Failed() {
			t.Logf("last lines of %s:\n%s", n.driver.LogPath, n.driver.LogTail())
		}
	})
	recorder := fmt.Sprintf(`{"type": "pgrecorder", "recordFile": %q, "watchFiles": [%q]}`, n.records, filepath.Join(cdiRoot, "*"))
	n.node = startNodeOf(t, true, cluster.Options{},
		// dra.prepare auto asks the kubelet's PodResources socket whether the kubelet manages a pod.
		func(c *cluster.Cluster) string {
			return "podResources:\n  kubeletSocket: " + c.PodResourcesSocket() + "\n"
		},
		rig.Options{CNIBinDir: dir, CNIChain: []string{recorder}})
	d, err := cluster.NewDRAExampleDriver(n.cluster, cluster.DRAExampleOptions{CDIRoot: cdiRoot, LogPath: filepath.Join(dir, "dra-example-driver.log")})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Start(); err != nil {
		t.Fatal(err)
	}
	n.driver = d
	t.Logf("dra-example-driver %s (%s), CDI root %s", rig.NeighbourVersion(rig.DRAExampleDriver), rig.NeighbourBin(rig.DRAExampleDriver), cdiRoot)
	if err := cluster.CreateDRAExampleDeviceClass(t.Context(), n.cluster.Client()); err != nil {
		t.Fatal(err)
	}
	if err := d.WaitPublished(t.Context(), time.Minute); err != nil {
		t.Fatal(err)
	}
	n.waitPodgateMetric(t, time.Minute, 1, "podgate_dra_drivers", "driver", cluster.DRAExampleNetDriver)
	n.cri = rig.Connect(t, n.podgate.Endpoint)
	return n
}

// pod makes a pod with a claim on the driver's device, allocated, reserved and bound.
func (n *draExampleNode) pod(t *testing.T, name, device string) (*corev1.Pod, *resourceapi.ResourceClaim) {
	t.Helper()
	pod, claim, err := cluster.DRAExamplePod{Namespace: metav1.NamespaceDefault, Name: name, Node: n.cluster.NodeName(), Device: device}.
		Create(t.Context(), n.cluster.Client())
	if err != nil {
		t.Fatal(err)
	}
	return pod, claim
}

// podgateMetric is podgate's metric name with labels (name, value pairs); 0 when absent.
func (n *draExampleNode) podgateMetric(t *testing.T, name string, labels ...string) (float64, error) {
	m, err := n.podgate.Scrape(t.Context())
	if err != nil {
		return 0, err
	}
	v, _ := m.Value(name, labels...)
	return v, nil
}

// waitPodgateMetric waits until podgate's metric has the value want.
func (n *draExampleNode) waitPodgateMetric(t *testing.T, timeout time.Duration, want float64, name string, labels ...string) {
	t.Helper()
	var got float64
	waitFor(t, timeout, fmt.Sprintf("podgate's %s%v = %v", name, labels, want), func() (bool, error) {
		v, err := n.podgateMetric(t, name, labels...)
		got = v
		return v == want, err
	})
	t.Logf("podgate: %s%v = %v", name, labels, got)
}

// expectPodgateMetric fails the test unless podgate's metric has the value want now.
func (n *draExampleNode) expectPodgateMetric(t *testing.T, want float64, name string, labels ...string) {
	t.Helper()
	v, err := n.podgateMetric(t, name, labels...)
	if err != nil {
		t.Fatal(err)
	}
	if v != want {
		t.Errorf("podgate's %s%v = %v, want %v", name, labels, v, want)
	}
}

// expectNoPodgateSample fails the test when podgate's metrics page has a sample of name with
// labels, whatever its other labels: e.g. no call to a driver, whatever its result.
func (n *draExampleNode) expectNoPodgateSample(t *testing.T, name string, labels ...string) {
	t.Helper()
	m, err := n.podgate.Scrape(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if v, ok := m.Value(name, labels...); ok {
		t.Errorf("podgate's %s%v = %v, want no such sample", name, labels, v)
	}
}

// cniAdd is the recorder's entry of the pod's first CNI ADD; ok is false when there is none.
func (n *draExampleNode) cniAdd(t *testing.T, pod *corev1.Pod) (record.Entry, bool) {
	t.Helper()
	add, ok, err := dranode.CNIAdd(n.records, pod.Namespace, pod.Name)
	if err != nil {
		t.Fatal(err)
	}
	return add, ok
}

// checkSpecAtCNIAdd checks that the claim's CDI spec file existed when containerd ran CNI ADD
// for the pod (the recorder saw it), and that the file is the driver's for the allocated
// device: it names the claim's CDI device.
func (n *draExampleNode) checkSpecAtCNIAdd(t *testing.T, pod *corev1.Pod, claim *resourceapi.ResourceClaim, device string) {
	t.Helper()
	spec := n.driver.ClaimSpecFile(claim.UID)
	add, ok := n.cniAdd(t, pod)
	if !ok {
		t.Fatalf("no CNI ADD recorded for pod %s", pod.Name)
	}
	if !slices.Contains(add.Files, spec) {
		t.Errorf("CNI ADD of pod %s at %s saw CDI spec files %q; want %s there, prepared before CNI", pod.Name, add.Time.Format(time.StampMicro), add.Files, spec)
	}
	fi, err := os.Stat(spec)
	if err != nil {
		t.Fatalf("claim %s's CDI spec: %v", claim.Name, err)
	}
	t.Logf("CDI spec %s written %s before CNI ADD", filepath.Base(spec), add.Time.Sub(fi.ModTime()).Round(time.Microsecond))
	b, err := os.ReadFile(spec)
	if err != nil {
		t.Fatalf("claim %s's CDI spec: %v", claim.Name, err)
	}
	// The spec's device is named <claim UID>-<device>; its kind is k8s.net.example.com/net.
	cdiDevice := cluster.ClaimCDIDevice(claim.UID, device)
	_, name, _ := strings.Cut(cdiDevice, "=")
	if !strings.Contains(string(b), "name: "+name) || !strings.Contains(string(b), "kind: k8s."+cluster.DRAExampleNetDriver+"/net") {
		t.Errorf("%s does not define CDI device %s:\n%s", spec, cdiDevice, b)
	}
}

// checkPodgateDevices checks what podgate's PodResources extension (Get) says of the pod's
// claim, which podgate prepared: prepared, on the allocated device, with the CDI devices the
// driver answered (what a meta-CNI plugin such as multus reads).
func (n *draExampleNode) checkPodgateDevices(t *testing.T, pod *corev1.Pod, claim *resourceapi.ResourceClaim, device string) {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+n.podgate.PodResourcesSocket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	resp, err := pb.NewPodResourcesClient(conn).Get(t.Context(), &pb.GetRequest{PodName: pod.Name, PodNamespace: pod.Namespace})
	if err != nil {
		t.Fatalf("podgate's PodResources Get %s/%s: %v", pod.Namespace, pod.Name, err)
	}
	claims := resp.GetPod().GetClaims()
	want := cluster.ClaimCDIDevice(claim.UID, device)
	if len(claims) != 1 || claims[0].GetName() != claim.Name || !claims[0].GetPrepared() || len(claims[0].GetDevices()) != 1 {
		t.Fatalf("podgate's PodResources: claims %v, want %s prepared with one device", claims, claim.Name)
	}
	d := claims[0].GetDevices()[0]
	if d.GetDriver() != cluster.DRAExampleNetDriver || d.GetPool() != n.cluster.NodeName() || d.GetDevice() != device || !slices.Contains(d.GetCdiDeviceIds(), want) {
		t.Errorf("podgate's PodResources: device %v, want %s/%s/%s with CDI device %s", d, cluster.DRAExampleNetDriver, n.cluster.NodeName(), device, want)
	}
	t.Logf("podgate's PodResources: claim %s on %s, CDI devices %q", claim.Name, d.GetDevice(), d.GetCdiDeviceIds())
}

// prepares is how often the driver prepared the claim, from its log; the lines go to the test
// log.
func (n *draExampleNode) prepares(t *testing.T, claim *resourceapi.ResourceClaim) int {
	t.Helper()
	lines, err := n.driver.Prepares(claim.UID)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range lines {
		t.Logf("dra-example-driver: %s", l)
	}
	return len(lines)
}

// waitSpecGone waits until the driver has removed the claim's CDI spec file: it unprepared it.
func (n *draExampleNode) waitSpecGone(t *testing.T, timeout time.Duration, claim *resourceapi.ResourceClaim) {
	t.Helper()
	spec := n.driver.ClaimSpecFile(claim.UID)
	start := time.Now()
	waitFor(t, timeout, "claim "+claim.Name+" unprepared ("+spec+" removed)", func() (bool, error) {
		_, err := os.Stat(spec)
		return os.IsNotExist(err), nil
	})
	t.Logf("claim %s unprepared %s after its pod's deletion", claim.Name, time.Since(start).Round(time.Millisecond))
}

// TestDRAExampleDriverCRIClient runs dra-example-driver (net profile) beside podgate with a CRI
// client that is not the kubelet (the kubelet stopped, crictl's way: RunPodSandbox straight to
// podgate's socket, the pod and its claim in the API server):
//
//  1. podgate prepares the pod's claim before it forwards RunPodSandbox: the claim's CDI spec
//     file is there when containerd runs CNI ADD (the recorder saw it), the driver prepared it
//     once, called by podgate, and podgate's PodResources shows the driver's CDI device;
//  2. once the sandbox is removed and the pod deleted, podgate unprepares it: the driver
//     removes the file;
//  3. with the driver stopped, podgate refuses the next sandbox with Unavailable, naming the
//     driver and the claim, and nothing reaches containerd;
//  4. the same with the driver killed (SIGKILL), its sockets left behind with nobody on them.
func TestDRAExampleDriverCRIClient(t *testing.T) {
	n := startDRAExampleNode(t)
	ctx := t.Context()
	// The kubelet registered the Node (which the driver's ResourceSlice belongs to), then
	// stopped: podgate's dra.prepare auto finds nobody on the kubelet's PodResources socket and
	// prepares itself.
	if err := n.cluster.StopKubelet(ctx); err != nil {
		t.Fatal(err)
	}

	// 1. Prepared by podgate before RunPodSandbox.
	pod, claim := n.pod(t, "crictl", "nic-0")
	start := time.Now()
	id, err := n.cri.Runtime.RunPodSandbox(ctx, dranode.SandboxConfig(pod, filepath.Join(n.rig.Dir, "pods")), "")
	if err != nil {
		t.Fatalf("RunPodSandbox through podgate: %v", err)
	}
	t.Logf("sandbox %s of pod %s ready after %s", id, pod.Name, time.Since(start).Round(time.Millisecond))
	n.checkSpecAtCNIAdd(t, pod, claim, "nic-0")
	if c := n.prepares(t, claim); c != 1 {
		t.Errorf("the driver prepared claim %s %d times, want once", claim.Name, c)
	}
	n.checkPodgateDevices(t, pod, claim, "nic-0")
	n.expectPodgateMetric(t, 1, "podgate_dra_operations_total", "driver", cluster.DRAExampleNetDriver, "operation", "prepare", "result", "success")
	n.expectPodgateMetric(t, 1, "podgate_dra_pod_claims_prepared_total", "by", "podgate")
	n.expectPodgateMetric(t, 1, "podgate_dra_claims_prepared")

	// 2. Unprepared by podgate once the pod is gone.
	if err := n.cri.Runtime.StopPodSandbox(ctx, id); err != nil {
		t.Fatal(err)
	}
	if err := n.cri.Runtime.RemovePodSandbox(ctx, id); err != nil {
		t.Fatal(err)
	}
	if err := n.cluster.Client().CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
		t.Fatal(err)
	}
	n.waitSpecGone(t, time.Minute, claim)
	n.waitPodgateMetric(t, time.Minute, 1, "podgate_dra_claims_released_total", "how", "unprepared")
	n.expectPodgateMetric(t, 1, "podgate_dra_operations_total", "driver", cluster.DRAExampleNetDriver, "operation", "unprepare", "result", "success")
	n.expectPodgateMetric(t, 0, "podgate_dra_claims_prepared")

	// 3. Refused with the driver down.
	if err := n.driver.Stop(); err != nil {
		t.Fatal(err)
	}
	n.waitPodgateMetric(t, time.Minute, 0, "podgate_dra_drivers", "driver", cluster.DRAExampleNetDriver)
	n.checkRefused(t, "refused", "nic-1")

	// 4. Refused with the driver killed: podgate still holds its registration (the socket is
	// there) and its call fails.
	if err := n.driver.Start(); err != nil {
		t.Fatal(err)
	}
	if err := n.driver.WaitPublished(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	n.waitPodgateMetric(t, time.Minute, 1, "podgate_dra_drivers", "driver", cluster.DRAExampleNetDriver)
	if err := n.driver.Kill(); err != nil {
		t.Fatal(err)
	}
	n.checkRefused(t, "killed", "nic-2")
}

// checkRefused makes a pod with a claim on device and checks that podgate refuses its sandbox,
// the driver being down: Unavailable, naming the driver and the claim, and nothing created in
// containerd, no CNI run, no CDI spec written.
func (n *draExampleNode) checkRefused(t *testing.T, name, device string) {
	t.Helper()
	before := n.sandboxIDs(t)
	pod, claim := n.pod(t, name, device)
	_, err := n.cri.Runtime.RunPodSandbox(t.Context(), dranode.SandboxConfig(pod, filepath.Join(n.rig.Dir, "pods")), "")
	st := status.Convert(err)
	if st.Code() != codes.Unavailable || !strings.Contains(st.Message(), cluster.DRAExampleNetDriver) || !strings.Contains(st.Message(), "default/"+name) {
		t.Errorf("RunPodSandbox of pod %s with the driver down: %v; want Unavailable naming driver %s and claim default/%s", name, err, cluster.DRAExampleNetDriver, name)
	}
	t.Logf("pod %s refused: %s", name, st.Message())
	if after := n.sandboxIDs(t); !slices.Equal(after, before) {
		t.Errorf("containerd's sandboxes %v after the refusal of pod %s, %v before", after, name, before)
	}
	if add, ok := n.cniAdd(t, pod); ok {
		t.Errorf("CNI ran for the refused sandbox of pod %s: %+v", name, add)
	}
	if _, err := os.Stat(n.driver.ClaimSpecFile(claim.UID)); !os.IsNotExist(err) {
		t.Errorf("CDI spec of the refused pod %s's claim: %v, want none", name, err)
	}
}

// TestDRAExampleDriverKubelet runs dra-example-driver (net profile) beside podgate and the real
// kubelet, which starts the pod: the kubelet prepares the claim before RunPodSandbox (the CDI
// spec file is there at CNI ADD), podgate (dra.prepare auto) leaves it to the kubelet, so the
// driver prepares it once, and after the pod's deletion the kubelet unprepares it, podgate
// calling the driver for neither.
func TestDRAExampleDriverKubelet(t *testing.T) {
	n := startDRAExampleNode(t)
	ctx := t.Context()

	pod, claim := n.pod(t, "kubelet", "nic-2")
	start := time.Now()
	running := waitPod(t, n.cluster, pod.Namespace, pod.Name, func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
	t.Logf("pod %s running after %s", pod.Name, time.Since(start).Round(time.Millisecond))
	n.checkSpecAtCNIAdd(t, running, claim, "nic-2")
	if c := n.prepares(t, claim); c != 1 {
		t.Errorf("the driver prepared claim %s %d times, want once (by the kubelet)", claim.Name, c)
	}
	n.expectPodgateMetric(t, 1, "podgate_dra_pod_claims_prepared_total", "by", "kubelet")
	n.expectPodgateMetric(t, 0, "podgate_dra_pod_claims_prepared_total", "by", "podgate")
	n.expectNoPodgateSample(t, "podgate_dra_operations_total", "driver", cluster.DRAExampleNetDriver, "operation", "prepare")

	if err := n.cluster.Client().CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
		t.Fatal(err)
	}
	// The kubelet unprepares some 25 s after the deletion (its DRA manager's pod cleanup).
	n.waitSpecGone(t, 2*time.Minute, claim)
	// podgate forgets the claim once no sandbox of the pod runs; the kubelet unprepared it.
	n.waitPodgateMetric(t, 2*time.Minute, 1, "podgate_dra_claims_released_total", "how", "kubelet")
	n.expectNoPodgateSample(t, "podgate_dra_operations_total", "driver", cluster.DRAExampleNetDriver)
	n.expectPodgateMetric(t, 0, "podgate_dra_claims_prepared")
	if c := n.prepares(t, claim); c != 1 {
		t.Errorf("the driver prepared claim %s %d times in all, want once", claim.Name, c)
	}
}

// sandboxIDs lists containerd's pod sandboxes, sorted, asking containerd past podgate.
func (n *draExampleNode) sandboxIDs(t *testing.T) []string {
	t.Helper()
	sbs, err := n.containerd.Runtime.ListPodSandbox(t.Context(), &runtimeapi.PodSandboxFilter{})
	if err != nil {
		t.Fatalf("list sandboxes in containerd: %v", err)
	}
	ids := make([]string, 0, len(sbs))
	for _, sb := range sbs {
		ids = append(ids, sb.Id)
	}
	slices.Sort(ids)
	return ids
}
