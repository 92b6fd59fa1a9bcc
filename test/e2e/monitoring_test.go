package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	pb "github.com/podgate/podgate/podresources/api/v1alpha1"
	"github.com/podgate/podgate/test/registry"
	"github.com/podgate/podgate/test/rig"
)

// alertLimit bounds each wait for an alert to fire or resolve: the rules' windows are seconds
// (promConfig), Prometheus scrapes and evaluates every second.
const alertLimit = 90 * time.Second

// TestMonitoringAlerts: Debian's Prometheus on loopback scrapes podgate and containerd on a real
// node every second, with deploy/monitoring's rules (windows of seconds). On the healthy node
// no alert is even pending; a pull from a trickling registry stalls and PodgateImagePullStalled
// fires, then resolves once its window has seen no stall; containerd stops and
// PodgateBackendDown fires, then resolves once containerd is back. Every series the rules and
// the dashboard read is in the scrape, but DRA's and those made at a first event this node has
// no cause for.
func TestMonitoringAlerts(t *testing.T) {
	ctrdMetrics := freeAddr(t)
	r := rig.StartWith(t, rig.Options{MetricsAddress: ctrdMetrics})
	// podgate stalls pulls as the stall tests do; its PodResources socket allows one call a
	// second per client, burst 2.
	p := startPodgate(t, r.Endpoint, "--config", writeConfig(t, fmt.Sprintf(
		"imagePulls:\n  maxParallel: 1\n  stall:\n    minBytesPerSecond: %d\n    window: %s\npodResources:\n  qps: 1\n  burst: 2\n", stallMin, stallWindow)))
	through := rig.Connect(t, p.Endpoint)
	prom := startPrometheus(t, promConfig(), map[string]string{"podgate": hostPort(p.MetricsURL), "containerd": ctrdMetrics})
	startMonitoredPod(t, r, through)
	ext := extensionClient(t, p.PodResourcesSocket)
	if pod := getPod(t, ext, "monitored"); pod == nil {
		t.Error("PodResources Get: podgate does not know the pod it started")
	}
	prom.waitScraped(t, "podgate")
	prom.waitScraped(t, "containerd")
	prom.checkNoAlerts(t)

	// A PodResources client goes over its rate limit.
	refused := 0
	for range 5 {
		if _, err := ext.Get(t.Context(), &pb.GetRequest{PodName: "monitored", PodNamespace: "e2e"}); status.Code(err) == codes.ResourceExhausted {
			refused++
		}
	}
	if refused == 0 {
		t.Fatal("5 PodResources calls at once, over qps 1 and burst 2: none refused")
	}
	prom.waitFiring(t, alertLimit, "PodgatePodResourcesClientRefused", map[string]string{"reason": "rate_limit"})
	prom.waitResolved(t, alertLimit, "PodgatePodResourcesClientRefused", nil)

	// A pull stalls: its callers get Unavailable, the alert names the registry.
	reg := registry.New(4 << 20)
	reg.Serve(t)
	ref, _, layers := pushTwoLayers(t, reg, "monitoring/img:v1", stallLayer)
	reg.Trickle(layers[1], trickleRate)
	reg.Count(true) // the registry paces blobs only on its counted path
	ctx, cancel := context.WithTimeout(t.Context(), stallTimeout)
	defer cancel()
	sandbox := &runtimeapi.PodSandboxConfig{Metadata: &runtimeapi.PodSandboxMetadata{Namespace: "e2e", Name: "monitoring", Uid: "uid-monitoring"}}
	if _, err := through.Images.PullImage(ctx, &runtimeapi.ImageSpec{Image: ref}, nil, sandbox); status.Code(err) != codes.Unavailable {
		t.Fatalf("pull from the trickling registry: %v, want a stall (Unavailable)", err)
	}
	prom.waitFiring(t, alertLimit, "PodgateImagePullStalled", map[string]string{"registry": "other"})
	reg.Trickle(layers[1], 0)
	prom.waitResolved(t, alertLimit, "PodgateImagePullStalled", nil)

	// containerd stops, then comes back.
	prom.checkQuiet(t, "PodgateBackendDown")
	if err := r.StopContainerd(ctx); err != nil {
		t.Fatal(err)
	}
	prom.waitFiring(t, alertLimit, "PodgateBackendDown", map[string]string{"backend": "runtime", "endpoint": r.Endpoint})
	if err := r.RestartContainerd(ctx); err != nil {
		t.Fatal(err)
	}
	prom.waitResolved(t, alertLimit, "PodgateBackendDown", nil)

	prom.checkDashboardQueries(t, promConfig())
	prom.checkLiveSeries(t, map[string]string{
		"podgate_dra_drivers":                         "DRA needs a kubeconfig: TestMonitoringDRADriverDown",
		"podgate_dra_operations_total":                "DRA needs a kubeconfig: TestMonitoringDRADriverDown",
		"podgate_dra_claims_prepared":                 "DRA needs a kubeconfig: TestMonitoringDRADriverDown",
		"podgate_sandbox_stage_failures_total":        "made at a sandbox's first failure: TestMonitoringDRADriverDown",
		"podgate_resources_pod_verifications_total":   "made at the first check of pod-level resources, which this pod has not",
		"podgate_image_pull_push_backs_total":         "made at a registry's first push-back: TestImagePullThrottled",
		"podgate_image_pull_push_back_failures_total": "made at the first pull given its registry's push-back: TestImagePullThrottledGivesUp",
	})
}

