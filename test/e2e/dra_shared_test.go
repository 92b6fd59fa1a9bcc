package e2e

import (
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/podgate/podgate/test/dradriver/driver"
	"github.com/podgate/podgate/test/rig"
)

// TestDRASharedClaimWithTheKubelet runs two pods sharing one claim under the real kubelet 1.36,
// podgate with dra.prepare auto (issue 18): the driver sees one prepare, the kubelet's, before
// the first pod's CNI ADD; the first pod deleted, neither the kubelet nor podgate unprepares
// while the second runs; the second deleted, the claim is unprepared once, by the kubelet.
func TestDRASharedClaimWithTheKubelet(t *testing.T) {
	// Nothing attached: one device cannot be moved into two pods.
	n := startDRANodeWith(t, draNodeOptions{})
	if err := n.cluster.StartKubelet(t.Context()); err != nil {
		t.Fatal(err)
	}
	n.waitSlice(t)
	pods := n.sharedClaimPods(t, "shared", 0, "first", "second")
	// One after the other: the kubelet 1.36 marks a claim prepared only once the driver has
	// answered, so two pods of a claim that start at the same moment get a prepare each from
	// the kubelet itself.
	for _, pod := range pods {
		n.bind(t, pod)
		n.waitRunning(t, pod)
		if existed, ok := n.cniAdd(t, pod.Name, "pgnic0"); !ok || !existed {
			t.Errorf("CNI ADD of pod %s: recorded %v, pgnic0 existed %v; want it there before CNI", pod.Name, ok, existed)
		}
	}
	evs := n.driverEvents(t, "shared")
	for _, e := range evs {
		t.Logf("driver: %s %s by %s (created %v)", e.Time.Format(time.StampMicro), e.Op, e.Caller.Comm, e.Created)
	}
	if len(evs) != 1 || evs[0].Op != driver.OpPrepare || evs[0].Error != "" || evs[0].Caller.Comm == "podgate" {
		t.Fatalf("driver events %+v, want one prepare, by the kubelet", evs)
	}
	waitMetric(t, n.podgate, `podgate_dra_pod_claims_prepared_total{by="kubelet"} 2`)

	first, second := pods[0], pods[1]
	if !n.podCgroupExists(t, first.UID) {
		t.Fatalf("pod first runs without a pod cgroup under %s", n.cluster.CgroupRoot())
	}
	n.deletePod(t, first)
	// Both are done with the first pod: the kubelet removes a pod's cgroup only once its pod
	// worker terminated it, unprepare decision included; podgate released its use.
	waitWithin(t, 2*time.Minute, "the kubelet done with pod first (its pod cgroup gone)", func() bool {
		return !n.podCgroupExists(t, first.UID)
	})
	waitMetric(t, n.podgate, `podgate_dra_claims_released_total{how="shared"} 1`)
	if evs := n.driverEvents(t, "shared"); len(evs) != 1 {
		t.Errorf("driver events after pod first is gone, pod second running: %+v; want the one prepare only", evs)
	}
	if !hostHasLink("pgnic0") {
		t.Error("pgnic0 gone from the host while pod second uses it")
	}
	waitMetric(t, n.podgate, "podgate_dra_claims_prepared 1")

	deleted := time.Now()
	n.deletePod(t, second)
	waitWithin(t, 3*time.Minute, "claim shared unprepared after pod second was deleted", func() bool {
		return slices.ContainsFunc(n.driverEvents(t, "shared"), func(e driver.Event) bool { return e.Op == driver.OpUnprepare })
	})
	waitWithin(t, 2*time.Minute, "the kubelet done with pod second (its pod cgroup gone)", func() bool {
		return !n.podCgroupExists(t, second.UID)
	})
	waitMetric(t, n.podgate, "podgate_dra_claims_prepared 0")
	evs = n.driverEvents(t, "shared")
	for _, e := range evs {
		t.Logf("driver: %s %s by %s (error %q)", e.Time.Format(time.StampMicro), e.Op, e.Caller.Comm, e.Error)
	}
	if len(evs) != 2 || evs[1].Op != driver.OpUnprepare || evs[1].Error != "" || evs[1].Caller.Comm == "podgate" || evs[1].Time.Before(deleted) {
		t.Errorf("driver events %+v, want the prepare and then one unprepare, by the kubelet, after pod second's deletion", evs)
	}
	if hostHasLink("pgnic0") {
		t.Error("pgnic0 still on the host after the claim's unprepare")
	}
}

