//go:build linux

package cluster_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"

	"github.com/podgate/podgate/test/cluster"
	"github.com/podgate/podgate/test/dradriver/driver"
	"github.com/podgate/podgate/test/dranode"
	"github.com/podgate/podgate/test/harness"
	"github.com/podgate/podgate/test/rig"
	"github.com/podgate/podgate/test/testfs"
)

const (
	// apiCostDevices is how many devices the test driver has: enough for the steady node's
	// claims, and for one pod's at a time.
	apiCostDevices = 4
	// apiCostIfPrefix names the driver's host interfaces (pgac0, pgac0p, ...): not pgnic, which
	// the e2e tests' DRA node deletes wherever it finds it.
	apiCostIfPrefix = "pgac"
	// apiCostSteadyPods run on the steady node, the first apiCostSteadyClaims of them with one
	// claim each.
	apiCostSteadyPods   = 10
	apiCostSteadyClaims = 4
	// apiCostNodes and apiCostStartsPerHour are the fleet of the extrapolation.
	apiCostNodes         = 5000
	apiCostStartsPerHour = 30
	// apiCostQuiet: a scenario ends once no client but the test's has named its namespace for
	// this long (the kubelet's last status GET of a pod comes after the pod is gone).
	apiCostQuiet = 2 * time.Second
)

// apiCostModes are podgate's configurations, by dra.prepare: auto and always, and auto+attach,
// which is auto with the driver's devices attached by podgate (dra.attach) and their network
// data written into the claims' status (dra.publishNetworkData).
var apiCostModes = []string{"auto", "always", "auto+attach"}

// Who made a request, by user agent.
const (
	clientPodgate = "podgate"
	clientKubelet = "kubelet"
	clientDriver  = "driver"
	clientOther   = "other"
	// clientTest is this benchmark's own client (cluster.Cluster.Client): never counted.
	clientTest = "test"
)

// BenchmarkAPICost counts the requests podgate and the kubelet make to a real kube-apiserver,
// read from its audit log (cluster.Options.AuditLog) and told apart by user agent ("podgate",
// "kubelet/v1.36.3 ..."). podgate has DRA on, the test driver (test/dradriver) is registered,
// and the kubelet 1.36 runs on podgate with its default node status frequencies (10 s, 5 min;
// the cluster package's 1 s would inflate the kubelet's figures).
//
// One iteration of "prepare=MODE/claims=K" is one pod's whole life with K claims, under podgate's
// configuration MODE (apiCostModes): the claims allocated and reserved and the pod bound, as the scheduler would;
// Running; deleted with its grace period, as kubectl would; gone; the kubelet done with it (its
// pod cgroup removed) and the claims unprepared. Each scenario's pods live in a namespace of
// their own: a pod start's requests are those naming an object of that namespace (the pod, its
// status, its claims, Events about it), and the reads of cluster-scoped objects other than the
// Node meanwhile (ResourceSlices, for the devices' host interfaces). The rest (the Node, Leases,
// watches of all namespaces) is the node's background, shown per hour. One iteration of
// "prepare=auto/steady" is one minute of a node running apiCostSteadyPods pods that nobody
// touches: watch renewals, relists, leases, status reports. The parent logs the table of both,
// and the extrapolation to 5,000 nodes at 30 pod starts per node per hour.
//
//	go test -run '^$' -bench APICost -benchtime 10x -timeout 3h ./test/cluster
func BenchmarkAPICost(b *testing.B) {
	n := startAPICostNode(b)
	results := map[string]*apiCostResult{}
	for _, mode := range apiCostModes {
		b.Run("prepare="+mode, func(b *testing.B) {
			n.setMode(b, mode)
			for _, claims := range []int{0, 1, 4} {
				b.Run(fmt.Sprintf("claims=%d", claims), func(b *testing.B) {
					results[fmt.Sprintf("%s/%d", mode, claims)] = n.podStarts(b, claims)
				})
			}
			if mode == "auto" {
				b.Run("steady", func(b *testing.B) { results["steady"] = n.steady(b) })
			}
		})
	}
	// b.Log would keep 10 lines of it.
	fmt.Printf("kubelet %s, podgate's pods from %s\n", cmp.Or(os.Getenv(cluster.KubeletVersionEnv), "the default"), n.podSource)
	fmt.Print(apiCostReport(results))
}

