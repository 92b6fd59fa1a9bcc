//go:build linux

package cluster_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/klog/v2/ktesting"

	"github.com/podgate/podgate/test/harness"
	"github.com/podgate/podgate/test/rig"
	"github.com/podgate/podgate/test/testfs"
)

// podStartBlock is how many measured pods the kubelet starts on one endpoint before it is
// restarted on the other. One: load from the machine's other users comes in bursts of tens of
// seconds, and blocks of 5 pods (25 s) put a burst on one path's pods only (ratios of medians
// 0.90-1.24 between runs of 20 pods each way).
const podStartBlock = 1

// podStartSettle is the pause after a pod's deletion, once its sandbox stopped, before the next
// pod: the kubelet's and podgate's work on the stopped pod (status updates, cgroup removal,
// podgate's undo stages) is over and does not meet the next start.
const podStartSettle = time.Second

// podStartConfig is podgate's configuration in BenchmarkPodStart beside the cluster's plugin
// registry (DRA on): every stage that costs something on a pod start without claims: a pod
// default sysctl, so that every sandbox has one to check and to verify inside the pod, with
// verify: repair; the resources verification (the cgroup check after StartContainer); and the
// kubelet's PodResources socket, which dra.prepare auto asks for pods with claims.
const podStartConfig = `sysctls:
  podDefaults: {net.ipv4.tcp_keepalive_time: "600"}
  verify: repair
resources:
  verify: fail
`

// podStartPaths are the kubelet's runtime endpoints BenchmarkPodStart compares.
var podStartPaths = []string{"direct", "forwarder", "podgate"}

// BenchmarkPodStart times pod starts through a real kubelet 1.36, on the rig's containerd
// directly, on test/forwarder (the minimal raw-codec gRPC forwarder: what any proxy costs) and
// on podgate in front of it with every stage on (podStartConfig; DRA on, the pods have no
// claims), one pod at a time, busybox already imported. Each iteration is one measured pod; the
// paths take turns by blocks of podStartBlock pods (one: pod by pod), so -benchtime 60x is 20
// pods each way.
//
// A kubelet's runtime endpoint is fixed at its start, so the kubelet is restarted on the other
// endpoint at each block (as an operator adopts podgate or rolls it back; podgate keeps running
// throughout, idle while the kubelet talks to containerd), and starts one unmeasured pod first:
// the first pod after a kubelet's start meets its start-up work. One node, one kubelet, one
// containerd: two nodes side by side would be two kubelets, containerds and control planes
// competing for the two cores and differing in state, and two kubelets on one containerd kill
// each other's pods. A restart and a warm-up pod cost ≈ 5 s per measured pod; larger blocks are
// cheaper but let the machine's bursts of load fall on one path (podStartBlock).
//
// A pod start is timed from just before the test's create call of the pod, bound to the node,
// to four points:
//
//   - ready: until the test's watch of the pod sees Ready=True, as a client of the API does.
//     The kubelet 1.36 learns that the container runs from a relist of the pod that the pod
//     worker requests at the end of its sync (PLEGOnDemandRelist, beta and on), not from the
//     periodic relist once a second: ready is 10-20 ms after started, not up to a second.
//   - started: until the container's start, as containerd records it (the task's start, to the
//     nanosecond, on the same clock): the kubelet's pod admission and sync, with its
//     RunPodSandbox, PodSandboxStatus, CreateContainer and StartContainer, without the status
//     round trip through the API server.
//   - sandbox: until containerd created the sandbox's pause container (the sandbox's
//     CreatedAt; containerd 2.4 creates it after the network namespace and the CNI ADD): the
//     kubelet's admission and sync up to its RunPodSandbox, podgate's stages before it forwards
//     the call, containerd's network set-up. runtime is started − sandbox: the pause
//     container's start, podgate's stages after it, then PodSandboxStatus, CreateContainer
//     (which waits for podgate's sysctl verification), StartContainer, and the kubelet between
//     them.
//
// The kubelet's own pod_start SLI (kubelet_pod_start_sli_duration_seconds) is not used: it
// counts from the pod's creationTimestamp, which the API keeps to the second, into a
// histogram whose buckets around a second are 0.5, 1 and 2 s.
//
// It reports each path's median and p90 of each, the ratios podgate/direct, forwarder/direct
// and podgate/forwarder; and prints every pod's figures.
//
//	go test -run '^$' -bench PodStart -benchtime 60x -timeout 40m ./test/cluster
func BenchmarkPodStart(b *testing.B) {
	n := startNodeConfigured(b, true, nil, podStartConfig, rig.Options{})
	restartPodgateWith(b, n, fmt.Sprintf("podResources:\n  kubeletSocket: %s\n", n.cluster.PodResourcesSocket()))
	fwd, err := harness.StartForwarder(b.Context(), testfs.ShortDir(b), n.rig.Endpoint, false)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(fwd.Stop)
	endpoints := map[string]string{"direct": n.rig.Endpoint, "forwarder": fwd.Endpoint, "podgate": n.podgateEndpoint()}
	current := "podgate"
	times := map[string]map[string][]time.Duration{}
	for _, what := range podStartTimes {
		times[what] = map[string][]time.Duration{}
	}
	for i := 0; b.Loop(); i++ {
		path := podStartPaths[i/podStartBlock%len(podStartPaths)]
		if i%podStartBlock == 0 {
			b.StopTimer()
			if path != current {
				switchKubelet(b, n, endpoints[path])
				current = path
			}
			// The first pod after a kubelet's start meets its start-up work.
			startPod(b, n, fmt.Sprintf("ps-warm-%d", i))
			b.StartTimer()
		}
		for what, d := range startPod(b, n, fmt.Sprintf("ps-%s-%d", path, i)) {
			times[what][path] = append(times[what][path], d)
		}
	}
	b.StopTimer()
	for _, what := range podStartTimes {
		p := map[string][2]time.Duration{}
		for _, path := range podStartPaths {
			d := times[what][path]
			// b.Log would keep 10 lines of it.
			fmt.Printf("%s %s (ms, in order): %s\n", path, what, msList(d))
			p[path] = [2]time.Duration{pct(d, 50), pct(d, 90)}
			b.ReportMetric(msOf(p[path][0]), what+"-"+path+"-p50-ms")
			b.ReportMetric(msOf(p[path][1]), what+"-"+path+"-p90-ms")
		}
		for _, r := range [][2]string{{"podgate", "direct"}, {"forwarder", "direct"}, {"podgate", "forwarder"}} {
			if p[r[1]][0] > 0 {
				b.ReportMetric(float64(p[r[0]][0])/float64(p[r[1]][0]), what+"-"+r[0]+"/"+r[1]+"-p50")
				b.ReportMetric(float64(p[r[0]][1])/float64(p[r[1]][1]), what+"-"+r[0]+"/"+r[1]+"-p90")
			}
		}
	}
}

