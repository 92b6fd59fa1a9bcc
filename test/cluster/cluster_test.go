//go:build linux

package cluster_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/klog/v2/ktesting"

	"github.com/podgate/podgate/test/cluster"
	"github.com/podgate/podgate/test/harness"
	"github.com/podgate/podgate/test/rig"
	"github.com/podgate/podgate/test/testfs"
)

// podgateBin is the podgate binary built once for the package's tests.
var podgateBin string

func TestMain(m *testing.M) {
	// Without root or the binaries every test skips: do not spend a minute building podgate.
	build := os.Geteuid() == 0 && cluster.CheckInstalled() == nil && rig.CheckInstalled() == nil
	os.Exit(harness.RunTests(m, &podgateBin, build))
}

// node is a rig's containerd, podgate in front of it and a cluster whose kubelet talks to podgate.
type node struct {
	rig     *rig.Rig
	podgate *harness.Podgate
	cluster *cluster.Cluster
	// containerd talks to containerd directly, bypassing podgate and the kubelet.
	containerd *rig.Client
	// podgateOpts start podgate again (restartPodgate).
	podgateOpts harness.Options
}

// startNode starts the whole stack in the order the DRA tests need: the API server first, so
// that podgate gets its kubeconfig, then podgate, then the kubelet on podgate's socket.
func startNode(t testing.TB) *node {
	t.Helper()
	return startNodeWith(t, true, nil)
}

// startNodeWith is startNode; without withPodgate, the kubelet runs on containerd's socket and
// podgate is not started (startPodgate starts it, with the same options). kubeletConfig holds
// KubeletConfiguration fields that replace the cluster's (cluster.Options.KubeletConfig).
func startNodeWith(t testing.TB, withPodgate bool, kubeletConfig map[string]any) *node {
	t.Helper()
	return startNodeConfigured(t, withPodgate, kubeletConfig, "", rig.Options{})
}

// startNodeConfigured is startNodeWith; podgateConfig is more of podgate's configuration file
// (top-level YAML keys other than dra), and rigOpts the rig's options.
func startNodeConfigured(t testing.TB, withPodgate bool, kubeletConfig map[string]any, podgateConfig string, rigOpts rig.Options) *node {
	t.Helper()
	return startNodeOf(t, withPodgate, cluster.Options{KubeletConfig: kubeletConfig},
		func(*cluster.Cluster) string { return podgateConfig }, rigOpts)
}

