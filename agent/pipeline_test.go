package agent

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	apitest "k8s.io/cri-api/pkg/apis/testing"
	"k8s.io/cri-client/pkg/fake"

	"github.com/podgate/podgate/agent/config"
	"github.com/podgate/podgate/cri"
	"github.com/podgate/podgate/cri/pipeline"
	"github.com/podgate/podgate/cri/registry"
	"github.com/podgate/podgate/dra/attach"
	"github.com/podgate/podgate/dra/manager"
	"github.com/podgate/podgate/podresources/cgroup"
	"github.com/podgate/podgate/podresources/resources"
	"github.com/podgate/podgate/sysctl"
	"github.com/podgate/podgate/test/testfs"
)

// pipelineRig is the sandbox pipeline in a CRI server in front of cri-client's fake runtime,
// both on real unix sockets.
type pipelineRig struct {
	dir     string
	runtime *fake.RemoteRuntime
	sys     *sysctl.Stages
	// runtimeClient talks to the runtime past podgate.
	runtimeClient runtimeapi.RuntimeServiceClient
	pipeline      *pipeline.Runner
	core          *pipeline.Core
	registry      *registry.Registry
	// claimStore, intents and sysctls are the features' sections of the registry's checkpoint.
	claimStore *manager.Claims
	intents    *attach.Intents
	sysctls    *sysctl.Records
	stateDir   string
	client     runtimeapi.RuntimeServiceClient
	metrics    *prometheus.Registry
}

// newPipelineRig builds the rig; change lets a test alter the stages before they serve.
func newPipelineRig(t *testing.T, change func([]pipeline.Stage)) *pipelineRig {
	t.Helper()
	return newPipelineRigWith(t, rigOptions{change: change})
}

// rigOptions vary the pipeline rig.
type rigOptions struct {
	// change alters the stages before they serve.
	change func([]pipeline.Stage)
	// runner configures the pipeline's runner.
	runner []pipeline.RunnerOption
	// dra builds the DRA manager and attacher; nil: DRA off.
	dra func(r *pipelineRig) (*manager.Manager, *attach.Attacher)
	// onRun runs in the runtime's RunPodSandbox, before it creates the sandbox.
	onRun func()
	// statusErr, when set, is the runtime's answer to PodSandboxStatus.
	statusErr error
	// verify is sysctls.verify; empty: warn.
	verify string
	// netns, when set, is the network namespace of every sandbox in the runtime's verbose
	// status, as containerd reports it.
	netns string
}

// hookedRuntime is cri-client's fake runtime with a hook in RunPodSandbox and, optionally, a
// failing PodSandboxStatus or one naming a network namespace.
type hookedRuntime struct {
	*fake.RemoteRuntime
	onRun     func()
	statusErr error
	netns     string
}

func (h hookedRuntime) PodSandboxStatus(ctx context.Context, req *runtimeapi.PodSandboxStatusRequest) (*runtimeapi.PodSandboxStatusResponse, error) {
	if h.statusErr != nil {
		return nil, h.statusErr
	}
	resp, err := h.RemoteRuntime.PodSandboxStatus(ctx, req)
	if err != nil || h.netns == "" {
		return resp, err
	}
	info, err := json.Marshal(map[string]any{"runtimeSpec": map[string]any{"linux": map[string]any{
		"namespaces": []map[string]string{{"type": "network", "path": h.netns}},
	}}})
	if err != nil {
		return nil, err
	}
	resp.Info = map[string]string{"info": string(info)}
	return resp, nil
}

func (h hookedRuntime) RunPodSandbox(ctx context.Context, req *runtimeapi.RunPodSandboxRequest) (*runtimeapi.RunPodSandboxResponse, error) {
	if h.onRun != nil {
		h.onRun()
	}
	return h.RemoteRuntime.RunPodSandbox(ctx, req)
}

