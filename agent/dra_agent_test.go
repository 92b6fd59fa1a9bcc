package agent

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/metadata"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	crifake "k8s.io/cri-client/pkg/fake"

	"github.com/podgate/podgate/agent/config"
	"github.com/podgate/podgate/agent/kube/kubetest"
	"github.com/podgate/podgate/dra/dratest"
	"github.com/podgate/podgate/test/kubefake"
	"github.com/podgate/podgate/test/otlpfake"
	"github.com/podgate/podgate/test/testfs"
)

// TestAgentWithDRA runs the whole agent with DRA on — a fake API server, a fake driver in a real
// plugin registry directory, the fake runtime — through its own wiring (startKube, buildDRA,
// the pipeline, the reconciler): the pod's claim is prepared once, before the runtime creates
// the sandbox, and unprepared once after the sandbox is removed and the pod deleted.
func TestAgentWithDRA(t *testing.T) {
	dir := testfs.ShortDir(t)
	regDir, plugDir := filepath.Join(dir, "reg"), filepath.Join(dir, "plug")
	for _, d := range []string{regDir, plugDir} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	driver := dratest.Start(t, regDir, plugDir, testDriver)
	var mu sync.Mutex
	var atRun []string
	f := crifake.NewFakeRemoteRuntime()
	backend := serveRuntime(t, dir, hookedRuntime{RemoteRuntime: f, onRun: func() {
		mu.Lock()
		defer mu.Unlock()
		atRun = driver.Calls()
	}})
	pod := draPod("1", "net")
	client := fake.NewClientset(pod, draClaim("net", pod))

	cfg := testConfig(dir, backend)
	cfg.NodeName = "node-a"
	cfg.DRA.PluginRegistryDir = regDir
	a := runAgentWithAPI(t, cfg, client)
	waitGauge(t, a, "podgate_dra_drivers", 1)

	ctx := t.Context()
	cri := criClient(t, cfg.CRISocket)
	resp, err := cri.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: &runtimeapi.PodSandboxConfig{
		Metadata: &runtimeapi.PodSandboxMetadata{Name: pod.Name, Namespace: pod.Namespace, Uid: string(pod.UID)},
	}})
	if err != nil {
		t.Fatalf("RunPodSandbox: %v", err)
	}
	mu.Lock()
	before := atRun
	mu.Unlock()
	if want := []string{"prepare default/net"}; !slices.Equal(before, want) {
		t.Errorf("driver calls when the runtime began the sandbox: %v, want %v", before, want)
	}

	if _, err := cri.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: resp.PodSandboxId}); err != nil {
		t.Fatal(err)
	}
	if _, err := cri.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: resp.PodSandboxId}); err != nil {
		t.Fatal(err)
	}
	if err := client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	want := []string{"prepare default/net", "unprepare default/net"}
	if err := wait.PollUntilContextTimeout(ctx, 5*time.Millisecond, kubetest.Timeout, true, func(context.Context) (bool, error) {
		return len(driver.Calls()) >= len(want), nil
	}); err != nil {
		t.Fatalf("driver calls %v: the claim was not unprepared: %v", driver.Calls(), err)
	}
	if got := driver.Calls(); !slices.Equal(got, want) {
		t.Errorf("driver calls %v, want %v", got, want)
	}
}

// TestDRAPrepareSpanPerDriver: with tracing on, a pod start's DRA prepare shows one span per
// driver, named with it, under the dra-prepare stage's span.
func TestDRAPrepareSpanPerDriver(t *testing.T) {
	collector := otlpfake.Start(t)
	dir := testfs.ShortDir(t)
	regDir, plugDir := filepath.Join(dir, "reg"), filepath.Join(dir, "plug")
	for _, d := range []string{regDir, plugDir} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	dratest.Start(t, regDir, plugDir, testDriver)
	backend := serveRuntime(t, dir, hookedRuntime{RemoteRuntime: crifake.NewFakeRemoteRuntime()})
	pod := draPod("1", "net")
	cfg := testConfig(dir, backend)
	cfg.NodeName = "node-a"
	cfg.DRA.PluginRegistryDir = regDir
	cfg.DRA.Prepare = config.PrepareAlways
	cfg.Tracing = &config.Tracing{Endpoint: collector.Endpoint}
	cfg.SetDefaults()
	a := New(cfg, "test")
	a.api = kubefake.Wrap(fake.NewClientset(pod, draClaim("net", pod)))
	stop := runAgentOf(t, a)
	waitGauge(t, a, "podgate_kube_pod_informer_synced", 1)
	waitGauge(t, a, "podgate_dra_drivers", 1)
	ctx := metadata.AppendToOutgoingContext(t.Context(), "traceparent", "00-"+kubeletTrace+"-"+kubeletSpan+"-01")
	if _, err := criClient(t, cfg.CRISocket).RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: &runtimeapi.PodSandboxConfig{
		Metadata: &runtimeapi.PodSandboxMetadata{Name: pod.Name, Namespace: pod.Namespace, Uid: string(pod.UID)},
	}}); err != nil {
		t.Fatal(err)
	}
	if err := stop(); err != nil { // the shutdown exports the spans left
		t.Fatal(err)
	}
	spans := collector.Spans()
	stage := otlpfake.Find(spans, "podgate", "RunPodSandbox/dra-prepare")
	drivers := otlpfake.Find(spans, "podgate", "dra prepare")
	if len(stage) != 1 || len(drivers) != 1 || drivers[0].ParentID != stage[0].SpanID || drivers[0].Attributes["driver"] != testDriver {
		t.Errorf("dra-prepare stage spans %+v, driver spans %+v: want one span for %s under the stage's", stage, drivers, testDriver)
	}
}