// TestMonitoringDRADriverDown: on a real single-node cluster with the test DRA driver, Prometheus
// scrapes podgate and containerd with deploy/monitoring's rules; a sandbox prepared through
// podgate raises nothing; the driver stops, the next sandbox is refused and
// PodgateSandboxesRefusedDRA fires; the driver is back and the alert resolves once its window
// has seen no refusal. Every series the rules and the dashboard read is in the scrape but those
// made at a first event this node has no cause for.
func TestMonitoringDRADriverDown(t *testing.T) {
	ctrdMetrics := freeAddr(t)
	n := startDRANodeWith(t, draNodeOptions{attach: []string{draDriverName}, containerdMetrics: ctrdMetrics})
	ctx := t.Context()
	prom := startPrometheus(t, promConfig(), map[string]string{"podgate": hostPort(n.podgate.MetricsURL), "containerd": ctrdMetrics})
	if err := n.cluster.StartKubelet(ctx); err != nil {
		t.Fatal(err)
	}
	if err := n.cluster.StopKubelet(ctx); err != nil {
		t.Fatal(err)
	}
	n.waitSlice(t)
	prom.waitScraped(t, "podgate")

	ok := n.draPod(t, "mon-ok", 1)
	id, err := n.runSandbox(t, ok)
	if err != nil {
		t.Fatalf("RunPodSandbox through podgate: %v", err)
	}
	if _, err := extensionClient(t, n.podgate.PodResourcesSocket).Get(ctx, &pb.GetRequest{PodName: "mon-ok", PodNamespace: "default"}); err != nil {
		t.Errorf("PodResources Get of the pod podgate started: %v", err)
	}
	prom.checkQuiet(t, "PodgateSandboxesRefusedDRA")
	prom.checkQuiet(t, "PodgateDRAPrepareFailing")

	n.stopDriver(t)
	waitWithin(t, time.Minute, "podgate seeing the driver go", func() bool {
		m, err := n.podgate.Scrape(ctx)
		if err != nil {
			return false
		}
		v, _ := m.Value("podgate_dra_drivers", "driver", draDriverName)
		return v != 1
	})
	refused := n.draPod(t, "mon-refused", 2)
	if _, err := n.runSandbox(t, refused); status.Code(err) != codes.Unavailable {
		t.Fatalf("RunPodSandbox with the driver down: %v, want Unavailable", err)
	}
	prom.waitFiring(t, alertLimit, "PodgateSandboxesRefusedDRA", nil)
	n.startDriver(t)
	waitMetric(t, n.podgate, "podgate_dra_drivers{driver=\""+draDriverName+"\"} 1")
	prom.waitResolved(t, alertLimit, "PodgateSandboxesRefusedDRA", nil)

	prom.checkDashboardQueries(t, promConfig())
	prom.checkLiveSeries(t, map[string]string{
		"podgate_image_pull_stalls_total":                "made at the first stall: TestMonitoringAlerts",
		"podgate_image_pull_throughput_bytes_per_second": "only while a pull runs: TestMonitoringAlerts",
		"podgate_image_pull_registry_in_flight":          "made at the first pull: TestMonitoringAlerts",
		"podgate_sysctl_verifications_total":             "made at the first sandbox with sysctls: TestMonitoringAlerts",
		"podgate_resources_verifications_total":          "made at the first container checked: TestMonitoringAlerts",
		"podgate_resources_pod_verifications_total":      "made at the first check of pod-level resources, which no test pod has",
		"podgate_podresources_refusals_total":            "made at the first PodResources client refused: TestMonitoringAlerts",
		"podgate_image_pull_push_backs_total":            "made at a registry's first push-back: TestImagePullThrottled",
		"podgate_image_pull_push_back_failures_total":    "made at the first pull given its registry's push-back: TestImagePullThrottledGivesUp",
	})
	if err := n.through.Runtime.StopPodSandbox(ctx, id); err != nil {
		t.Error(err)
	}
	if err := n.through.Runtime.RemovePodSandbox(ctx, id); err != nil {
		t.Error(err)
	}
}

// startMonitoredPod starts a pod "monitored" with a sysctl and a running container through
// podgate, as the kubelet would: the sandbox pipeline's, the sysctl verification's and the
// container resources' series appear.
func startMonitoredPod(t *testing.T, r *rig.Rig, through *rig.Client) {
	t.Helper()
	ctx := t.Context()
	sb := &runtimeapi.PodSandboxConfig{
		Metadata:     &runtimeapi.PodSandboxMetadata{Name: "monitored", Namespace: "e2e", Uid: "uid-monitored"},
		LogDirectory: filepath.Join(r.Dir, "pods", "monitored"),
		Linux:        &runtimeapi.LinuxPodSandboxConfig{Sysctls: map[string]string{"net.ipv4.tcp_keepalive_time": "600"}},
	}
	podID, err := through.Runtime.RunPodSandbox(ctx, sb, "")
	if err != nil {
		t.Fatalf("RunPodSandbox: %v", err)
	}
	ctrID, err := through.Runtime.CreateContainer(ctx, podID, &runtimeapi.ContainerConfig{
		Metadata: &runtimeapi.ContainerMetadata{Name: "app"},
		Image:    &runtimeapi.ImageSpec{Image: rig.BusyboxImage},
		Command:  []string{"sleep", "3600"},
		Linux:    &runtimeapi.LinuxContainerConfig{Resources: &runtimeapi.LinuxContainerResources{CpuShares: 256, MemoryLimitInBytes: 64 << 20}},
	}, sb)
	if err != nil {
		t.Fatalf("CreateContainer: %v", err)
	}
	if err := through.Runtime.StartContainer(ctx, ctrID); err != nil {
		t.Fatalf("StartContainer: %v", err)
	}
}