func newPipelineRigWith(t testing.TB, o rigOptions) *pipelineRig {
	t.Helper()
	dir := testfs.ShortDir(t)
	r := &pipelineRig{stateDir: filepath.Join(dir, "state"), metrics: prometheus.NewRegistry(), dir: dir}
	if err := os.Mkdir(r.stateDir, 0o700); err != nil {
		t.Fatal(err)
	}
	r.runtime = fake.NewFakeRemoteRuntime()
	rtPath := serveRuntime(t, dir, hookedRuntime{RemoteRuntime: r.runtime, onRun: o.onRun, statusErr: o.statusErr, netns: o.netns})
	backend, err := cri.NewBackend(t.Context(), "runtime", rtPath)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { backend.Close() })
	srv := cri.NewServer(backend, backend)
	cfg := config.DefaultConfiguration()
	cfg.Sysctls.PodDefaults = map[string]string{"net.ipv4.tcp_keepalive_time": "600"}
	policy, err := sysctlPolicy(&cfg.Sysctls, nil)
	if err != nil {
		t.Fatal(err)
	}
	st := openTestState(t, r.stateDir)
	r.registry, r.claimStore, r.intents, r.sysctls = st.sandboxes, st.claims, st.intents, st.sysctls
	r.runtimeClient = srv.RuntimeClient()
	verify := config.VerifyWarn
	if o.verify != "" {
		verify = o.verify
	}
	sys := sysctl.NewStages(policy, sysctl.VerifyMode(verify), r.sysctls, r.metrics, sysctl.WithCgroupProcs(cgroupProcs))
	r.sys = sys
	var d *draFeature // DRA off, unless o.dra
	if o.dra != nil {
		m, at := o.dra(r)
		d = &draFeature{manager: m, attach: at}
	}
	r.core = pipeline.NewCore(r.registry, r.runtimeClient, pipeline.Quiet(srv))
	stages := sandboxStages(r.core, sys, d, testResources(r.registry))
	if o.change != nil {
		o.change(stages)
	}
	r.pipeline = pipeline.NewRunner(stages, r.registry, r.metrics, o.runner...)
	r.pipeline.Register(srv)
	cri.Observe(srv, cri.CreateContainer, sys.CreateContainer) // as createContainerHooks has it
	l, err := cri.Listen(filepath.Join(dir, "pg.sock"), cri.SocketOptions{Mode: 0o600})
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(l) //nolint:errcheck // returns nil after Shutdown
	t.Cleanup(func() {
		srv.Shutdown(context.Background())
		// Background work ends before the state directory goes.
		for _, wait := range []func(context.Context) error{r.core.Wait, sys.Wait} {
			if err := wait(context.Background()); err != nil {
				t.Error(err)
			}
		}
	})
	r.client = criClient(t, filepath.Join(dir, "pg.sock"))
	return r
}

func podConfig(name string) *runtimeapi.PodSandboxConfig {
	return &runtimeapi.PodSandboxConfig{
		Metadata: &runtimeapi.PodSandboxMetadata{Name: name, Namespace: "ns", Uid: "uid-" + name},
	}
}

func (r *pipelineRig) run(t *testing.T, name string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	resp, err := r.client.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: podConfig(name)}, grpc.WaitForReady(true))
	return resp.GetPodSandboxId(), err
}

