package e2e

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	v1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	pb "github.com/podgate/podgate/podresources/api/v1alpha1"
	"github.com/podgate/podgate/test/cni/record"
	"github.com/podgate/podgate/test/dradriver/driver"
)

// metaEntry is one line of pgmetacni's record file (test/cni/metacni's Entry): the parts this
// test reads.
type metaEntry struct {
	Command     string `json:"command"`
	ContainerID string `json:"containerID"`
	Netns       string `json:"netns"`
	Pod         struct {
		Namespace string `json:"namespace"`
		Name      string `json:"name"`
	} `json:"pod"`
	Extension *struct {
		Found     bool         `json:"found"`
		SandboxID string       `json:"sandboxID"`
		Devices   []metaDevice `json:"devices"`
	} `json:"extension"`
	V1 *struct {
		Found      bool            `json:"found"`
		Containers []metaContainer `json:"containers"`
	} `json:"v1"`
	Delegated []metaDelegation `json:"delegated"`
	Errors    []string         `json:"errors"`
}

// metaDevice is a device of podgate's extension answer, as pgmetacni recorded it.
type metaDevice struct {
	ClaimNamespace string `json:"claimNamespace"`
	ClaimName      string `json:"claimName"`
	Driver         string `json:"driver"`
	Pool           string `json:"pool"`
	Device         string `json:"device"`
	HostInterface  string `json:"hostInterface"`
	InterfaceName  string `json:"interfaceName"`
	Attached       bool   `json:"attached"`
}

// metaContainer is a container of the v1 answer, as pgmetacni recorded it.
type metaContainer struct {
	Name             string                `json:"name"`
	DynamicResources []metaDynamicResource `json:"dynamicResources"`
}

// metaDynamicResource is a DRA claim of a container in the v1 answer.
type metaDynamicResource struct {
	ClaimNamespace string            `json:"claimNamespace"`
	ClaimName      string            `json:"claimName"`
	Devices        []metaClaimDevice `json:"devices"`
}

// metaClaimDevice is a device of a claim in the v1 answer.
type metaClaimDevice struct {
	Driver string `json:"driver"`
	Pool   string `json:"pool"`
	Device string `json:"device"`
}

// metaDelegation is one host-device call of pgmetacni.
type metaDelegation struct {
	Plugin        string `json:"plugin"`
	HostInterface string `json:"hostInterface"`
	IfName        string `json:"ifName"`
	Skipped       string `json:"skipped"`
	Error         string `json:"error"`
}

