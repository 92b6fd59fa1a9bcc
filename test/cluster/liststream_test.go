//go:build linux

package cluster_test

import (
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilversion "k8s.io/apimachinery/pkg/util/version"

	"github.com/podgate/podgate/test/cluster"
	"github.com/podgate/podgate/test/rig"
)

// TestListStreamingThroughPodgate runs a kubelet with its CRIListStreaming gate on (alpha from
// 1.36) on podgate in front of containerd 2.4, which serves the Stream* list calls (KEP-5825):
// pods start, are listed by the kubelet and removed; the kubelet's calls reach containerd as
// streams through podgate (podgate counts StreamPodSandboxes and StreamContainers answered OK)
// and the kubelet never falls back to a unary List (its log says so when it does).
func TestListStreamingThroughPodgate(t *testing.T) {
	if v := os.Getenv(cluster.KubeletVersionEnv); v != "" {
		if kv, err := utilversion.ParseGeneric(v); err == nil && kv.LessThan(utilversion.MajorMinor(1, 36)) {
			t.Skipf("%s=%s: the kubelet has CRIListStreaming from 1.36 on", cluster.KubeletVersionEnv, v)
		}
	}
	n := startNodeOf(t, true, cluster.Options{FeatureGates: map[string]bool{"CRIListStreaming": true}},
		func(*cluster.Cluster) string { return "" }, rig.Options{})
	c := n.cluster
	pod := createPod(t, c, testPod("streamed", c.NodeName()))
	waitPod(t, c, pod.Namespace, pod.Name, func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
	var zero int64
	if err := c.Client().CoreV1().Pods(pod.Namespace).Delete(t.Context(), pod.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 2*time.Minute, "the pod's sandbox gone from the runtime through the kubelet's streamed lists", func() (bool, error) {
		m, err := n.podgate.Scrape(t.Context())
		if err != nil {
			return false, err
		}
		removed, _ := m.Value("podgate_cri_requests_total", "method", "RemovePodSandbox", "code", "OK")
		return removed >= 1, nil
	})
	m, err := n.podgate.Scrape(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, method := range []string{"StreamPodSandboxes", "StreamContainers"} {
		if v, _ := m.Value("podgate_cri_requests_total", "method", method, "code", "OK"); v < 1 {
			t.Errorf("podgate counted %v %s calls answered OK, want the kubelet's relists", v, method)
		}
	}
	b, err := os.ReadFile(c.LogFiles()["kubelet"])
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), "falling back to List") {
		t.Errorf("the kubelet fell back to a unary List through podgate:\n%s", grepLines(string(b), "falling back"))
	}
}

// grepLines returns the lines of s that contain sub.
func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