// runtimeSandboxes is what the fake runtime holds, read past podgate.
func (r *pipelineRig) runtimeSandboxes(t *testing.T) []*runtimeapi.PodSandbox {
	t.Helper()
	items, err := r.runtime.RuntimeService.ListPodSandbox(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	return items
}

// checkNothingLeft checks that neither the runtime, nor the registry, nor its checkpoint
// holds a sandbox.
func (r *pipelineRig) checkNothingLeft(t *testing.T) {
	t.Helper()
	if got := r.runtimeSandboxes(t); len(got) != 0 {
		t.Errorf("the runtime holds %d sandboxes: %v", len(got), got)
	}
	if got := r.registry.Sandboxes(); len(got) != 0 {
		t.Errorf("the registry holds %v", got)
	}
	r.registry.Flush()
	onDisk, err := registry.NewCheckpoint(r.stateDir).Read()
	if err != nil {
		t.Fatal(err)
	}
	if len(onDisk) != 0 {
		t.Errorf("the checkpoint holds %v", onDisk)
	}
}

func TestPipelineFailureAtEveryStageLeavesNothing(t *testing.T) {
	stages := newPipelineRig(t, nil).pipeline.Stages()
	if len(stages) < 4 {
		t.Fatalf("pipeline has %d stages", len(stages))
	}
	for i, st := range stages {
		t.Run(st.Name, func(t *testing.T) {
			r := newPipelineRig(t, func(stages []pipeline.Stage) {
				stages[i].Run = func(context.Context, *pipeline.Sandbox) error {
					return errdefs.ErrUnavailable.WithMessage("injected failure at " + st.Name)
				}
			})
			_, err := r.run(t, "p")
			if st := status.Convert(err); st.Code() != codes.Unavailable || st.Message() != "injected failure at "+stages[i].Name {
				t.Fatalf("RunPodSandbox: %v, want the stage's own error", err)
			}
			r.checkNothingLeft(t)
			if n := counterValue(t, r.metrics, "podgate_sandbox_stage_failures_total", "stage", st.Name); n != 1 {
				t.Errorf("stage_failures_total{stage=%q} = %v, want 1", st.Name, n)
			}
			// A stage after the forward one failed: the runtime's sandbox was removed
			// through the forward stage's undo.
			forwarded := slicesIndex(stages, "forward") < i
			if called := strings.Join(r.runtime.RuntimeService.GetCalls(), ","); forwarded != strings.Contains(called, "RemovePodSandbox") {
				t.Errorf("runtime calls %s; forwarded before the failure: %v", called, forwarded)
			}
		})
	}
}

// TestRuntimeErrorsKeepTheirClass: with verify: fail the sysctl verification needs the new
// sandbox's status; when containerd does not give it, the kubelet gets containerd's own code,
// not FailedPrecondition, with what podgate was doing in the message, and nothing is left.
func TestRuntimeErrorsKeepTheirClass(t *testing.T) {
	for _, code := range []codes.Code{codes.Unavailable, codes.DeadlineExceeded} {
		t.Run(code.String(), func(t *testing.T) {
			r := newPipelineRigWith(t, rigOptions{verify: config.VerifyFail, statusErr: status.Error(code, "containerd says no")})
			_, err := r.run(t, "p")
			st := status.Convert(err)
			if st.Code() != code {
				t.Errorf("RunPodSandbox: code %s (%v), want containerd's %s", st.Code(), err, code)
			}
			if !strings.HasPrefix(st.Message(), "verify sysctls of sandbox ") || !strings.HasSuffix(st.Message(), ": containerd says no") {
				t.Errorf("message %q: want what podgate was doing, then containerd's message", st.Message())
			}
			r.checkNothingLeft(t)
		})
	}
}

func slicesIndex(stages []pipeline.Stage, name string) int {
	for i, st := range stages {
		if st.Name == name {
			return i
		}
	}
	return -1
}

// A sandbox record is no obligation: a pod starts even when its record cannot reach the disk,
// and the failure is reported.
func TestCheckpointWriteFailureDoesNotFailPods(t *testing.T) {
	r := newPipelineRig(t, nil)
	failures := make(chan error, 10)
	r.registry.OnWriteError(func(err error) { failures <- err })
	// A directory where the checkpoint goes: renaming the new file over it fails.
	if err := os.Mkdir(filepath.Join(r.stateDir, registry.CheckpointFile), 0o700); err != nil {
		t.Fatal(err)
	}
	id, err := r.run(t, "p")
	if err != nil {
		t.Fatalf("RunPodSandbox: %v", err)
	}
	if _, ok := r.registry.Sandbox(id); !ok {
		t.Error("sandbox not in the registry")
	}
	r.registry.Flush()
	select {
	case err := <-failures:
		if !strings.Contains(err.Error(), "pod registry") {
			t.Errorf("write failure %v does not say what failed", err)
		}
	default:
		t.Error("the failed write was not reported")
	}
}

func TestPipelineRecordsStopsAndForgets(t *testing.T) {
	r := newPipelineRig(t, nil)
	id, err := r.run(t, "p")
	if err != nil {
		t.Fatal(err)
	}
	// The sandbox's status is read after the answer (no stage needed it before).
	if err := r.core.Wait(t.Context()); err != nil {
		t.Fatal(err)
	}
	rec, ok := r.registry.Sandbox(id)
	if !ok {
		t.Fatalf("sandbox %s not recorded", id)
	}
	if rec.Pod != (registry.PodRef{UID: "uid-p", Name: "p", Namespace: "ns"}) || rec.Origin != registry.OriginStarted || !rec.Ready {
		t.Errorf("record %+v", rec)
	}
	if len(rec.IPs) == 0 || rec.IPs[0] != apitest.FakePodSandboxIPs[0] {
		t.Errorf("record IPs %v, want the runtime's %v", rec.IPs, apitest.FakePodSandboxIPs)
	}
	// The node default was added and forwarded.
	if sc, _ := r.sysctls.Sandbox(id); sc.Applied["net.ipv4.tcp_keepalive_time"] != "600" || len(sc.Asked) != 0 {
		t.Errorf("sysctls %+v, want the node default applied and nothing asked", sc)
	}
	ctx := t.Context()
	// The background verification ends with its result in the record, then the writes.
	if err := r.sys.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	r.registry.Flush()
	if onDisk, err := registry.NewCheckpoint(r.stateDir).Read(); err != nil || !sameJSON(t, onDisk, r.registry.Sandboxes()) {
		t.Errorf("checkpoint %+v (%v), want the registry %+v", onDisk, err, r.registry.Sandboxes())
	}
	if _, err := r.client.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: id}); err != nil {
		t.Fatal(err)
	}
	if rec, _ := r.registry.Sandbox(id); rec.Ready {
		t.Error("stopped sandbox still ready in the registry")
	}
	for range 2 { // Remove is idempotent
		if _, err := r.client.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: id}); err != nil {
			t.Fatal(err)
		}
	}
	r.checkNothingLeft(t)
}

// testResources is the resources feature as the pipeline tests need it: its pod-level stage
// only records, on a node whose cgroups are never read here.
func testResources(reg *registry.Registry) *resources.Hooks {
	return resources.New(resources.Config{}, cgroup.Node{}, reg, nil, prometheus.NewRegistry())
}