// startNodeOf is startNodeConfigured with the cluster's options (its CRIEndpoint and
// DeferKubelet are set here), and podgate's configuration made from the cluster, e.g. to name
// a socket under the kubelet's root directory.
func startNodeOf(t testing.TB, withPodgate bool, opts cluster.Options, podgateConfig func(*cluster.Cluster) string, rigOpts rig.Options) *node {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: the rig runs containerd and the kubelet creates cgroups")
	}
	if err := cluster.CheckInstalled(); err != nil {
		t.Skip(err.Error())
	}
	r := rig.StartWith(t, rigOpts)
	pgDir := testfs.ShortDir(t)
	// podgate starts after the API server (it needs the kubeconfig) but must stop after the
	// cluster, whose Down has the kubelet stop the pods through it: its cleanup is registered
	// before cluster.Start, and cleanups run last-in first-out. The check that the cluster left
	// no cgroups runs there too, after Down.
	var c *cluster.Cluster
	n := &node{rig: r}
	t.Cleanup(func() {
		if c != nil {
			checkCgroupsGone(t, c.CgroupRoot())
		}
		p := n.podgate // the last one started
		if p == nil {
			return
		}
		code, err := p.Stop(30 * time.Second)
		if err != nil || code != 0 {
			t.Errorf("podgate stop: exit %d, %v", code, err)
		}
		if t.Failed() {
			t.Logf("podgate log:\n%s", p.Log)
		}
	})
	start := time.Now()
	endpoint := r.Endpoint
	if withPodgate {
		endpoint = "unix://" + pgDir + "/cri.sock" // where harness.Start puts it
	}
	opts.CRIEndpoint, opts.DeferKubelet = endpoint, true
	c = cluster.Start(t, opts)
	controlPlane := time.Since(start)
	// podgate watches this cluster's plugin registry, not the host's /var/lib/kubelet.
	config := filepath.Join(pgDir, "config.yaml")
	more := podgateConfig(c)
	if !strings.Contains(more, "kubeletPodsAPISocket:") {
		// As on a node whose kubelet has the default root dir: the default
		// kubeletPodsAPISocket is where that kubelet serves its Pods API (1.37 on).
		more += "kubeletPodsAPISocket: " + podsAPISocket(c) + "\n"
	}
	err := os.WriteFile(config, fmt.Appendf(nil, "apiVersion: podgate.dev/v1alpha1\nkind: AgentConfiguration\ndra:\n  pluginRegistryDir: %s\n%s", c.PluginRegistryDir(), more), 0o644)
	if err != nil {
		t.Fatal(err)
	}
	n.podgateOpts = harness.Options{
		Dir:             pgDir,
		RuntimeEndpoint: r.Endpoint,
		Args:            []string{"--config", config, "--kubeconfig", c.Kubeconfig(), "--node-name", c.NodeName()},
	}
	if withPodgate {
		n.startPodgate(t)
	}
	kstart := time.Now()
	_, ctx := ktesting.NewTestContext(t)
	if err := c.StartKubelet(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("cluster up: control plane %s, kubelet ready %s, total %s",
		controlPlane.Round(time.Millisecond), time.Since(kstart).Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
	n.cluster, n.containerd = c, rig.Connect(t, r.Endpoint)
	return n
}

// startPodgate starts podgate with n.podgateOpts; it becomes n.podgate, which the node's cleanup
// stops.
func (n *node) startPodgate(t testing.TB) {
	t.Helper()
	p, err := harness.Start(t.Context(), podgateBin, n.podgateOpts)
	if err != nil {
		t.Fatal(err)
	}
	n.podgate = p
	if want := n.podgateEndpoint(); p.Endpoint != want {
		t.Fatalf("podgate serves %s, the kubelet is configured with %s", p.Endpoint, want)
	}
}

// podgateEndpoint is where podgate serves CRI on this node.
func (n *node) podgateEndpoint() string { return "unix://" + n.podgateOpts.Dir + "/cri.sock" }

// TestPodThroughPodgate runs a pod on a real kubelet whose runtime is podgate: the pod is
// Running, containerd has its sandbox, podgate's pipeline started it, and deleting the pod
// removes the sandbox from containerd.
func TestPodThroughPodgate(t *testing.T) {
	n := startNode(t)
	_, ctx := ktesting.NewTestContext(t)
	client := n.cluster.Client()

	pod := testPod("sleeper", n.cluster.NodeName())
	start := time.Now()
	if _, err := client.CoreV1().Pods(pod.Namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create pod: %v", err)
	}
	running := waitPod(t, n.cluster, pod.Namespace, pod.Name, func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
	t.Logf("pod running after %s", time.Since(start).Round(time.Millisecond))

	sb := findSandbox(t, n.containerd, string(running.UID))
	if sb == nil {
		t.Fatalf("no sandbox of pod %s (uid %s) in containerd", pod.Name, running.UID)
	}
	if sb.State != runtimeapi.PodSandboxState_SANDBOX_READY {
		t.Errorf("sandbox %s state %s, want ready", sb.Id, sb.State)
	}
	want := fmt.Sprintf(`"Pod sandbox started" pod="%s/%s"`, pod.Namespace, pod.Name)
	if log := n.podgate.Log.String(); !strings.Contains(log, want) || !strings.Contains(log, sb.Id) {
		t.Errorf("podgate log lacks %s with sandbox %s:\n%s", want, sb.Id, log)
	}

	start = time.Now()
	if err := client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, *metav1.NewDeleteOptions(0)); err != nil {
		t.Fatalf("delete pod: %v", err)
	}
	// The kubelet stops the sandbox at once, and removes it in its container garbage
	// collection, which runs once a minute from its start (ContainerGCPeriod, not configurable).
	waitFor(t, time.Minute, fmt.Sprintf("sandbox %s stopped", sb.Id), func() (bool, error) {
		sb := findSandbox(t, n.containerd, string(running.UID))
		return sb == nil || sb.State == runtimeapi.PodSandboxState_SANDBOX_NOTREADY, nil
	})
	t.Logf("sandbox stopped %s after the delete", time.Since(start).Round(time.Millisecond))
	waitFor(t, 2*time.Minute, fmt.Sprintf("sandbox %s gone from containerd", sb.Id), func() (bool, error) {
		return findSandbox(t, n.containerd, string(running.UID)) == nil, nil
	})
	t.Logf("sandbox removed %s after the delete", time.Since(start).Round(time.Millisecond))
	if !strings.Contains(n.podgate.Log.String(), `"Pod sandbox removed" podSandboxID="`+sb.Id) {
		t.Errorf("podgate log lacks the removal of sandbox %s", sb.Id)
	}
	if _, err := client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("pod still in the API after its deletion: %v", err)
	}
}

