//go:build linux

package cluster_test

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"

	"github.com/podgate/podgate/test/cluster"
	"github.com/podgate/podgate/test/rig"
	"github.com/podgate/podgate/test/testfs"
	"github.com/podgate/podgate/test/testnet"
)

// dranetPodInterface and dranetPodAddress are what the claim's opaque configuration asks dranet
// for: the device's name and address in the pod.
const (
	dranetPodInterface = "net1"
	dranetPodAddress   = "192.0.2.10/24"
)

// TestDRANetBesidePodgate runs dranet (sigs.k8s.io/dranet, SIG Network's DRA driver for network
// interfaces, which nobody here wrote) beside podgate on one containerd with NRI, under a real
// kubelet whose runtime is podgate. dranet differs from the drivers podgate attaches for: its
// prepare only stores the claim's configuration, and it moves the interface itself, in its NRI
// RunPodSandbox hook, which containerd runs after CNI. podgate is configured as docs/dra.md says
// for such a driver: not in dra.attach (so podgate neither moves its devices nor publishes their
// network data), and in dra.sandboxHookDrivers.
//
// A pod with a claim on a dummy interface of the test's: the kubelet prepares the claim (dra.prepare
// auto), dranet moves the interface into the pod, where it has the name and address of the
// claim's configuration; podgate recorded the claim and attached, published nothing. Then dranet
// dies (SIGKILL: its sockets stay, so podgate still sees it registered) and the pod's sandbox
// dies under the kubelet, which starts another without preparing again (the claim is prepared):
// containerd would start it without the interface, no NRI plugin being there (containerd/nri#282);
// podgate refuses it instead, saying dranet does not answer.
func TestDRANetBesidePodgate(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the rig runs containerd, dranet moves interfaces between namespaces")
	}
	if err := rig.CheckNeighbour(rig.DRANet); err != nil {
		t.Skip(err.Error())
	}
	for _, tool := range []string{"unshare", "ip", "mount"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("needs %s: %v", tool, err)
		}
	}
	// Made before the node, so that its cleanup runs after the node's: by then the interface is
	// back on the host, or gone with the pod's network namespace (the kernel deletes a dummy
	// interface with its namespace).
	link := dummyLink(t)
	nriSocket := filepath.Join(testfs.ShortDir(t), "nri.sock")
	n := startNodeOf(t, true, cluster.Options{}, func(c *cluster.Cluster) string {
		// More of the dra section that startNodeOf's configuration opens, then podResources:
		// with the kubelet's socket, dra.prepare auto lets the kubelet prepare its pods' claims.
		return "  sandboxHookDrivers: [" + cluster.DRANetDriver + "]\n" +
			"podResources:\n  kubeletSocket: " + c.PodResourcesSocket() + "\n"
	}, rig.Options{NRISocket: nriSocket})
	shareNetNSMounts(t, n.rig)
	dn := startDRANet(t, n, nriSocket, link)
	_, ctx := ktesting.NewTestContext(t)

	waitDRANetSlice(t, n.cluster, link)
	waitFor(t, time.Minute, "podgate seeing dranet", func() (bool, error) {
		v, _, err := podgateMetric(t, n, "podgate_dra_drivers", "driver", cluster.DRANetDriver)
		return v == 1, err
	})
	waitFor(t, 2*time.Minute, "podgate reading the kubelet's version from the Node", func() (bool, error) {
		return strings.Contains(n.podgate.Log.String(), "kubeletPrepares=true"), nil
	})

	pod := createDRANetPod(t, n.cluster, "dranet-pod", link)
	start := time.Now()
	running := waitPod(t, n.cluster, pod.Namespace, pod.Name, func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
	t.Logf("pod running %s after its binding", time.Since(start).Round(time.Millisecond))
	sb := findSandbox(t, n.containerd, string(running.UID))
	if sb == nil {
		t.Fatalf("no sandbox of pod %s in containerd", pod.Name)
	}

	// dranet moved the interface into the pod, named and addressed as the claim asks.
	if _, err := net.InterfaceByName(link); err == nil {
		t.Errorf("interface %s still on the host with the pod running", link)
	}
	checkPodInterface(t, n.containerd, sb.Id)
	if !strings.Contains(dn.Log(), "RunPodSandbox Pod "+pod.Namespace+"/"+pod.Name) {
		t.Errorf("dranet's log (%s) does not show its NRI RunPodSandbox hook for the pod", dn.LogPath())
	}

	// podgate recorded the claim the kubelet prepared, and stayed out of dranet's way: no
	// attach, and the claim's status is dranet's alone.
	if v, _, err := podgateMetric(t, n, "podgate_dra_pod_claims_prepared_total", "by", "kubelet"); err != nil || v != 1 {
		t.Errorf("pod starts whose claims the kubelet prepared, as podgate counts them: %v (%v), want 1", v, err)
	}
	if _, ok, err := podgateMetric(t, n, "podgate_dra_attach_operations_total"); err != nil || ok {
		t.Errorf("podgate counts attach operations (%v, %v), want none: dranet is not in dra.attach", ok, err)
	}
	checkClaimStatusByDRANet(t, n.cluster, pod, link)

	// dranet dies; its registration socket stays, so the kubelet and podgate still have it
	// registered.
	if err := dn.Kill(); err != nil {
		t.Fatal(err)
	}
	if v, _, err := podgateMetric(t, n, "podgate_dra_drivers", "driver", cluster.DRANetDriver); err != nil || v != 1 {
		t.Fatalf("dranet registered for podgate after its death: %v (%v), want 1 (its socket stays)", v, err)
	}
	// The sandbox dies under the kubelet (stopped in containerd, not through podgate or the
	// kubelet); the kubelet starts another, without preparing the prepared claim again.
	if err := n.containerd.Runtime.StopPodSandbox(ctx, sb.Id); err != nil {
		t.Fatalf("stop sandbox %s in containerd: %v", sb.Id, err)
	}
	refused := waitEvent(t, n.cluster, running, "FailedDRAPrepare", cluster.DRANetDriver, "does not answer")
	t.Logf("refused: %s", refused.Note)
	sbs, err := n.containerd.Runtime.ListPodSandbox(ctx, &runtimeapi.PodSandboxFilter{
		LabelSelector: map[string]string{"io.kubernetes.pod.uid": string(running.UID)},
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range sbs {
		if s.State == runtimeapi.PodSandboxState_SANDBOX_READY {
			t.Errorf("sandbox %s of the pod is ready with dranet dead: %v", s.Id, s)
		}
	}
	if len(sbs) != 1 || sbs[0].Id != sb.Id {
		t.Errorf("sandboxes of the pod after the refusal: %v, want only the stopped %s", sbs, sb.Id)
	}
}

// dummyLink adds a dummy interface, named pgdn + 8 random hex digits (a DNS label, so dranet
// names its device after it), deleted at the end of the test if it is still on the host.
func dummyLink(t *testing.T) string {
	t.Helper()
	b := make([]byte, 4)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	name := "pgdn" + hex.EncodeToString(b)
	testnet.IP(t, "link", "add", name, "type", "dummy")
	t.Cleanup(func() {
		if _, err := net.InterfaceByName(name); err != nil {
			return // moved into a pod whose namespace is gone, which deleted it
		}
		if out, err := exec.Command("ip", "link", "del", name).CombinedOutput(); err != nil {
			t.Errorf("ip link del %s: %v: %s", name, err, out)
		}
	})
	return name
}

// shareNetNSMounts makes the directory where the rig's containerd mounts the pods' network
// namespaces a shared mount (a bind mount onto itself), so that the namespaces containerd mounts
// after dranet started propagate into dranet's mount namespace (unshare --propagation slave), as
// dranet's DaemonSet gets /var/run/netns with HostToContainer propagation. The host's other mounts
// stay private. rig.Down unmounts it with the rest of its directory.
func shareNetNSMounts(t *testing.T, r *rig.Rig) {
	t.Helper()
	dir := filepath.Join(r.Dir, "state", "io.containerd.grpc.v1.cri", "netns")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"--bind", dir, dir}, {"--make-shared", dir}} {
		if out, err := exec.Command("mount", args...).CombinedOutput(); err != nil {
			t.Fatalf("mount %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
}

// startDRANet starts dranet for the node, publishing only link, and stops it when the test ends
// (before the cluster: its cleanup runs first).
func startDRANet(t *testing.T, n *node, nriSocket, link string) *cluster.DRANet {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	dir := testfs.ShortDir(t)
	dn, err := n.cluster.StartDRANet(ctx, cluster.DRANetOptions{
		Bin:       rig.NeighbourBin(rig.DRANet),
		NRISocket: nriSocket,
		Dir:       dir,
		Filter:    fmt.Sprintf(`%q in attributes && attributes[%q].StringValue == %q`, cluster.DRANetInterfaceNameAttribute, cluster.DRANetInterfaceNameAttribute, link),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("dranet %s running, log %s", rig.NeighbourVersion(rig.DRANet), dn.LogPath())
	t.Cleanup(func() {
		if err := dn.Stop(30 * time.Second); err != nil {
			t.Errorf("stop dranet: %v", err)
		}
		if t.Failed() {
			t.Logf("dranet log:\n%s", dn.Log())
		}
	})
	return dn
}

// waitDRANetSlice waits for dranet's ResourceSlice of the node with the device of link, named
// after it.
func waitDRANetSlice(t *testing.T, c *cluster.Cluster, link string) {
	t.Helper()
	waitFor(t, time.Minute, "dranet's ResourceSlice with device "+link, func() (bool, error) {
		list, err := c.Client().ResourceV1().ResourceSlices().List(t.Context(), metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		for _, s := range list.Items {
			if s.Spec.Driver != cluster.DRANetDriver || ptr.Deref(s.Spec.NodeName, "") != c.NodeName() {
				continue
			}
			for _, d := range s.Spec.Devices {
				if d.Name == link && ptr.Deref(d.Attributes[cluster.DRANetInterfaceNameAttribute].StringValue, "") == link {
					return true, nil
				}
			}
		}
		return false, nil
	})
}

// createDRANetPod makes a claim on dranet's device for link, with the configuration that names it
// dranetPodInterface and gives it dranetPodAddress in the pod, and a pod using it (the claim is
// the pod's, not a container's); it allocates and reserves the claim as the scheduler would, then
// binds the pod, in the order that keeps the kubelet from preparing an unreserved claim
// (kubernetes#139836).
func createDRANetPod(t *testing.T, c *cluster.Cluster, name, link string) *corev1.Pod {
	t.Helper()
	ctx, kube := t.Context(), c.Client()
	params := fmt.Sprintf(`{"interface": {"name": %q, "addresses": [%q]}}`, dranetPodInterface, dranetPodAddress)
	config := resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
		Driver: cluster.DRANetDriver, Parameters: runtime.RawExtension{Raw: []byte(params)},
	}}
	claims := kube.ResourceV1().ResourceClaims(metav1.NamespaceDefault)
	claim, err := claims.Create(ctx, &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
			Requests: []resourceapi.DeviceRequest{{Name: "nic", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: cluster.DRANetDriver}}},
			Config:   []resourceapi.DeviceClaimConfiguration{{DeviceConfiguration: config}},
		}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create claim: %v", err)
	}
	pod := testPod(name, "")
	pod.Spec.NodeName = ""
	pod.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "nic", ResourceClaimName: ptr.To(name)}}
	pod, err = kube.CoreV1().Pods(pod.Namespace).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create pod: %v", err)
	}
	claim.Status.Allocation = &resourceapi.AllocationResult{
		Devices: resourceapi.DeviceAllocationResult{
			Results: []resourceapi.DeviceRequestAllocationResult{{Request: "nic", Driver: cluster.DRANetDriver, Pool: c.NodeName(), Device: link}},
			// The scheduler copies the claim's configuration into the allocation.
			Config: []resourceapi.DeviceAllocationConfiguration{{Source: resourceapi.AllocationConfigSourceClaim, DeviceConfiguration: config}},
		},
		NodeSelector: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
			MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{c.NodeName()}}},
		}}},
	}
	claim.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: pod.Name, UID: pod.UID}}
	if _, err := claims.UpdateStatus(ctx, claim, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("allocate claim: %v", err)
	}
	if err := kube.CoreV1().Pods(pod.Namespace).Bind(ctx, &corev1.Binding{
		ObjectMeta: metav1.ObjectMeta{Name: pod.Name, UID: pod.UID},
		Target:     corev1.ObjectReference{Kind: "Node", Name: c.NodeName()},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("bind pod: %v", err)
	}
	return pod
}

