//go:build linux

package cluster_test

import (
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2/ktesting"
)

// TestAdoptAndRemoveOnALiveNode follows the runbook's adoption and rollback on a node whose
// kubelet runs pods on containerd directly: stop the kubelet, start podgate, point the kubelet
// at podgate, start it; later the reverse. Only the kubelet restarts: every pod keeps its
// sandbox and containers (same IDs, same restart counts), podgate rebuilds its registry from
// the runtime and marks the pods it did not see start as adopted with unverified sysctls, and a
// new pod starts through podgate, then, after the rollback, past it.
func TestAdoptAndRemoveOnALiveNode(t *testing.T) {
	n := startNodeWith(t, false, nil)
	_, ctx := ktesting.NewTestContext(t)
	client := n.cluster.Client()
	create := func(pod *corev1.Pod) *corev1.Pod {
		t.Helper()
		if _, err := client.CoreV1().Pods(pod.Namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		return waitPod(t, n.cluster, pod.Namespace, pod.Name, func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
	}
	switchKubelet := func(endpoint string) {
		t.Helper()
		start := time.Now()
		if err := n.cluster.StopKubelet(ctx); err != nil {
			t.Fatal(err)
		}
		if err := n.cluster.SetRuntimeEndpoint(endpoint); err != nil {
			t.Fatal(err)
		}
		if err := n.cluster.StartKubelet(ctx); err != nil {
			t.Fatal(err)
		}
		t.Logf("kubelet on %s, Ready after %s", endpoint, time.Since(start).Round(time.Millisecond))
	}
	unchanged := func(when string, pods []*corev1.Pod, before map[string]podState) {
		t.Helper()
		for _, pod := range pods {
			if got, want := statePod(t, n, pod), before[pod.Name]; got.sandbox != want.sandbox || !slices.Equal(got.containers, want.containers) || got.restarts != want.restarts {
				t.Errorf("pod %s %s: %+v, want %+v (nothing restarted)", pod.Name, when, got, want)
			}
		}
	}

	sysctlPod := testPod("adopt-sysctl", n.cluster.NodeName())
	sysctlPod.Spec.SecurityContext = &corev1.PodSecurityContext{Sysctls: []corev1.Sysctl{{Name: "net.ipv4.tcp_keepalive_time", Value: "600"}}}
	pods := []*corev1.Pod{create(testPod("adopt-plain", n.cluster.NodeName())), create(sysctlPod)}
	before := map[string]podState{}
	for _, p := range pods {
		before[p.Name] = statePod(t, n, p)
		if before[p.Name].sandbox == "" || len(before[p.Name].containers) != 1 {
			t.Fatalf("pod %s before adoption: %+v, want a sandbox and one container", p.Name, before[p.Name])
		}
	}

	// Adoption: podgate first, then the kubelet on podgate's socket.
	n.startPodgate(t)
	switchKubelet(n.podgateEndpoint())
	fresh := create(testPod("adopt-new", n.cluster.NodeName()))
	unchanged("after the adoption", pods, before)
	known := podgateList(t, n, append(slices.Clone(pods), fresh)...)
	for _, p := range pods {
		got := known[p.Namespace+"/"+p.Name]
		if got.GetSandbox().GetId() != before[p.Name].sandbox {
			t.Errorf("podgate after the adoption: pod %s/%s has sandbox %s, want %s", p.Namespace, p.Name, got.GetSandbox().GetId(), before[p.Name].sandbox)
			continue
		}
		if !got.GetSandbox().GetAdopted() || got.GetSandbox().GetSysctls().GetVerification() != "unverified" {
			t.Errorf("pod %s, started before podgate: adopted=%v, sysctls %q; want adopted, unverified",
				p.Name, got.GetSandbox().GetAdopted(), got.GetSandbox().GetSysctls().GetVerification())
		}
	}
	// What the runtime was given is known; whether it holds in the pod was never checked.
	if got := known["default/adopt-sysctl"].GetSandbox().GetSysctls().GetApplied(); got["net.ipv4.tcp_keepalive_time"] != "600" {
		t.Errorf("adopted pod's sysctls as podgate knows them: %v, want net.ipv4.tcp_keepalive_time=600 from the runtime", got)
	}
	if got := known["default/adopt-new"].GetSandbox(); got == nil || got.GetAdopted() {
		t.Errorf("pod started through podgate: %v, want known and not adopted", got)
	}
	pods = append(pods, fresh)
	before[fresh.Name] = statePod(t, n, fresh)

	// Rollback: the kubelet back on containerd's socket, then podgate stopped.
	switchKubelet(n.rig.Endpoint)
	if code, err := n.podgate.Stop(30 * time.Second); err != nil || code != 0 {
		t.Fatalf("podgate stop after the rollback: exit %d, %v", code, err)
	}
	n.podgate = nil
	create(testPod("after-rollback", n.cluster.NodeName()))
	unchanged("after the rollback", pods, before)
}
