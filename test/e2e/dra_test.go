package e2e

import (
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/podgate/podgate/test/dradriver/driver"
)

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
	// Beside a kubelet 1.36 (dra.prepare: auto) the kubelet prepares, before RunPodSandbox, and
	// podgate does not repeat it: the driver sees one prepare for this pod start.
	prepares := n.driverEvents(t, "web")
	for _, e := range prepares {
		t.Logf("driver: %s %s by %s (created %v)", e.Time.Format(time.StampMicro), e.Op, e.Caller.Comm, e.Created)
	}
	if !slices.EqualFunc(prepares, []driver.Event{{Op: driver.OpPrepare}}, func(e, want driver.Event) bool { return e.Op == want.Op }) ||
		prepares[0].Caller.Comm == "podgate" {
		t.Errorf("driver events %+v, want one prepare, by the kubelet", prepares)
	}
	// podgate still knows the claim's devices (it attached pgnic0 above) and counts it.
	waitMetric(t, n.podgate, "podgate_dra_claims_prepared 1")
	waitMetric(t, n.podgate, `podgate_dra_pod_claims_prepared_total{by="kubelet"} 1`)

	n.deletePod(t, pod)
	// The kubelet stops the sandbox through podgate, which gives the device back first.
	waitMetric(t, n.podgate, `podgate_dra_attach_operations_total{operation="detach",result="success"} 1`)
	waitWithin(t, 3*time.Minute, "claim web unprepared after its pod was deleted", func() bool {
		evs := n.driverEvents(t, "web")
		return slices.ContainsFunc(evs, func(e driver.Event) bool { return e.Op == driver.OpUnprepare && e.Error == "" }) && !hostHasLink("pgnic0")
	})
	waitMetric(t, n.podgate, "podgate_dra_claims_prepared 0")
	// The unprepare is the kubelet's alone: podgate leaves what it did not prepare.
	for _, e := range n.driverEvents(t, "web") {
		if e.Op == driver.OpUnprepare && e.Caller.Comm == "podgate" {
			t.Errorf("podgate unprepared a claim the kubelet prepared: %+v", e)
		}
	}
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