// apiCostNode is the rig's containerd, podgate in front of it with DRA on, a cluster whose
// kube-apiserver writes an audit log and whose kubelet runs on podgate, and the test driver.
type apiCostNode struct {
	rig     *rig.Rig
	cluster *cluster.Cluster
	podgate *harness.Podgate
	pgDir   string
	binDir  string
	mode    string
	// events is the driver's events file (driver.ReadEvents).
	events string
	driver *exec.Cmd
	audit  *cluster.AuditReader
	// podSource is where podgate learns the node's pods (podgate_kube_pod_source): the kubelet's
	// Pods API where the kubelet serves it (1.37), else the API server.
	podSource string
}

func startAPICostNode(b *testing.B) *apiCostNode {
	b.Helper()
	if os.Geteuid() != 0 {
		b.Skip("needs root: runs containerd, a kubelet and a DRA driver that creates host interfaces")
	}
	if err := cluster.CheckInstalled(); err != nil {
		b.Skip(err.Error())
	}
	if err := rig.CheckInstalled(); err != nil {
		b.Skip(err.Error())
	}
	n := &apiCostNode{binDir: testfs.ShortDir(b), pgDir: testfs.ShortDir(b)}
	n.events = filepath.Join(n.binDir, "dra-events.jsonl")
	harness.BuildProgram(b, "github.com/podgate/podgate/test/dradriver", n.binDir, "dradriver")
	removeLinks(b)
	n.rig = rig.Start(b)
	// Stopped after the cluster, whose Down has the kubelet stop the pods through them:
	// cleanups run last-in first-out.
	b.Cleanup(func() {
		n.stopDriver(b)
		n.stopPodgate(b)
		removeLinks(b)
	})
	n.cluster = cluster.Start(b, cluster.Options{
		// PODGATE_APICOST_DIR keeps the cluster's directory, with audit.log, for a closer look.
		Dir:          os.Getenv("PODGATE_APICOST_DIR"),
		CRIEndpoint:  "unix://" + filepath.Join(n.pgDir, "cri.sock"),
		DeferKubelet: true,
		AuditLog:     true,
		// The kubelet's defaults: with nodeStatusUpdateFrequency set, as the cluster package
		// sets it, the report frequency follows it down to 1 s.
		KubeletConfig: map[string]any{"nodeStatusUpdateFrequency": "10s", "nodeStatusReportFrequency": "5m"},
	})
	n.audit = cluster.NewAuditReader(n.cluster.AuditLogPath())
	n.startPodgate(b, "auto")
	n.startDriver(b)
	_, ctx := ktesting.NewTestContext(b)
	if err := n.cluster.StartKubelet(ctx); err != nil {
		b.Fatal(err)
	}
	if err := dranode.WaitSlice(b.Context(), n.cluster.Client(), n.cluster.NodeName(), 2*time.Minute); err != nil {
		b.Fatal(err)
	}
	return n
}

// removeLinks deletes the host interfaces the driver makes, which a failed run may have left.
func removeLinks(b *testing.B) {
	b.Helper()
	links, err := filepath.Glob("/sys/class/net/" + apiCostIfPrefix + "*")
	if err != nil {
		b.Fatal(err)
	}
	for _, l := range links {
		// Deleting one end of a veth pair deletes the other: "not found" is fine.
		_ = exec.Command("ip", "link", "del", filepath.Base(l)).Run()
	}
}

// podgateConfig is podgate's configuration for dra.prepare mode: the cluster's plugin registry,
// and the kubelet's PodResources socket, where auto asks whether the kubelet manages a pod.
func (n *apiCostNode) podgateConfig(b *testing.B, mode string) string {
	b.Helper()
	path := filepath.Join(n.pgDir, "config.yaml")
	prepare, attach := mode, ""
	if mode == "auto+attach" {
		prepare, attach = "auto", fmt.Sprintf("  attach: [%s]\n  publishNetworkData: true\n", dranode.DriverName)
	}
	// kubeletPodsAPISocket as on a node whose kubelet has the default root dir: a kubelet 1.37
	// serves its Pods API there, an older one does not and podgate uses the API server.
	config := fmt.Sprintf("apiVersion: podgate.dev/v1alpha1\nkind: AgentConfiguration\n"+
		"dra:\n  pluginRegistryDir: %s\n  prepare: %s\n%spodResources:\n  kubeletSocket: %s\nkubeletPodsAPISocket: %s\n",
		n.cluster.PluginRegistryDir(), prepare, attach, n.cluster.PodResourcesSocket(), podsAPISocket(n.cluster))
	if err := os.WriteFile(path, []byte(config), 0o644); err != nil {
		b.Fatal(err)
	}
	return path
}