// podStartTimes are the figures of a pod start BenchmarkPodStart reports (see there).
var podStartTimes = []string{"ready", "started", "sandbox", "runtime"}

// switchKubelet restarts the kubelet on endpoint and waits until its Node is Ready.
func switchKubelet(b *testing.B, n *node, endpoint string) {
	b.Helper()
	_, ctx := ktesting.NewTestContext(b)
	if err := n.cluster.StopKubelet(ctx); err != nil {
		b.Fatal(err)
	}
	if err := n.cluster.SetRuntimeEndpoint(endpoint); err != nil {
		b.Fatal(err)
	}
	if err := n.cluster.StartKubelet(ctx); err != nil {
		b.Fatal(err)
	}
}

// startPod creates a test pod, waits until the API shows it Ready, and returns the figures of
// podStartTimes. Then it deletes the pod, waits until its sandbox stopped and for
// podStartSettle.
func startPod(b *testing.B, n *node, name string) map[string]time.Duration {
	b.Helper()
	ctx := b.Context()
	pods := n.cluster.Client().CoreV1().Pods(metav1.NamespaceDefault)
	pod := testPod(name, n.cluster.NodeName())
	t0 := time.Now()
	created, err := pods.Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		b.Fatal(err)
	}
	w, err := pods.Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + name, ResourceVersion: created.ResourceVersion})
	if err != nil {
		b.Fatal(err)
	}
	ready := watchReady(b, w, t0, name)
	w.Stop()

	byUID := map[string]string{"io.kubernetes.pod.uid": string(created.UID)}
	sbs, err := n.containerd.Runtime.ListPodSandbox(ctx, &runtimeapi.PodSandboxFilter{LabelSelector: byUID})
	if err != nil || len(sbs) != 1 {
		b.Fatalf("sandboxes of pod %s in containerd: %v, %v; want one", name, sbs, err)
	}
	sandbox := time.Unix(0, sbs[0].GetCreatedAt()).Sub(t0)
	ctrs, err := n.containerd.Runtime.ListContainers(ctx, &runtimeapi.ContainerFilter{LabelSelector: byUID})
	if err != nil || len(ctrs) != 1 {
		b.Fatalf("containers of pod %s in containerd: %v, %v; want one", name, ctrs, err)
	}
	st, err := n.containerd.Runtime.ContainerStatus(ctx, ctrs[0].Id, false)
	if err != nil {
		b.Fatal(err)
	}
	started := time.Unix(0, st.GetStatus().GetStartedAt()).Sub(t0)

	if err := pods.Delete(ctx, name, *metav1.NewDeleteOptions(0)); err != nil {
		b.Fatal(err)
	}
	waitFor(b, time.Minute, "sandbox of pod "+name+" stopped", func() (bool, error) {
		sbs, err := n.containerd.Runtime.ListPodSandbox(ctx, &runtimeapi.PodSandboxFilter{LabelSelector: byUID})
		if err != nil {
			return false, err
		}
		return !slices.ContainsFunc(sbs, func(sb *runtimeapi.PodSandbox) bool {
			return sb.State == runtimeapi.PodSandboxState_SANDBOX_READY
		}), nil
	})
	time.Sleep(podStartSettle)
	return map[string]time.Duration{"ready": ready, "started": started, "sandbox": sandbox, "runtime": started - sandbox}
}

// watchReady returns the time from t0 until w shows the pod Ready.
func watchReady(b *testing.B, w watch.Interface, t0 time.Time, name string) time.Duration {
	b.Helper()
	timeout := time.NewTimer(2 * time.Minute)
	defer timeout.Stop()
	for {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				b.Fatalf("watch of pod %s ended before it was Ready", name)
			}
			p, isPod := ev.Object.(*corev1.Pod)
			if !isPod {
				b.Fatalf("watch of pod %s: %s %v", name, ev.Type, ev.Object)
			}
			if p.Status.Phase == corev1.PodFailed {
				b.Fatalf("pod %s failed: %s %s", name, p.Status.Reason, p.Status.Message)
			}
			for _, c := range p.Status.Conditions {
				if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
					return time.Since(t0)
				}
			}
		case <-timeout.C:
			b.Fatalf("pod %s not Ready after 2m", name)
		}
	}
}

// pct is the p-th percentile of d (nearest rank), without changing d.
func pct(d []time.Duration, p int) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(d))
	return s[(len(s)-1)*p/100]
}

func msOf(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func msList(d []time.Duration) string {
	s := make([]string, len(d))
	for i, v := range d {
		s[i] = fmt.Sprintf("%.0f", msOf(v))
	}
	return strings.Join(s, " ")
}