// TestKubeletRestart stops the kubelet under a running pod (one with a service-account token,
// in a namespace made with CreateNamespace) and starts it again. It checks what the host and the
// API server show, not what the harness did: with the kubelet stopped, no kubelet process of the
// node is left and nobody renews the node's Lease, while the pod's sandbox and container keep
// running in containerd; after the start, a new kubelet process renews the Lease, posts Ready, and
// adopts the pod's sandbox instead of starting another. The pod is left for the cluster's Down,
// which has the kubelet stop it through podgate.
func TestKubeletRestart(t *testing.T) {
	n := startNodeWith(t, true, map[string]any{"nodeLeaseDurationSeconds": leaseSeconds})
	_, ctx := ktesting.NewTestContext(t)
	client := n.cluster.Client()

	// In a namespace of its own, with the service-account token mounted: CreateNamespace gives
	// the namespace what the controller-manager would.
	if _, err := n.cluster.CreateNamespace(ctx, "restart"); err != nil {
		t.Fatal(err)
	}
	pod := testPod("survivor", n.cluster.NodeName())
	pod.Namespace = "restart"
	pod.Spec.AutomountServiceAccountToken = nil
	if _, err := client.CoreV1().Pods(pod.Namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create pod: %v", err)
	}
	running := waitPod(t, n.cluster, pod.Namespace, pod.Name, func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
	if len(running.Spec.Volumes) == 0 || running.Spec.Volumes[0].Projected == nil {
		t.Errorf("pod volumes %v, want the projected service-account token", running.Spec.Volumes)
	}
	before := findSandbox(t, n.containerd, string(running.UID))
	if before == nil {
		t.Fatalf("no sandbox of pod %s in containerd", pod.Name)
	}

	// The running kubelet, as the checks after the stop see it: one process, renewing the Lease.
	pids := kubeletPids(t, n.cluster)
	if len(pids) != 1 {
		t.Fatalf("kubelet processes of the cluster: %v, want one", pids)
	}
	first := leaseRenewTime(t, n.cluster)
	waitFor(t, 5*leaseRenewal, "the kubelet renewing its Lease", func() (bool, error) {
		return leaseRenewTime(t, n.cluster).After(first), nil
	})

	if err := n.cluster.StopKubelet(ctx); err != nil {
		t.Fatalf("stop kubelet: %v", err)
	}
	if left := kubeletPids(t, n.cluster); len(left) > 0 {
		t.Errorf("kubelet processes after StopKubelet: %v (the kubelet was %v)", left, pids)
	}
	stopped := leaseNotRenewed(t, n.cluster, 3*leaseRenewal)
	if sb := findSandbox(t, n.containerd, string(running.UID)); sb == nil || sb.State != runtimeapi.PodSandboxState_SANDBOX_READY {
		t.Errorf("sandbox with the kubelet stopped: %v, want %s still ready", sb, before.Id)
	}
	ctrs, err := n.containerd.Runtime.ListContainers(ctx, &runtimeapi.ContainerFilter{PodSandboxId: before.Id})
	if err != nil {
		t.Fatalf("list containers: %v", err)
	}
	if len(ctrs) != 1 || ctrs[0].State != runtimeapi.ContainerState_CONTAINER_RUNNING {
		t.Errorf("containers of sandbox %s with the kubelet stopped: %v, want one running", before.Id, ctrs)
	}

	start := time.Now()
	if err := n.cluster.StartKubelet(ctx); err != nil {
		t.Fatalf("start kubelet: %v", err)
	}
	t.Logf("kubelet ready again after %s", time.Since(start).Round(time.Millisecond))
	if again := kubeletPids(t, n.cluster); len(again) != 1 || again[0] == pids[0] {
		t.Errorf("kubelet processes after StartKubelet: %v, want one other than %v", again, pids)
	}
	waitFor(t, 5*leaseRenewal, "the new kubelet renewing the Lease", func() (bool, error) {
		return leaseRenewTime(t, n.cluster).After(stopped), nil
	})
	// The API keeps heartbeats to the second; the old kubelet's last one is seconds older.
	node, err := client.CoreV1().Nodes().Get(ctx, n.cluster.NodeName(), metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get node: %v", err)
	}
	if ready := readyCondition(node); ready == nil || ready.Status != corev1.ConditionTrue || ready.LastHeartbeatTime.Before(&metav1.Time{Time: start.Truncate(time.Second)}) {
		t.Errorf("node Ready condition after the restart: %+v, want True with a heartbeat from %s on", ready, start.Truncate(time.Second).Format(time.RFC3339))
	}

	// The new kubelet's first sync of the pod happens after the node is Ready; give it time to
	// make (wrongly) a second sandbox before checking there is none.
	waitPod(t, n.cluster, pod.Namespace, pod.Name, func(p *corev1.Pod) bool {
		return p.Status.Phase == corev1.PodRunning && len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].Ready
	})
	sbs, err := n.containerd.Runtime.ListPodSandbox(ctx, nil)
	if err != nil {
		t.Fatalf("list sandboxes: %v", err)
	}
	if len(sbs) != 1 || sbs[0].Id != before.Id || sbs[0].State != runtimeapi.PodSandboxState_SANDBOX_READY {
		t.Errorf("sandboxes after the kubelet restart: %v, want only %s, ready", sbs, before.Id)
	}
}