func (n *apiCostNode) startPodgate(b *testing.B, mode string) {
	b.Helper()
	p, err := harness.Start(b.Context(), podgateBin, harness.Options{
		Dir: n.pgDir, RuntimeEndpoint: n.rig.Endpoint,
		Args: []string{"--config", n.podgateConfig(b, mode), "--kubeconfig", n.cluster.Kubeconfig(), "--node-name", n.cluster.NodeName()},
	})
	if err != nil {
		b.Fatal(err)
	}
	n.podgate, n.mode = p, mode
}

func (n *apiCostNode) stopPodgate(b *testing.B) {
	b.Helper()
	if n.podgate == nil {
		return
	}
	code, err := n.podgate.Stop(30 * time.Second)
	if err != nil || code != 0 {
		b.Errorf("podgate stop: exit %d, %v", code, err)
	}
	if b.Failed() {
		b.Logf("podgate log:\n%s", n.podgate.Log)
	}
	n.podgate = nil
}

// setMode runs podgate with dra.prepare mode, restarting it if needed, and waits until it can
// decide as that mode says: the driver registered and, for auto, the kubelet's version read from
// the Node.
func (n *apiCostNode) setMode(b *testing.B, mode string) {
	b.Helper()
	if n.mode != mode {
		n.stopPodgate(b)
		n.startPodgate(b, mode)
	}
	waitFor(b, time.Minute, "podgate seeing the DRA driver", func() (bool, error) {
		v, err := n.metric(b, "podgate_dra_drivers", "driver", dranode.DriverName)
		return v == 1, err
	})
	if strings.HasPrefix(mode, "auto") {
		waitFor(b, 2*time.Minute, "podgate reading the kubelet's version from the Node", func() (bool, error) {
			return strings.Contains(n.podgate.Log.String(), "kubeletPrepares=true"), nil
		})
	}
	if n.podSource == "" {
		n.podSource = "api-server"
		if socketWithin(b, podsAPISocket(n.cluster), 30*time.Second) {
			n.podSource = "kubelet-pods-api"
		}
	}
	waitFor(b, time.Minute, "podgate's pods from "+n.podSource, func() (bool, error) {
		v, err := n.metric(b, "podgate_kube_pod_source", "source", n.podSource)
		return v == 1, err
	})
}

func (n *apiCostNode) startDriver(b *testing.B) {
	b.Helper()
	log, err := os.Create(filepath.Join(n.binDir, "dradriver.log"))
	if err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(n.binDir, "dradriver"),
		"--node-name", n.cluster.NodeName(), "--kubeconfig", n.cluster.Kubeconfig(),
		"--registry-dir", n.cluster.PluginRegistryDir(), "--plugin-dir", filepath.Join(n.cluster.PluginsDir(), dranode.DriverName),
		"--cdi-dir", "", "--events-file", n.events,
		"--devices", fmt.Sprint(apiCostDevices), "--interface-prefix", apiCostIfPrefix)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		b.Fatal(errors.Join(err, log.Close()))
	}
	n.driver = cmd
	b.Cleanup(func() { _ = log.Close() })
}

// stopDriver stops the driver with SIGTERM, on which it removes its sockets.
func (n *apiCostNode) stopDriver(b *testing.B) {
	b.Helper()
	if n.driver == nil {
		return
	}
	if err := n.driver.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		b.Error(err)
	}
	var exit *exec.ExitError
	if err := n.driver.Wait(); err != nil && !errors.As(err, &exit) {
		b.Error(err)
	}
	n.driver = nil
}

// metric is podgate's metric name with labels (name, value pairs); 0 when it has none yet.
func (n *apiCostNode) metric(b *testing.B, name string, labels ...string) (float64, error) {
	m, err := n.podgate.Scrape(b.Context())
	if err != nil {
		return 0, err
	}
	v, _ := m.Value(name, labels...)
	return v, nil
}