// readMetaRecord returns pgmetacni's entries of the command for the pod, oldest first.
func readMetaRecord(t *testing.T, path, command, pod string) []metaEntry {
	t.Helper()
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []metaEntry
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var e metaEntry
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			t.Fatalf("%s: %v: %s", path, err, sc.Bytes())
		}
		if e.Command == command && e.Pod.Namespace == "default" && e.Pod.Name == pod {
			out = append(out, e)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// hasClaim reports whether the v1 container lists the claim with the device.
func (c metaContainer) hasClaim(claim, pool, device string) bool {
	want := metaClaimDevice{Driver: draDriverName, Pool: pool, Device: device}
	return slices.ContainsFunc(c.DynamicResources, func(dr metaDynamicResource) bool {
		return dr.ClaimNamespace == "default" && dr.ClaimName == claim && len(dr.Devices) == 1 && dr.Devices[0] == want
	})
}

// v1HasClaim reports whether the v1 container lists the claim with the device.
func v1HasClaim(c *v1.ContainerResources, claim, pool, device string) bool {
	return slices.ContainsFunc(c.GetDynamicResources(), func(dr *v1.DynamicResource) bool {
		crs := dr.GetClaimResources()
		return dr.GetClaimNamespace() == "default" && dr.GetClaimName() == claim && len(crs) == 1 &&
			crs[0].GetDriverName() == draDriverName && crs[0].GetPoolName() == pool && crs[0].GetDeviceName() == device
	})
}

// dialPodResources connects to a PodResources socket as multus does.
func dialPodResources(t *testing.T, socket string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(16<<20)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// TestPodResourcesMetaCNI runs a pod with a pod-level DRA network claim through the real kubelet,
// with a meta-CNI plugin (test/cni/metacni) that, like multus, asks podgate's PodResources
// socket for the pod's devices during CNI ADD and moves them into the pod with host-device;
// podgate does not attach the device itself (dra.attach is empty).
func TestPodResourcesMetaCNI(t *testing.T) {
	var metaRecords, prSocket string
	n := startDRANodeWith(t, draNodeOptions{
		cniPlugins: map[string]string{"github.com/podgate/podgate/test/cni/metacni": "pgmetacni"},
		cniChain: func(n *draNode) []string {
			metaRecords = filepath.Join(n.binDir, "metacni-record.jsonl")
			// harness.Start serves PodResources at <dir>/pr.sock; checked below.
			prSocket = filepath.Join(n.pgDir, "pr.sock")
			return []string{fmt.Sprintf(`{"type": "pgmetacni", "podResourcesSocket": %q, "recordFile": %q, "cacheDir": %q}`,
				prSocket, metaRecords, filepath.Join(n.binDir, "metacni-cache"))}
		},
	})
	if n.podgate.PodResourcesSocket != prSocket {
		t.Fatalf("podgate serves PodResources at %s, the CNI plugin was given %s", n.podgate.PodResourcesSocket, prSocket)
	}
	ctx := t.Context()
	if err := n.cluster.StartKubelet(ctx); err != nil {
		t.Fatal(err)
	}
	n.waitSlice(t)
	node := n.cluster.NodeName()

	pod := n.makeDRAPod(t, "meta", 0, `{"interface": {"name": "net1"}}`, true)
	waitWithin(t, 2*time.Minute, "pod meta running", func() bool {
		p, err := n.kube.CoreV1().Pods("default").Get(ctx, "meta", metav1.GetOptions{})
		return err == nil && p.Status.Phase == corev1.PodRunning
	})
	sandboxes, err := n.direct.Runtime.ListPodSandbox(ctx, &runtimeapi.PodSandboxFilter{
		LabelSelector: map[string]string{"io.kubernetes.pod.uid": string(pod.UID)},
	})
	if err != nil || len(sandboxes) != 1 {
		t.Fatalf("pod meta's sandboxes in containerd: %v, %v", sandboxes, err)
	}
	sandboxID := sandboxes[0].Id

	// During CNI ADD, podgate's extension answered with the device's network data, while the
	// sandbox was still being made; the plugin moved the device in as the claim asked.
	adds := readMetaRecord(t, metaRecords, "ADD", "meta")
	if len(adds) == 0 {
		t.Fatal("pgmetacni recorded no ADD for pod meta")
	}
	add := adds[0]
	t.Logf("pgmetacni's ADD: %+v", add)
	if add.ContainerID != sandboxID || len(add.Errors) != 0 {
		t.Errorf("ADD of container %s with errors %v; want the sandbox %s, no errors", add.ContainerID, add.Errors, sandboxID)
	}
	wantDevice := metaDevice{ClaimNamespace: "default", ClaimName: "meta", Driver: draDriverName, Pool: node, Device: "nic0", HostInterface: "pgnic0", InterfaceName: "net1"}
	if ext := add.Extension; ext == nil || !ext.Found || ext.SandboxID != "" || len(ext.Devices) != 1 || ext.Devices[0] != wantDevice {
		t.Errorf("podgate's extension Get during CNI ADD: %+v; want the pod, no sandbox yet, device %+v", ext, wantDevice)
	}
	if want := (metaDelegation{Plugin: "host-device", HostInterface: "pgnic0", IfName: "net1"}); len(add.Delegated) != 1 || add.Delegated[0] != want {
		t.Errorf("ADD delegated %+v, want %+v", add.Delegated, want)
	}
	// The v1 answer lists the pod-level claim under the container, which names no claim.
	if v := add.V1; v == nil || !v.Found || !slices.ContainsFunc(v.Containers, func(c metaContainer) bool {
		return c.Name == "c" && c.hasClaim("meta", node, "nic0")
	}) {
		t.Errorf("v1 Get during CNI ADD: %+v; want claim meta (nic0) under container c", v)
	}
	if existed, ok := n.cniAdd(t, "meta", "pgnic0"); !ok || !existed {
		t.Errorf("CNI ADD of pod meta (pgrecorder, before pgmetacni): recorded %v, pgnic0 existed %v", ok, existed)
	}

	// The device is in the pod under the name the claim asks for, and no longer on the host.
	if out := n.execInPod(t, pod, "cat", "/sys/class/net/net1/ifalias"); strings.TrimSpace(out) != "pgnic0" {
		t.Errorf("in the pod, net1's alias (host-device's record of its host name) is %q, want pgnic0", out)
	}
	if out := n.execInPod(t, pod, "cat", "/sys/class/net/net1/address"); strings.Count(strings.TrimSpace(out), ":") != 5 {
		t.Errorf("in the pod, net1's address is %q", out)
	}
	if hostHasLink("pgnic0") {
		t.Error("pgnic0 is still on the host although moved into the pod")
	}

	// The kubelet-compatible answer after the pod runs: podgate's List has the pod-level claim
	// under the container, merged with the kubelet's own answer.
	conn := dialPodResources(t, n.podgate.PodResourcesSocket)
	list, err := v1.NewPodResourcesListerClient(conn).List(ctx, &v1.ListPodResourcesRequest{})
	if err != nil {
		t.Fatalf("podgate's v1 List: %v", err)
	}
	i := slices.IndexFunc(list.GetPodResources(), func(p *v1.PodResources) bool { return p.GetNamespace() == "default" && p.GetName() == "meta" })
	if i < 0 {
		t.Fatalf("podgate's v1 List lacks pod meta: %v", list)
	}
	if cs := list.GetPodResources()[i].GetContainers(); len(cs) != 1 || cs[0].GetName() != "c" || !v1HasClaim(cs[0], "meta", node, "nic0") {
		t.Errorf("podgate's v1 List of pod meta: %v; want claim meta (nic0) under container c", list.GetPodResources()[i])
	}
	waitMetric(t, n.podgate, "podgate_podresources_kubelet_up 1")
	// For the reader: the kubelet's own answer, which lists a claim only under the containers
	// that name it.
	if kr, err := v1.NewPodResourcesListerClient(dialPodResources(t, n.cluster.PodResourcesSocket())).Get(ctx,
		&v1.GetPodResourcesRequest{PodName: "meta", PodNamespace: "default"}); err != nil {
		t.Logf("the kubelet's own v1 Get of pod meta: %v", err)
	} else {
		t.Logf("the kubelet's own v1 Get of pod meta: %v", kr.GetPodResources())
	}

	// podgate's extension after the pod runs: the sandbox, its network namespace and IPs.
	got, err := pb.NewPodResourcesClient(conn).Get(ctx, &pb.GetRequest{PodName: "meta", PodNamespace: "default"})
	if err != nil {
		t.Fatalf("podgate's extension Get: %v", err)
	}
	p := got.GetPod()
	if sb := p.GetSandbox(); p.GetUid() != string(pod.UID) || sb.GetId() != sandboxID || sb.GetState() != pb.Sandbox_READY ||
		sb.GetNetns() == "" || sb.GetNetns() != add.Netns || len(sb.GetIps()) == 0 {
		t.Errorf("podgate's extension Get of pod meta: %v; want uid %s, sandbox %s ready with its netns and IPs", p, pod.UID, sandboxID)
	}
	for _, ip := range p.GetSandbox().GetIps() {
		if a, err := netip.ParseAddr(strings.Split(ip, "/")[0]); err != nil || !n.rig.Subnet.Contains(a) {
			t.Errorf("pod IP %q is not in the rig's pod subnet %s", ip, n.rig.Subnet)
		}
	}
	if cs := p.GetClaims(); len(cs) != 1 || cs[0].GetName() != "meta" || cs[0].GetPodClaimName() != "nic" || !cs[0].GetPrepared() || len(cs[0].GetDevices()) != 1 {
		t.Errorf("podgate's extension Get: claims %v, want claim meta (pod claim nic) prepared with one device", cs)
	} else if nw := cs[0].GetDevices()[0].GetNetwork(); nw.GetHostInterface() != "pgnic0" || nw.GetInterfaceName() != "net1" || nw.GetAttached() {
		t.Errorf("podgate's extension Get: network data %v, want pgnic0 as net1, not attached by podgate", nw)
	}

	// The pod is deleted: the kubelet stops the sandbox, CNI DEL runs, and pgmetacni gives the
	// device back to the host (pgrecorder, after it in the chain, runs DEL after it and sees
	// pgnic0 there). Then the claim is unprepared and the driver removes the interface.
	n.deletePod(t, pod)
	waitWithin(t, 2*time.Minute, "CNI DEL of pod meta's sandbox", func() bool {
		entries, err := record.Read(n.records)
		return err == nil && len(record.Find(entries, "DEL", "default", "meta")) > 0 && len(readMetaRecord(t, metaRecords, "DEL", "meta")) > 0
	})
	del := readMetaRecord(t, metaRecords, "DEL", "meta")[0]
	t.Logf("pgmetacni's DEL: %+v", del)
	if want := (metaDelegation{Plugin: "host-device", HostInterface: "pgnic0", IfName: "net1"}); del.ContainerID != sandboxID ||
		len(del.Errors) != 0 || len(del.Delegated) != 1 || del.Delegated[0] != want {
		t.Errorf("DEL of container %s delegated %+v, errors %v; want %s, %+v", del.ContainerID, del.Delegated, del.Errors, sandboxID, want)
	}
	entries, err := record.Read(n.records)
	if err != nil {
		t.Fatal(err)
	}
	if recDel := record.Find(entries, "DEL", "default", "meta")[0]; !recDel.Interfaces["pgnic0"] {
		t.Errorf("pgrecorder's DEL, after pgmetacni's: host interfaces %v, want pgnic0 back", recDel.Interfaces)
	}
	waitWithin(t, 3*time.Minute, "claim meta unprepared and pgnic0 removed", func() bool {
		evs := n.driverEvents(t, "meta")
		return slices.ContainsFunc(evs, func(e driver.Event) bool { return e.Op == driver.OpUnprepare && e.Error == "" }) && !hostHasLink("pgnic0")
	})
	waitMetric(t, n.podgate, "podgate_dra_claims_prepared 0")
}