// leaseSeconds is TestKubeletRestart's nodeLeaseDurationSeconds (40 by default): the kubelet
// renews its Lease every quarter of it, leaseRenewal, so a few seconds show whether it still does.
const (
	leaseSeconds = 4
	leaseRenewal = leaseSeconds * time.Second / 4
)

// kubeletPids lists the processes of the host, from /proc, whose command line is the cluster's
// kubelet's (its --root-dir): what runs, whatever the harness's bookkeeping says.
func kubeletPids(t *testing.T, c *cluster.Cluster) []int {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	rootDir := "--root-dir=" + c.KubeletRootDir()
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		// Gone since ReadDir, or a zombie (empty command line): not running either way.
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(string(b), "\x00")
		if filepath.Base(args[0]) == "kubelet" && slices.Contains(args, rootDir) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// leaseRenewTime is the renewTime of the cluster's node's Lease (namespace kube-node-lease), which
// only the kubelet writes, to the microsecond.
func leaseRenewTime(t *testing.T, c *cluster.Cluster) time.Time {
	t.Helper()
	lease, err := c.Client().CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(t.Context(), c.NodeName(), metav1.GetOptions{})
	if err != nil {
		t.Fatalf("node lease: %v", err)
	}
	if lease.Spec.RenewTime == nil || lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity != c.NodeName() {
		t.Fatalf("node lease %+v: want renewed by the kubelet of node %s", lease.Spec, c.NodeName())
	}
	return lease.Spec.RenewTime.Time
}

// leaseNotRenewed fails the test when the node's Lease is renewed within window, and returns its
// renewTime.
func leaseNotRenewed(t *testing.T, c *cluster.Cluster, window time.Duration) time.Time {
	t.Helper()
	last := leaseRenewTime(t, c)
	err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, window, true, func(context.Context) (bool, error) {
		if got := leaseRenewTime(t, c); !got.Equal(last) {
			return false, fmt.Errorf("renewed at %s, after %s, with the kubelet stopped", got.Format(time.StampMicro), last.Format(time.StampMicro))
		}
		return false, nil
	})
	if !wait.Interrupted(err) {
		t.Errorf("node lease: %v", err)
	}
	return last
}