// createPod makes the pod's claims (name-0, name-1, ...), allocated to devices nic<first>,
// nic<first+1>, ... of the driver, and the pod using them; it reserves the claims for the pod
// and binds it, in the order that keeps the kubelet from trying to prepare an unreserved claim
// (kubernetes#139836).
func (n *apiCostNode) createPod(b *testing.B, ns, name string, claims, first int) *corev1.Pod {
	b.Helper()
	ctx, kube, node := b.Context(), n.cluster.Client(), n.cluster.NodeName()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PodSpec{
			AutomountServiceAccountToken: ptr.To(false),
			// What pods usually have, short: the kubelet stops the container (sleep ignores
			// SIGTERM as PID 1) and then deletes the pod itself, as on a real node.
			TerminationGracePeriodSeconds: ptr.To[int64](1),
			// The cluster has no DNS service: with ClusterFirst the kubelet would post a
			// MissingClusterDNS warning at every sync of the pod, which no real node does.
			DNSPolicy: corev1.DNSDefault,
			Containers: []corev1.Container{{
				Name: "c", Image: rig.BusyboxImage, ImagePullPolicy: corev1.PullIfNotPresent,
				Command: []string{"sleep", "3600"},
			}},
		},
	}
	var made []*resourceapi.ResourceClaim
	for i := range claims {
		claim := &resourceapi.ResourceClaim{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", name, i)},
			Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
				Name: "nic", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: dranode.DriverName},
			}}}},
		}
		claim, err := kube.ResourceV1().ResourceClaims(ns).Create(ctx, claim, metav1.CreateOptions{})
		if err != nil {
			b.Fatal(err)
		}
		made = append(made, claim)
		ref := fmt.Sprintf("nic%d", i)
		pod.Spec.ResourceClaims = append(pod.Spec.ResourceClaims, corev1.PodResourceClaim{Name: ref, ResourceClaimName: ptr.To(claim.Name)})
		pod.Spec.Containers[0].Resources.Claims = append(pod.Spec.Containers[0].Resources.Claims, corev1.ResourceClaim{Name: ref})
	}
	pod, err := kube.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		b.Fatal(err)
	}
	for i, claim := range made {
		claim.Status.Allocation = &resourceapi.AllocationResult{
			Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{{
				Request: "nic", Driver: dranode.DriverName, Pool: node, Device: fmt.Sprintf("nic%d", first+i),
			}}},
			NodeSelector: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{node}}},
			}}},
		}
		claim.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: pod.Name, UID: pod.UID}}
		if _, err := kube.ResourceV1().ResourceClaims(ns).UpdateStatus(ctx, claim, metav1.UpdateOptions{}); err != nil {
			b.Fatal(err)
		}
	}
	err = kube.CoreV1().Pods(ns).Bind(ctx, &corev1.Binding{
		ObjectMeta: metav1.ObjectMeta{Name: pod.Name, UID: pod.UID},
		Target:     corev1.ObjectReference{Kind: "Node", Name: node},
	}, metav1.CreateOptions{})
	if err != nil {
		b.Fatal(err)
	}
	return pod
}

// waitRunning waits until the pod runs and its pod cgroup exists (waitDone waits for it to go).
func (n *apiCostNode) waitRunning(b *testing.B, pod *corev1.Pod) {
	b.Helper()
	waitFor(b, 2*time.Minute, "pod "+pod.Namespace+"/"+pod.Name+" running", func() (bool, error) {
		p, err := n.cluster.Client().CoreV1().Pods(pod.Namespace).Get(b.Context(), pod.Name, metav1.GetOptions{})
		return err == nil && p.Status.Phase == corev1.PodRunning, err
	})
	if !n.podCgroupExists(b, pod.UID) {
		b.Fatalf("pod %s/%s runs without a pod cgroup under %s", pod.Namespace, pod.Name, n.cluster.CgroupRoot())
	}
}

