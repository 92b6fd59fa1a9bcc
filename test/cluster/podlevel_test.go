//go:build linux

package cluster_test

import (
	"fmt"
	"maps"
	"os"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	utilversion "k8s.io/apimachinery/pkg/util/version"

	pb "github.com/podgate/podgate/podresources/api/v1alpha1"
	"github.com/podgate/podgate/test/cluster"
	"github.com/podgate/podgate/test/rig"
)

// skipKubeletBefore skips the test on a matrix cell whose kubelet is older than major.minor.
func skipKubeletBefore(t *testing.T, major, minor uint, why string) {
	t.Helper()
	if v := os.Getenv(cluster.KubeletVersionEnv); v != "" {
		if kv, err := utilversion.ParseGeneric(v); err == nil && kv.LessThan(utilversion.MajorMinor(major, minor)) {
			t.Skipf("%s=%s: %s", cluster.KubeletVersionEnv, v, why)
		}
	}
}

// TestPodLevelResourcesThroughPodgate: a pod with pod-level resources (spec.resources;
// PodLevelResources, beta and on in the kubelet 1.36 and 1.37) started through podgate: podgate's
// PodResources extension reports its pod-level requests and limits as the kubelet sent them with
// RunPodSandbox. An in-place pod-level resize (the pod's resize subresource, as kubectl patch
// --subresource resize; InPlacePodLevelResourcesVerticalScaling) reaches podgate as
// UpdatePodSandboxResources, which goes on to containerd; the extension then shows the new
// requests and limits, and the pod cgroup, read once the kubelet has written it, verified ok.
func TestPodLevelResourcesThroughPodgate(t *testing.T) {
	skipKubeletBefore(t, 1, 36, "in-place pod-level resizes are beta and on from 1.36")
	n := startNodeOf(t, true, cluster.Options{}, func(*cluster.Cluster) string { return "" }, rig.Options{})
	c := n.cluster
	q := resource.MustParse
	pod := testPod("podlevel", c.NodeName())
	pod.Spec.Resources = &corev1.ResourceRequirements{
		Requests: corev1.ResourceList{corev1.ResourceCPU: q("200m"), corev1.ResourceMemory: q("64Mi")},
		Limits:   corev1.ResourceList{corev1.ResourceCPU: q("500m"), corev1.ResourceMemory: q("128Mi")},
	}
	pod = createPod(t, c, pod)
	waitPod(t, c, pod.Namespace, pod.Name, func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })

	got := podgateList(t, n, pod)[pod.Namespace+"/"+pod.Name].GetPodResources()
	if want := map[string]string{"cpu": "200m"}; !maps.Equal(got.GetRequests(), want) {
		t.Errorf("podgate's pod-level requests %v, want %v (the runtime is not told the memory request)", got.GetRequests(), want)
	}
	if want := map[string]string{"cpu": "500m", "memory": "128Mi"}; !maps.Equal(got.GetLimits(), want) {
		t.Errorf("podgate's pod-level limits %v, want %v", got.GetLimits(), want)
	}
	t.Logf("at start: %v", got)

	patch := `{"spec":{"resources":{"requests":{"cpu":"300m","memory":"64Mi"},"limits":{"cpu":"800m","memory":"192Mi"}}}}`
	if _, err := c.Client().CoreV1().Pods(pod.Namespace).Patch(t.Context(), pod.Name, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}, "resize"); err != nil {
		t.Fatalf("resize: %v", err)
	}
	waitFor(t, 2*time.Minute, "podgate to see the resize and verify the pod cgroup", func() (bool, error) {
		p := podgateList(t, n, pod)[pod.Namespace+"/"+pod.Name].GetPodResources()
		if p.GetLimits()["memory"] != "192Mi" || p.GetLimits()["cpu"] != "800m" || p.GetVerification() == "unverified" {
			return false, fmt.Errorf("pod-level resources %v", p)
		}
		got = p
		return true, nil
	})
	t.Logf("after the resize: %v", got)
	if got.GetVerification() != "ok" || got.GetRequests()["cpu"] != "300m" {
		t.Errorf("after the resize: verification %q (mismatches %v, error %q), requests %v; want ok, cpu 300m", got.GetVerification(), got.GetMismatches(), got.GetError(), got.GetRequests())
	}
	m, err := n.podgate.Scrape(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := m.Value("podgate_cri_requests_total", "method", "UpdatePodSandboxResources", "code", "OK"); v < 1 {
		t.Errorf("podgate counted %v UpdatePodSandboxResources answered OK, want the resize's", v)
	}
	if v, _ := m.Value("podgate_resources_pod_verifications_total", "after", "update", "result", "ok"); v < 1 {
		t.Errorf("podgate_resources_pod_verifications_total{after=update,result=ok} = %v, want at least 1", v)
	}
	if v, _ := m.Value("podgate_resources_pod_verifications_total", "after", "update", "result", "mismatch"); v != 0 {
		t.Errorf("podgate_resources_pod_verifications_total{after=update,result=mismatch} = %v, want 0:\n%s", v, grepLines(n.podgate.Log.String(), "Pod's cgroup"))
	}
	resized := waitPod(t, c, pod.Namespace, pod.Name, func(p *corev1.Pod) bool {
		return p.Status.Resources != nil && p.Status.Resources.Limits.Memory().Cmp(q("192Mi")) == 0
	})
	t.Logf("the kubelet reports the pod resized: %v", resized.Status.Resources)
}

