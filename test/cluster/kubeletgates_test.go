//go:build linux

package cluster_test

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/podgate/podgate/podresources/cgroup"
	"github.com/podgate/podgate/test/cluster"
	"github.com/podgate/podgate/test/rig"
)

// readKubeletConfig restarts podgate with resources.kubeletConfig naming the cluster's kubelet
// configuration file, which the cluster writes when it starts the kubelet (after podgate):
// podgate reads it at start-up. It returns podgate's configuration file.
func readKubeletConfig(t *testing.T, n *node) string {
	t.Helper()
	restartPodgateWith(t, n, fmt.Sprintf("resources:\n  kubeletConfig: %s\n", filepath.Join(n.cluster.Dir(), "kubelet.yaml")))
	return n.podgateOpts.Args[slices.Index(n.podgateOpts.Args, "--config")+1]
}

// checkConfig runs podgate check-config on file and returns what it printed.
func checkConfig(t *testing.T, file string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, podgateBin, "check-config", file)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("podgate check-config %s: %v\n%s", file, err, out.String())
	}
	return out.String()
}

// TestKubeletPullCapThroughPodgate: podgate reads the kubelet's pull settings from its
// configuration file. A kubelet whose maxParallelImagePulls (1) is at or below podgate's cap
// (imagePulls.maxParallel 2) makes that cap moot: podgate says so at start-up, in check-config
// and in podgate_image_pull_kubelet_cap{below_podgate="true"}. A kubelet allowing more (5) gets
// no such word: below_podgate="false", and the decision is podgate's caps.
func TestKubeletPullCapThroughPodgate(t *testing.T) {
	for _, tc := range []struct {
		name        string
		kubeletCap  int
		below       string
		writer, say string
	}{
		{"kubelet below podgate", 1, "true", "writer=kubelet podgate=never queues", "imagePulls.maxParallel"},
		{"kubelet above podgate", 5, "false", "writer=podgate podgate=caps", "above podgate's caps"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := startNodeOf(t, true, cluster.Options{KubeletConfig: map[string]any{"serializeImagePulls": false, "maxParallelImagePulls": tc.kubeletCap}},
				func(*cluster.Cluster) string { return "imagePulls:\n  maxParallel: 2\n" }, rig.Options{})
			file := readKubeletConfig(t, n)
			waitFor(t, time.Minute, "podgate's start-up line of the pull decision", func() (bool, error) {
				return strings.Contains(n.podgate.Log.String(), `"Image pull caps"`), nil
			})
			line := grepLines(n.podgate.Log.String(), `"Image pull caps"`)
			if !strings.Contains(line, tc.say) {
				t.Errorf("start-up line %q does not say %q", line, tc.say)
			}
			m, err := n.podgate.Scrape(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			if v, ok := m.Value("podgate_image_pull_kubelet_cap", "below_podgate", tc.below); !ok || v != float64(tc.kubeletCap) {
				t.Errorf("podgate_image_pull_kubelet_cap{below_podgate=%q} = %v (exported %v), want %d", tc.below, v, ok, tc.kubeletCap)
			}
			if out := grepLines(checkConfig(t, file), "Image pull caps"); !strings.Contains(out, tc.writer) || !strings.Contains(out, tc.say) {
				t.Errorf("check-config says %q, want %q and %q", out, tc.writer, tc.say)
			}
			// Pods still start through podgate.
			pod := createPod(t, n.cluster, testPod("after-restart", n.cluster.NodeName()))
			waitPod(t, n.cluster, pod.Namespace, pod.Name, func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
		})
	}
}

// TestKubeletDefaultSysctlsThroughPodgate: a kubelet with DefaultPodSysctls on (alpha, off by
// default in 1.37: the test's kubelet configuration turns it on) and defaultPodSysctls
// tcp_keepalive_time 500 and tcp_fin_timeout 40, beside podgate's sysctls.podDefaults
// tcp_keepalive_time 600 and tcp_keepalive_intvl 30: podgate says at start-up and in
// check-config that the two set tcp_keepalive_time differently and the kubelet's wins. A pod
// without sysctls gets the kubelet's two defaults and podgate's other one, all read back in the
// pod and verified ok by podgate; a pod setting tcp_keepalive_time itself keeps its own value.
func TestKubeletDefaultSysctlsThroughPodgate(t *testing.T) {
	skipKubeletBefore(t, 1, 37, "the kubelet has DefaultPodSysctls from 1.37")
	kubelet := map[string]any{
		"featureGates":      map[string]bool{"DefaultPodSysctls": true},
		"defaultPodSysctls": map[string]string{"net.ipv4.tcp_keepalive_time": "500", "net.ipv4.tcp_fin_timeout": "40"},
	}
	podgate := "sysctls:\n  verify: warn\n  podDefaults:\n    net.ipv4.tcp_keepalive_time: \"600\"\n    net.ipv4.tcp_keepalive_intvl: \"30\"\n"
	n := startNodeOf(t, true, cluster.Options{KubeletConfig: kubelet}, func(*cluster.Cluster) string { return podgate }, rig.Options{})
	file := readKubeletConfig(t, n)
	const conflict = "Default sysctl set by podgate and by the kubelet to different values: the kubelet's wins"
	waitFor(t, time.Minute, "podgate's start-up line of the conflict", func() (bool, error) {
		return strings.Contains(n.podgate.Log.String(), conflict), nil
	})
	if line := grepLines(n.podgate.Log.String(), conflict); !strings.Contains(line, "net.ipv4.tcp_keepalive_time") {
		t.Errorf("start-up line %q does not name net.ipv4.tcp_keepalive_time", line)
	}
	out := checkConfig(t, file)
	if !strings.Contains(out, "net.ipv4.tcp_keepalive_time") || !strings.Contains(grepLines(out, "Default sysctls"), "writer=kubelet+podgate") {
		t.Errorf("check-config does not tell the conflict and both writers:\n%s", out)
	}

	plain := createPod(t, n.cluster, testPod("kubelet-defaults", n.cluster.NodeName()))
	own := testPod("own-value", n.cluster.NodeName())
	own.Spec.SecurityContext = &corev1.PodSecurityContext{Sysctls: []corev1.Sysctl{{Name: "net.ipv4.tcp_keepalive_time", Value: "700"}}}
	own = createPod(t, n.cluster, own)
	for _, tc := range []struct {
		pod  *corev1.Pod
		want map[string]string
	}{
		{plain, map[string]string{"net.ipv4.tcp_keepalive_time": "500", "net.ipv4.tcp_fin_timeout": "40", "net.ipv4.tcp_keepalive_intvl": "30"}},
		{own, map[string]string{"net.ipv4.tcp_keepalive_time": "700", "net.ipv4.tcp_fin_timeout": "40", "net.ipv4.tcp_keepalive_intvl": "30"}},
	} {
		waitPod(t, n.cluster, tc.pod.Namespace, tc.pod.Name, func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
		var sys = podgateList(t, n, tc.pod)[tc.pod.Namespace+"/"+tc.pod.Name].GetSandbox().GetSysctls()
		waitFor(t, time.Minute, "podgate's verification of "+tc.pod.Name+"'s sysctls", func() (bool, error) {
			sys = podgateList(t, n, tc.pod)[tc.pod.Namespace+"/"+tc.pod.Name].GetSandbox().GetSysctls()
			return sys.GetVerification() != "pending", fmt.Errorf("sysctls %v", sys)
		})
		for k, v := range tc.want {
			if sys.GetApplied()[k] != v {
				t.Errorf("pod %s: %s applied %q, want %q (all: %v)", tc.pod.Name, k, sys.GetApplied()[k], v, sys.GetApplied())
			}
		}
		if sys.GetVerification() != "ok" {
			t.Errorf("pod %s: sysctls verification %q (mismatches %v, error %q), want ok: read back in the pod", tc.pod.Name, sys.GetVerification(), sys.GetMismatches(), sys.GetError())
		}
	}
}

// TestKubeletMemoryQoSThroughPodgate: on a cgroup v2 node, a kubelet 1.37 (MemoryQoS beta and
// on) writes memory.min and memory.high itself, and podgate, asked for memory QoS
// (resources.memoryQoS) and reading the kubelet's configuration, writes none
// (podgate_resources_memory_qos_applied_total stays 0) but verifies the container's cgroup
// against the kubelet's values: ok. The kubelet's memory QoS applies only in cgroup v2's unified
// mode (kuberuntime_container_linux.go, generateContainerResources: MemoryQoS and
// isCgroup2UnifiedMode), so on a cgroup v1 or hybrid host there is nothing to test: it skips
// there. It has not run on this project's rig, which is cgroup v1 (hybrid); the unit tests
// (resources TestOneMemoryQoSWriter, kubeletinfo TestMemoryQoSDecision) pin the behaviour.
func TestKubeletMemoryQoSThroughPodgate(t *testing.T) {
	if mode := cgroup.Detect().Mode; mode != cgroup.ModeUnified {
		t.Skipf("this host's cgroups are %s (cgroup v1 controllers), not cgroup v2 unified: the kubelet's MemoryQoS never applies here, so there is no second writer of memory.min/memory.high to test", mode)
	}
	skipKubeletBefore(t, 1, 37, "MemoryQoS is on by default from 1.37")
	n := startNodeOf(t, true, cluster.Options{}, func(*cluster.Cluster) string { return "" }, rig.Options{})
	restartPodgateWith(t, n, fmt.Sprintf("resources:\n  memoryQoS: true\n  kubeletConfig: %s\n", filepath.Join(n.cluster.Dir(), "kubelet.yaml")))
	pod := testPod("memory-qos", n.cluster.NodeName())
	pod.Spec.Containers[0].Resources = corev1.ResourceRequirements{
		Requests: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("64Mi")},
		Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("128Mi")},
	}
	pod = createPod(t, n.cluster, pod)
	waitPod(t, n.cluster, pod.Namespace, pod.Name, func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
	waitFor(t, time.Minute, "podgate's verification of the container's cgroup", func() (bool, error) {
		p := podgateList(t, n, pod)[pod.Namespace+"/"+pod.Name]
		for _, c := range p.GetContainers() {
			if c.GetVerification() == "ok" && c.GetAsked().GetUnified()["memory.min"] != "" {
				return true, nil
			}
		}
		return false, fmt.Errorf("containers %v", p.GetContainers())
	})
	m, err := n.podgate.Scrape(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := m.Value("podgate_resources_memory_qos_applied_total"); v != 0 {
		t.Errorf("podgate_resources_memory_qos_applied_total = %v beside a kubelet writing memory QoS, want 0", v)
	}
}