// deleteAndWait deletes the pods with their grace period and waits until they are gone from the
// API, the kubelet is done with them (it removes a pod's cgroup only once the pod's worker has
// terminated it, which includes its unprepare of the pod's claims), podgate holds no claim
// prepared, and the driver has every claim of theirs unprepared.
func (n *apiCostNode) deleteAndWait(b *testing.B, pods ...*corev1.Pod) {
	b.Helper()
	ctx, kube := b.Context(), n.cluster.Client()
	for _, pod := range pods {
		if err := kube.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{}); err != nil {
			b.Fatal(err)
		}
	}
	for _, pod := range pods {
		waitFor(b, 2*time.Minute, "pod "+pod.Namespace+"/"+pod.Name+" gone", func() (bool, error) {
			_, err := kube.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
			return apierrors.IsNotFound(err), nil
		})
		waitFor(b, 2*time.Minute, "the kubelet done with pod "+pod.Name+" (its cgroup gone)", func() (bool, error) {
			return !n.podCgroupExists(b, pod.UID), nil
		})
	}
	waitFor(b, 2*time.Minute, "podgate holding no claim", func() (bool, error) {
		v, err := n.metric(b, "podgate_dra_claims_prepared")
		return v == 0, err
	})
	waitFor(b, 2*time.Minute, "every claim unprepared in the driver", func() (bool, error) {
		evs, err := driver.ReadEvents(n.events)
		switch {
		case errors.Is(err, os.ErrNotExist):
			return true, nil // nothing prepared yet
		case err != nil:
			return false, err
		}
		last := map[types.UID]string{}
		for _, e := range evs {
			if e.Error == "" {
				last[e.UID] = e.Op
			}
		}
		for _, op := range last {
			if op != driver.OpUnprepare {
				return false, nil
			}
		}
		return true, nil
	})
}

// podCgroupExists reports whether the kubelet's cgroup of the pod exists in any hierarchy.
func (n *apiCostNode) podCgroupExists(b *testing.B, uid types.UID) bool {
	b.Helper()
	root := n.cluster.CgroupRoot()
	for _, pattern := range []string{"/kubepods/pod", "/kubepods/*/pod"} {
		m, err := filepath.Glob("/sys/fs/cgroup/*" + root + pattern + string(uid))
		if err != nil {
			b.Fatal(err)
		}
		if len(m) > 0 {
			return true
		}
	}
	return false
}

// waitQuiet waits until no client but the test's has named namespace ns for apiCostQuiet.
func (n *apiCostNode) waitQuiet(b *testing.B, ns string) {
	b.Helper()
	waitFor(b, time.Minute, "no request in namespace "+ns+" for "+apiCostQuiet.String(), func() (bool, error) {
		reqs, err := n.audit.Requests()
		if err != nil {
			return false, err
		}
		var last time.Time
		for _, r := range reqs {
			if r.Namespace == ns && clientOf(r.UserAgent) != clientTest {
				last = r.Received
			}
		}
		return time.Since(last) >= apiCostQuiet, nil
	})
}

// apiCostResult is what one scenario counted: requests per client and "verb resource".
type apiCostResult struct {
	// pods is how many pods started; 0 for the steady node.
	pods int
	// window is how long the scenario ran.
	window time.Duration
	// perPod counts the requests naming the scenario's namespace; background those of the
	// window naming no scenario's namespace, or for the steady node every request of the window.
	perPod, background map[string]map[string]int
	// prepares counts the driver's successful NodePrepareResources per claim, by caller.
	prepares map[string]int
}