// TestPodResizeWithoutPodLimitsThroughPodgate: a pod of two containers of which only one has
// limits has no pod-level limits, so its pod cgroup has none (the kubelet 1.38 also leaves them
// out of RunPodSandbox, kubernetes#141014). An in-place resize of that container's CPU request
// changes the pod cgroup's CPU shares, and the kubelet tells the runtime with
// UpdatePodSandboxResources the pod cgroup as it is to be: its quota and memory limit read back
// from the cgroup (-1, and on cgroup v1 the kernel's unlimited 9223372036854771712). podgate
// verifies the pod cgroup against that once the kubelet has written it: ok, no limit where the
// kubelet asked none.
func TestPodResizeWithoutPodLimitsThroughPodgate(t *testing.T) {
	skipKubeletBefore(t, 1, 36, "in-place pod-level resizes reach the runtime from 1.36")
	n := startNodeOf(t, true, cluster.Options{}, func(*cluster.Cluster) string { return "" }, rig.Options{})
	c := n.cluster
	q := resource.MustParse
	pod := testPod("partlimited", c.NodeName())
	free := pod.Spec.Containers[0]
	free.Name = "free"
	pod.Spec.Containers[0].Resources = corev1.ResourceRequirements{
		Requests: corev1.ResourceList{corev1.ResourceCPU: q("100m"), corev1.ResourceMemory: q("32Mi")},
		Limits:   corev1.ResourceList{corev1.ResourceCPU: q("500m"), corev1.ResourceMemory: q("64Mi")},
	}
	pod.Spec.Containers = append(pod.Spec.Containers, free)
	pod = createPod(t, c, pod)
	waitPod(t, c, pod.Namespace, pod.Name, func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
	t.Logf("at start: %v", podgateList(t, n, pod)[pod.Namespace+"/"+pod.Name].GetPodResources())

	patch := `{"spec":{"containers":[{"name":"main","resources":{"requests":{"cpu":"300m"}}}]}}`
	if _, err := c.Client().CoreV1().Pods(pod.Namespace).Patch(t.Context(), pod.Name, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}, "resize"); err != nil {
		t.Fatalf("resize: %v", err)
	}
	var got *pb.PodLevelResources
	waitFor(t, 2*time.Minute, "podgate to see the resize and verify the pod cgroup", func() (bool, error) {
		p := podgateList(t, n, pod)[pod.Namespace+"/"+pod.Name].GetPodResources()
		if p.GetResizes() == 0 || p.GetVerification() == "unverified" {
			return false, fmt.Errorf("pod-level resources %v", p)
		}
		got = p
		return true, nil
	})
	t.Logf("after the resize: %v", got)
	if got.GetVerification() != "ok" || len(got.GetLimits()) != 0 {
		t.Errorf("after the resize: verification %q (mismatches %q, error %q), limits %v; want ok, no limits\n%s",
			got.GetVerification(), got.GetMismatches(), got.GetError(), got.GetLimits(), grepLines(n.podgate.Log.String(), "Pod's cgroup"))
	}
	m, err := n.podgate.Scrape(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := m.Value("podgate_resources_pod_verifications_total", "after", "update", "result", "mismatch"); v != 0 {
		t.Errorf("podgate_resources_pod_verifications_total{after=update,result=mismatch} = %v, want 0", v)
	}
}