func readyCondition(node *corev1.Node) *corev1.NodeCondition {
	for i, c := range node.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return &node.Status.Conditions[i]
		}
	}
	return nil
}

// checkCgroupsGone fails the test when the cgroup root of a stopped cluster is left in a
// cgroup hierarchy.
func checkCgroupsGone(t testing.TB, root string) {
	t.Helper()
	if root == "" {
		return
	}
	dirs, err := filepath.Glob("/sys/fs/cgroup/*" + root)
	if err != nil {
		t.Fatal(err)
	}
	if len(dirs) > 0 {
		t.Errorf("cgroups left after the cluster stopped: %v", dirs)
	}
}

// testPod is a busybox pod bound to node: no scheduler runs, and the image is the rig's local one.
func testPod(name, node string) *corev1.Pod {
	no := false
	var grace int64
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: metav1.NamespaceDefault},
		Spec: corev1.PodSpec{
			NodeName: node,
			// The projected token volume would work (Up publishes kube-root-ca.crt) but costs a
			// TokenRequest and a mount per pod that this test does not need.
			AutomountServiceAccountToken:  &no,
			TerminationGracePeriodSeconds: &grace,
			Containers: []corev1.Container{{
				Name:            "main",
				Image:           rig.BusyboxImage,
				ImagePullPolicy: corev1.PullNever, // imported by the rig; no registry is reachable
				Command:         []string{"sleep", "3600"},
			}},
		},
	}
}

// waitPod waits until the pod satisfies done and returns it.
func waitPod(t testing.TB, c *cluster.Cluster, ns, name string, done func(*corev1.Pod) bool) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	waitFor(t, 2*time.Minute, "pod "+ns+"/"+name, func() (bool, error) {
		p, err := c.Client().CoreV1().Pods(ns).Get(t.Context(), name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		pod = p
		return done(p), nil
	})
	return pod
}

// findSandbox returns containerd's sandbox of the pod with uid, or nil.
func findSandbox(t *testing.T, c *rig.Client, uid string) *runtimeapi.PodSandbox {
	t.Helper()
	sbs, err := c.Runtime.ListPodSandbox(t.Context(), nil)
	if err != nil {
		t.Fatalf("list sandboxes in containerd: %v", err)
	}
	for _, sb := range sbs {
		if sb.GetMetadata().GetUid() == uid {
			return sb
		}
	}
	return nil
}

// waitFor polls cond every 100ms until it is true; it fails the test after timeout with the
// last error. An error does not end the wait: what cond looks at may not be there yet.
func waitFor(t testing.TB, timeout time.Duration, what string, cond func() (bool, error)) {
	t.Helper()
	var last error
	err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		ok, err := cond()
		last = err
		return ok, nil
	})
	if err != nil {
		t.Fatalf("waiting for %s: %v after %s (last error: %v)", what, err, timeout, last)
	}
}