// podStarts runs b.N pods with claims each, one after the other, in a namespace of their own.
func (n *apiCostNode) podStarts(b *testing.B, claims int) *apiCostResult {
	ns := fmt.Sprintf("apicost-%s-%d", strings.ReplaceAll(n.mode, "+", "-"), claims)
	if _, err := n.cluster.CreateNamespace(b.Context(), ns); err != nil {
		b.Fatal(err)
	}
	eventsBefore := n.driverEvents(b)
	start := time.Now()
	pods := 0
	for b.Loop() {
		pod := n.createPod(b, ns, fmt.Sprintf("p%d", pods), claims, 0)
		n.waitRunning(b, pod)
		n.deleteAndWait(b, pod)
		pods++
	}
	b.StopTimer()
	n.waitQuiet(b, ns)
	end := time.Now()
	res := &apiCostResult{pods: pods, window: end.Sub(start), prepares: map[string]int{}}
	reqs, err := n.audit.Requests()
	if err != nil {
		b.Fatal(err)
	}
	inWindow := func(r cluster.AuditRequest) bool { return !r.Received.Before(start) && r.Received.Before(end) }
	perPod := func(r cluster.AuditRequest) bool {
		return r.Namespace == ns || (inWindow(r) && podStartScoped(r))
	}
	res.perPod = count(reqs, perPod)
	res.background = count(reqs, func(r cluster.AuditRequest) bool {
		return inWindow(r) && !strings.HasPrefix(r.Namespace, "apicost-") && !perPod(r)
	})
	for _, e := range n.driverEvents(b)[len(eventsBefore):] {
		if e.Op == driver.OpPrepare && e.Error == "" && e.Namespace == ns {
			res.prepares[e.Caller.Comm]++
		}
	}
	for _, c := range []string{clientPodgate, clientKubelet} {
		b.ReportMetric(float64(total(res.perPod[c]))/float64(pods), c+"-req/pod")
		b.ReportMetric(float64(res.prepares[c])/float64(pods), c+"-prepares/pod")
	}
	// b.Log would keep 10 lines of the tables.
	fmt.Printf("%s: %d pods with %d claims, prepare=%s: requests per pod start\n%s  the node's background meanwhile (%s), per hour\n%s",
		b.Name(),
		pods, claims, n.mode, table(res.perPod, float64(pods), "per pod"),
		res.window.Round(time.Second), table(res.background, res.window.Hours(), "per hour"))
	return res
}

// steady runs the steady node's pods, then measures one minute per iteration.
func (n *apiCostNode) steady(b *testing.B) *apiCostResult {
	ns := "apicost-steady"
	if _, err := n.cluster.CreateNamespace(b.Context(), ns); err != nil {
		b.Fatal(err)
	}
	var pods []*corev1.Pod
	for i := range apiCostSteadyPods {
		claims := 0
		if i < apiCostSteadyClaims {
			claims = 1
		}
		pods = append(pods, n.createPod(b, ns, fmt.Sprintf("s%d", i), claims, i))
	}
	for _, pod := range pods {
		n.waitRunning(b, pod)
	}
	n.waitQuiet(b, ns)
	start := time.Now()
	for b.Loop() {
		// The measured window itself: nobody touches the node.
		select {
		case <-time.After(time.Minute):
		case <-b.Context().Done():
			b.Fatal(context.Cause(b.Context()))
		}
	}
	end := time.Now()
	b.StopTimer()
	reqs, err := n.audit.Requests()
	if err != nil {
		b.Fatal(err)
	}
	res := &apiCostResult{window: end.Sub(start)}
	inWindow := func(r cluster.AuditRequest) bool { return !r.Received.Before(start) && r.Received.Before(end) }
	res.background = count(reqs, inWindow)
	// Those naming the pods, to tell the node's periodic requests from a pod's late one-offs.
	res.perPod = count(reqs, func(r cluster.AuditRequest) bool { return inWindow(r) && r.Namespace == ns })
	hours := res.window.Hours()
	for _, c := range []string{clientPodgate, clientKubelet} {
		b.ReportMetric(float64(total(res.background[c]))/hours, c+"-req/h")
	}
	fmt.Printf("%s: steady node, %d pods (%d with a claim), %s: requests per hour\n%s  of which naming the pods\n%s",
		b.Name(), len(pods), apiCostSteadyClaims, res.window.Round(time.Second),
		table(res.background, hours, "per hour"), table(res.perPod, hours, "per hour"))
	n.deleteAndWait(b, pods...)
	return res
}

func (n *apiCostNode) driverEvents(b *testing.B) []driver.Event {
	b.Helper()
	evs, err := driver.ReadEvents(n.events)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		b.Fatal(err)
	}
	return evs
}

// podStartScoped reports whether a request naming no namespace belongs to the pod starts of its
// time: a read of cluster-scoped objects that a pod's claims need (ResourceSlices), not the
// node's heartbeat (its Node, and Leases, which are namespaced), not a watch (they span the
// scenarios), not a non-resource URL.
func podStartScoped(r cluster.AuditRequest) bool {
	return r.Namespace == "" && r.Resource != "" && r.Resource != "nodes" && r.Verb != "watch"
}