// checkPodInterface checks, from the network namespace of the sandbox's container (its process's
// /proc/PID/ns/net), that the pod has the dummy interface as dranetPodInterface with
// dranetPodAddress, up.
func checkPodInterface(t *testing.T, c *rig.Client, sandboxID string) {
	t.Helper()
	h := testnet.HandleAt(t, fmt.Sprintf("/proc/%d/ns/net", containerPID(t, c, sandboxID)))
	l, err := h.LinkByName(dranetPodInterface)
	if err != nil {
		names := []string{}
		if links, lerr := h.LinkList(); lerr == nil {
			for _, l := range links {
				names = append(names, l.Attrs().Name)
			}
		}
		t.Fatalf("no %s in the pod (it has %v): %v", dranetPodInterface, names, err)
	}
	if l.Type() != "dummy" {
		t.Errorf("%s in the pod is a %s, want the dummy interface", dranetPodInterface, l.Type())
	}
	if l.Attrs().Flags&net.FlagUp == 0 {
		t.Errorf("%s in the pod is down", dranetPodInterface)
	}
	addrs, err := h.AddrList(l, netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, a := range addrs {
		got = append(got, a.IPNet.String())
	}
	if !slices.Contains(got, dranetPodAddress) {
		t.Errorf("%s in the pod has addresses %v, want %s", dranetPodInterface, got, dranetPodAddress)
	}
}

// containerPID is the host PID of the process of the sandbox's one container, from containerd's
// verbose container status.
func containerPID(t *testing.T, c *rig.Client, sandboxID string) int {
	t.Helper()
	ctrs, err := c.Runtime.ListContainers(t.Context(), &runtimeapi.ContainerFilter{PodSandboxId: sandboxID})
	if err != nil || len(ctrs) != 1 {
		t.Fatalf("containers of sandbox %s: %v (%v), want one", sandboxID, ctrs, err)
	}
	st, err := c.Runtime.ContainerStatus(t.Context(), ctrs[0].Id, true)
	if err != nil {
		t.Fatal(err)
	}
	var info struct {
		PID int `json:"pid"`
	}
	if err := json.Unmarshal([]byte(st.GetInfo()["info"]), &info); err != nil || info.PID == 0 {
		t.Fatalf("container %s's pid from its status %q: %v", ctrs[0].Id, st.GetInfo()["info"], err)
	}
	return info.PID
}

// checkClaimStatusByDRANet waits for dranet's status of the pod's claim (it writes it from its NRI
// hook, asynchronously) and checks that podgate wrote none of it: dranet is not in dra.attach, so
// podgate publishes no network data for its devices.
func checkClaimStatusByDRANet(t *testing.T, c *cluster.Cluster, pod *corev1.Pod, link string) {
	t.Helper()
	var claim *resourceapi.ResourceClaim
	waitFor(t, time.Minute, "dranet's status of claim "+pod.Name, func() (bool, error) {
		got, err := c.Client().ResourceV1().ResourceClaims(pod.Namespace).Get(t.Context(), pod.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		claim = got
		for _, d := range got.Status.Devices {
			if d.Driver == cluster.DRANetDriver && d.Device == link {
				return true, nil
			}
		}
		return false, nil
	})
	for _, m := range claim.ManagedFields {
		if strings.HasPrefix(m.Manager, "podgate") {
			t.Errorf("podgate wrote the claim (%s of %s): %v", m.Operation, m.Subresource, m)
		}
	}
	for _, d := range claim.Status.Devices {
		if d.Driver != cluster.DRANetDriver || d.Device != link {
			t.Errorf("claim status has a device that is not dranet's %s: %+v", link, d)
		}
		t.Logf("claim status by dranet: device %s, network data %+v", d.Device, d.NetworkData)
	}
}

// podgateMetric is the value of podgate's counter or gauge name with labels, or, without labels,
// the sum of all its samples; ok says whether podgate has it at all.
func podgateMetric(t *testing.T, n *node, name string, labels ...string) (v float64, ok bool, err error) {
	t.Helper()
	m, err := n.podgate.Scrape(t.Context())
	if err != nil {
		return 0, false, err
	}
	if len(labels) > 0 {
		v, ok = m.Value(name, labels...)
		return v, ok, nil
	}
	f := m[name]
	if f == nil {
		return 0, false, nil
	}
	for _, s := range f.GetMetric() {
		v += s.GetCounter().GetValue() + s.GetGauge().GetValue()
	}
	return v, len(f.GetMetric()) > 0, nil
}