// sharedClaimPods makes claim (allocated to device nicN of the driver, as the scheduler would)
// and pods of those names using it, and reserves the claim for all of them; bind binds each, in
// the order that keeps the kubelet from trying to prepare an unreserved claim (kubernetes#139836).
func (n *draNode) sharedClaimPods(t *testing.T, claimName string, device int, names ...string) []*corev1.Pod {
	t.Helper()
	ctx, node := t.Context(), n.cluster.NodeName()
	claims := n.kube.ResourceV1().ResourceClaims("default")
	claim, err := claims.Create(ctx, &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: claimName},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
			Name: "nic", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: draDriverName},
		}}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var pods []*corev1.Pod
	for _, name := range names {
		pod, err := n.kube.CoreV1().Pods("default").Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: corev1.PodSpec{
				AutomountServiceAccountToken:  ptr.To(false),
				TerminationGracePeriodSeconds: ptr.To[int64](0),
				ResourceClaims:                []corev1.PodResourceClaim{{Name: "nic", ResourceClaimName: ptr.To(claimName)}},
				Containers: []corev1.Container{{
					Name: "c", Image: rig.BusyboxImage, ImagePullPolicy: corev1.PullNever, Command: []string{"sleep", "3600"},
					Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "nic"}}},
				}},
			},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		pods = append(pods, pod)
		claim.Status.ReservedFor = append(claim.Status.ReservedFor, resourceapi.ResourceClaimConsumerReference{Resource: "pods", Name: pod.Name, UID: pod.UID})
	}
	claim.Status.Allocation = &resourceapi.AllocationResult{
		Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{{
			Request: "nic", Driver: draDriverName, Pool: node, Device: fmt.Sprintf("nic%d", device),
		}}},
		NodeSelector: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
			MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{node}}},
		}}},
	}
	if _, err := claims.UpdateStatus(ctx, claim, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("allocate and reserve claim %s: %v", claimName, err)
	}
	return pods
}

// bind binds the pod to the node, as the scheduler would.
func (n *draNode) bind(t *testing.T, pod *corev1.Pod) {
	t.Helper()
	node := n.cluster.NodeName()
	if err := n.kube.CoreV1().Pods(pod.Namespace).Bind(t.Context(), &corev1.Binding{
		ObjectMeta: metav1.ObjectMeta{Name: pod.Name, UID: pod.UID},
		Target:     corev1.ObjectReference{Kind: "Node", Name: node},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("bind pod %s: %v", pod.Name, err)
	}
	pod.Spec.NodeName = node
}

// waitRunning waits until the pod is Running.
func (n *draNode) waitRunning(t *testing.T, pod *corev1.Pod) {
	t.Helper()
	waitWithin(t, 2*time.Minute, "pod "+pod.Name+" running", func() bool {
		p, err := n.kube.CoreV1().Pods(pod.Namespace).Get(t.Context(), pod.Name, metav1.GetOptions{})
		return err == nil && p.Status.Phase == corev1.PodRunning
	})
}

// podCgroupExists reports whether the kubelet's cgroup of the pod exists in any hierarchy. The
// kubelet removes it once the pod's worker has terminated the pod, which includes the kubelet's
// unprepare of the pod's claims (or its decision not to, for a claim another pod uses).
func (n *draNode) podCgroupExists(t *testing.T, uid types.UID) bool {
	t.Helper()
	root := n.cluster.CgroupRoot()
	for _, pattern := range []string{"/kubepods/pod", "/kubepods/*/pod"} {
		m, err := filepath.Glob("/sys/fs/cgroup/*" + root + pattern + string(uid))
		if err != nil {
			t.Fatal(err)
		}
		if len(m) > 0 {
			return true
		}
	}
	return false
}