// clientOf names the client of a user agent.
func clientOf(userAgent string) string {
	switch {
	case userAgent == "podgate" || strings.HasPrefix(userAgent, "podgate/"):
		return clientPodgate
	case strings.HasPrefix(userAgent, "kubelet/"):
		return clientKubelet
	case strings.HasPrefix(userAgent, "dradriver/"):
		return clientDriver
	case userAgent == "podgate-test-cluster":
		return clientTest
	}
	return clientOther
}

// count counts the requests that keep says to, per client and "verb resource", but the test's.
func count(reqs []cluster.AuditRequest, keep func(cluster.AuditRequest) bool) map[string]map[string]int {
	out := map[string]map[string]int{}
	for _, r := range reqs {
		c := clientOf(r.UserAgent)
		if c == clientTest || !keep(r) {
			continue
		}
		if out[c] == nil {
			out[c] = map[string]int{}
		}
		out[c][requestKey(r)]++
	}
	return out
}

// requestKey is "verb resource[/subresource]", with the API group of Events other than core's,
// or the request URI for a non-resource request.
func requestKey(r cluster.AuditRequest) string {
	if r.Resource == "" {
		return r.Verb + " " + r.RequestURI
	}
	res := r.Resource
	if r.Subresource != "" {
		res += "/" + r.Subresource
	}
	if r.Resource == "events" && r.APIGroup != "" {
		res += "." + r.APIGroup
	}
	return r.Verb + " " + res
}

func total(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// table writes counts per client (podgate, kubelet, then the others), divided by per, one
// "verb resource" a line.
func table(counts map[string]map[string]int, per float64, unit string) string {
	var b strings.Builder
	clients := []string{clientPodgate, clientKubelet, clientDriver, clientOther}
	for _, c := range clients {
		keys := slices.Sorted(maps.Keys(counts[c]))
		fmt.Fprintf(&b, "  %-8s %8.2f %s\n", c, float64(total(counts[c]))/per, unit)
		for _, k := range keys {
			fmt.Fprintf(&b, "      %8.2f  %s\n", float64(counts[c][k])/per, k)
		}
	}
	return b.String()
}

// apiCostReport is the summary of all scenarios: per pod start, per hour of a steady node, and
// the extrapolation to apiCostNodes nodes at apiCostStartsPerHour pod starts per node per hour.
func apiCostReport(results map[string]*apiCostResult) string {
	var b strings.Builder
	steady := results["steady"]
	perHour := map[string]float64{}
	if steady != nil {
		for _, c := range []string{clientPodgate, clientKubelet} {
			perHour[c] = float64(total(steady.background[c])) / steady.window.Hours()
		}
		fmt.Fprintf(&b, "steady node (%s): podgate %.1f requests/h, kubelet %.1f requests/h\n",
			steady.window.Round(time.Second), perHour[clientPodgate], perHour[clientKubelet])
	}
	fmt.Fprintf(&b, "%-18s %12s %12s %16s %16s %22s %22s\n", "scenario", "podgate/pod", "kubelet/pod",
		"podgate prep/pod", "kubelet prep/pod",
		fmt.Sprintf("podgate req/s @%d", apiCostNodes), fmt.Sprintf("kubelet req/s @%d", apiCostNodes))
	for _, mode := range apiCostModes {
		for _, claims := range []int{0, 1, 4} {
			r := results[fmt.Sprintf("%s/%d", mode, claims)]
			if r == nil || r.pods == 0 {
				continue
			}
			per := map[string]float64{}
			fleet := map[string]float64{}
			for _, c := range []string{clientPodgate, clientKubelet} {
				per[c] = float64(total(r.perPod[c])) / float64(r.pods)
				// Requests per second at the API server from every node's c.
				fleet[c] = apiCostNodes * (apiCostStartsPerHour*per[c] + perHour[c]) / 3600
			}
			fmt.Fprintf(&b, "%-18s %12.2f %12.2f %16.2f %16.2f %22.1f %22.1f\n", fmt.Sprintf("%s, %d claims", mode, claims),
				per[clientPodgate], per[clientKubelet],
				float64(r.prepares[clientPodgate])/float64(r.pods), float64(r.prepares[clientKubelet])/float64(r.pods),
				fleet[clientPodgate], fleet[clientKubelet])
		}
	}
	return b.String()
}
