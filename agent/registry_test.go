package agent

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/cri-client/pkg/fake"

	"github.com/podgate/podgate/agent/podview"
	"github.com/podgate/podgate/cri/registry"
	pb "github.com/podgate/podgate/podresources/api/v1alpha1"
	"github.com/podgate/podgate/podresources/resources"
	"github.com/podgate/podgate/sysctl"
	"github.com/podgate/podgate/test/testfs"
)

func TestAgentRefusesDamagedCheckpoint(t *testing.T) {
	dir := testfs.ShortDir(t)
	cfg := testConfig(dir, filepath.Join(dir, "missing.sock"))
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(cfg.StateDir, registry.CheckpointFile)
	if err := os.WriteFile(path, []byte(`{"version":"`+registry.CheckpointVersion+`","checksum":"sha256:00","data":[]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	err := New(cfg, "test").Run(t.Context())
	if err == nil || !strings.Contains(err.Error(), path) {
		t.Fatalf("Run: %v, want an error naming %s", err, path)
	}
	if _, serr := os.Stat(cfg.CRISocket); !os.IsNotExist(serr) {
		t.Errorf("CRI socket exists after a refused start-up: %v", serr)
	}
}

// waitRebuilt waits for a's registry to be rebuilt from the runtime.
func waitRebuilt(t *testing.T, a *Agent) {
	t.Helper()
	select {
	case <-a.rebuilt:
	case <-time.After(30 * time.Second):
		t.Fatal("registry not rebuilt within 30s")
	}
}

func TestRegistryRebuiltAfterRestart(t *testing.T) {
	dir := testfs.ShortDir(t)
	f, backend := startFakeRuntime(t, dir)
	cfg := testConfig(dir, backend)
	cfg.Sysctls.PodDefaults = map[string]string{"net.ipv4.tcp_keepalive_time": "600"}

	first := newAgent(t, cfg)
	stop := runAgentOf(t, first)
	waitRebuilt(t, first)
	client := criClient(t, cfg.CRISocket)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	var ids []string
	for _, name := range []string{"a", "b", "c"} {
		resp, err := client.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: podConfig(name)}, grpc.WaitForReady(true))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, resp.PodSandboxId)
	}
	if _, err := client.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: ids[2]}); err != nil {
		t.Fatal(err)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	before := proxyOf(t, first).state.Sandboxes.Sandboxes()
	if len(before) != 3 {
		t.Fatalf("registry before the restart: %+v", before)
	}

	// Same runtime, same state: the registry is the same.
	second := newAgent(t, cfg)
	stop = runAgentOf(t, second)
	waitRebuilt(t, second)
	if after := proxyOf(t, second).state.Sandboxes.Sandboxes(); !sameJSON(t, after, before) {
		t.Errorf("registry after the restart:\n%+v\nwant the one before:\n%+v", after, before)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}

	// While podgate is down, one sandbox goes and one comes, past podgate.
	if err := f.RuntimeService.RemovePodSandbox(ctx, ids[0]); err != nil {
		t.Fatal(err)
	}
	adoptedID, err := f.RuntimeService.RunPodSandbox(ctx, podConfig("d"), "")
	if err != nil {
		t.Fatal(err)
	}
	third := newAgent(t, cfg)
	stop = runAgentOf(t, third)
	defer stop() //nolint:errcheck // the assertions are on the registry
	waitRebuilt(t, third)
	after := proxyOf(t, third).state.Sandboxes.Sandboxes()
	if len(after) != 3 {
		t.Fatalf("registry after changes past podgate: %+v", after)
	}
	if _, ok := proxyOf(t, third).state.Sandboxes.Sandbox(ids[0]); ok {
		t.Errorf("sandbox %s removed past podgate is still recorded", ids[0])
	}
	kept, _ := proxyOf(t, third).state.Sandboxes.Sandbox(ids[1])
	keptSysctls, _ := proxyOf(t, third).state.Sysctls.Sandbox(ids[1])
	if kept.Origin != registry.OriginStarted || keptSysctls.Applied["net.ipv4.tcp_keepalive_time"] != "600" {
		t.Errorf("sandbox podgate saw start lost what it knew: %+v, sysctls %+v", kept, keptSysctls)
	}
	adopted, ok := proxyOf(t, third).state.Sandboxes.Sandbox(adoptedID)
	adoptedSysctls, _ := proxyOf(t, third).state.Sysctls.Sandbox(adoptedID)
	if !ok || adopted.Origin != registry.OriginAdopted || adoptedSysctls.Verification != sysctl.ResultUnverified || adopted.Pod.Name != "d" {
		t.Errorf("sandbox started past podgate: %+v, %v, sysctls %+v; want adopted, sysctls unverified", adopted, ok, adoptedSysctls)
	}
	proxyOf(t, third).state.Sandboxes.Flush()
	onDisk, err := registry.NewCheckpoint(cfg.StateDir).Read()
	if err != nil || !sameJSON(t, onDisk, after) {
		t.Errorf("checkpoint %+v (%v), want the rebuilt registry", onDisk, err)
	}
}

// infoRuntime is cri-client's fake runtime whose verbose ContainerStatus carries a runtime spec
// (linux.cgroupsPath and resources), as containerd's does.
type infoRuntime struct {
	*fake.RemoteRuntime
}

func (r infoRuntime) ContainerStatus(ctx context.Context, req *runtimeapi.ContainerStatusRequest) (*runtimeapi.ContainerStatusResponse, error) {
	resp, err := r.RemoteRuntime.ContainerStatus(ctx, req)
	if err != nil || !req.GetVerbose() {
		return resp, err
	}
	limit := int64(64 << 20)
	info, err := json.Marshal(map[string]any{"runtimeSpec": specs.Spec{Linux: &specs.Linux{
		CgroupsPath: "/kubepods/" + req.GetContainerId(),
		Resources:   &specs.LinuxResources{Memory: &specs.LinuxMemory{Limit: &limit}},
	}}})
	if err != nil {
		return nil, err
	}
	resp.Info = map[string]string{"info": string(info)}
	return resp, nil
}

// TestContainersRebuiltAndGoneWithTheirSandbox: containers that ran before podgate started are
// in the registry after the rebuild, and the PodResources extension shows what their runtime
// spec asks, to be verified; they go when their sandbox is removed.
func TestContainersRebuiltAndGoneWithTheirSandbox(t *testing.T) {
	dir := testfs.ShortDir(t)
	f := fake.NewFakeRemoteRuntime()
	backend := serveRuntime(t, dir, infoRuntime{f})
	ctx := t.Context()
	// A pod the kubelet started on containerd before podgate was installed.
	sb, err := f.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: podConfig("old")})
	if err != nil {
		t.Fatal(err)
	}
	ctr, err := f.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: sb.PodSandboxId,
		Config: &runtimeapi.ContainerConfig{Metadata: &runtimeapi.ContainerMetadata{Name: "app"}, Image: &runtimeapi.ImageSpec{Image: "busybox"}}, SandboxConfig: podConfig("old")})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: ctr.ContainerId}); err != nil {
		t.Fatal(err)
	}

	cfg := testConfig(dir, backend)
	a := newAgent(t, cfg)
	stop := runAgentOf(t, a)
	defer func() {
		if err := stop(); err != nil {
			t.Error(err)
		}
	}()
	waitRebuilt(t, a)
	got := proxyOf(t, a).state.Sandboxes.PodContainers("uid-old")
	if len(got) != 1 {
		t.Fatalf("containers of the adopted pod: %+v, want app", got)
	}
	c := got[0]
	if c.ID != ctr.ContainerId || c.Name != "app" || c.SandboxID != sb.PodSandboxId || c.Origin != registry.OriginAdopted ||
		c.CgroupsPath != "/kubepods/"+ctr.ContainerId {
		t.Errorf("adopted container %+v: want app of %s, adopted, with its runtime spec's cgroups path", c, sb.PodSandboxId)
	}
	conn, err := grpc.NewClient("unix://"+*cfg.PodResources.Socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	pod, err := waitGet(t, pb.NewPodResourcesClient(conn), "ns", "old")
	if err != nil {
		t.Fatal(err)
	}
	if cs := pod.GetPod().GetContainers(); len(cs) != 1 || cs[0].GetVerification() != resources.ResultUnverified || cs[0].GetAsked().GetMemoryMax() != 64<<20 {
		t.Errorf("adopted container shown as %v: want unverified, asking its runtime spec's 64Mi limit", cs)
	}

	client := criClient(t, cfg.CRISocket)
	if _, err := client.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: sb.PodSandboxId}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: sb.PodSandboxId}); err != nil {
		t.Fatal(err)
	}
	if _, ok := proxyOf(t, a).state.Sandboxes.Container(ctr.ContainerId); ok {
		t.Error("the container is still recorded after its sandbox was removed")
	}
}

// TestWatchSeesFeatureRecords: a PodResources watch sees the features' records of a sandbox
// change: the sysctl verification that ends after RunPodSandbox answered is a change of the
// pod, the event's sandbox showing the result where the one before showed it pending.
func TestWatchSeesFeatureRecords(t *testing.T) {
	r := newPipelineRig(t, nil)
	var mu sync.Mutex
	var events []*pb.WatchEvent
	r.registry.OnPodChange(func(rev uint64, before, after *registry.PodState) {
		mu.Lock()
		defer mu.Unlock()
		if ev := podview.Event(rev, before, after); ev != nil {
			events = append(events, ev)
		}
	})
	id, err := r.run(t, "p")
	if err != nil {
		t.Fatal(err)
	}
	if err := r.sys.Wait(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := r.core.Wait(t.Context()); err != nil {
		t.Fatal(err)
	}
	final, _ := r.sysctls.Sandbox(id)
	if final.Verification == sysctl.ResultPending {
		t.Fatalf("sysctls still pending after the verification ended: %+v", final)
	}
	mu.Lock()
	defer mu.Unlock()
	var seen []string
	for _, ev := range events {
		seen = append(seen, ev.GetType().String()+":"+ev.GetPod().GetSandbox().GetSysctls().GetVerification())
	}
	added, result := "POD_ADDED:"+sysctl.ResultPending, "POD_UPDATED:"+final.Verification
	if i := slices.Index(seen, added); i < 0 || !slices.Contains(seen[i+1:], result) {
		t.Errorf("watch events %v, want %s then %s", seen, added, result)
	}
}
