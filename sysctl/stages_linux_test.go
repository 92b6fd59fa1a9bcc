package sysctl_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podgate/podgate/cri"
	"github.com/podgate/podgate/cri/pipeline"
	"github.com/podgate/podgate/cri/registry"
	"github.com/podgate/podgate/sysctl"
	"github.com/podgate/podgate/test/crifake"
)

// rig is the sysctl stages in the sandbox pipeline, in the composition root's order (check,
// forward, status, verify, record) with CreateContainer's hook, in podgate's CRI server in
// front of a runtime, both on unix sockets; sandboxes are recorded in a registry with its
// checkpoint in stateDir, their sysctls in the feature's records.
type rig struct {
	proxy    *crifake.Proxy
	registry *registry.Registry
	records  *sysctl.Records
	stages   *sysctl.Stages
	core     *pipeline.Core
	metrics  *prometheus.Registry
	stateDir string
}

func newRig(t *testing.T, rt runtimeapi.RuntimeServiceServer, cfg sysctl.Config, verify sysctl.VerifyMode, opts ...sysctl.StagesOption) *rig {
	t.Helper()
	kernel, err := sysctl.RunningKernel()
	if err != nil {
		t.Fatal(err)
	}
	policy, err := sysctl.NewPolicy(cfg, kernel, sysctl.ProcSys)
	if err != nil {
		t.Fatal(err)
	}
	r := &rig{proxy: crifake.NewProxy(t, rt), metrics: prometheus.NewRegistry()}
	r.stateDir = filepath.Join(r.proxy.Dir, "state")
	if err := os.Mkdir(r.stateDir, 0o700); err != nil {
		t.Fatal(err)
	}
	r.registry, r.records = openState(t, r.stateDir)
	r.stages = sysctl.NewStages(policy, verify, r.records, r.metrics, opts...)
	r.core = pipeline.NewCore(r.registry, r.proxy.Server.RuntimeClient(), pipeline.Quiet(r.proxy.Server))
	stages := []pipeline.Stage{r.stages.CheckStage(), r.core.Forward(), r.core.Status(), r.stages.VerifyStage(), r.core.Record()}
	pipeline.NewRunner(stages, r.registry, r.metrics).Register(r.proxy.Server)
	cri.Observe(r.proxy.Server, cri.CreateContainer, r.stages.CreateContainer)
	r.proxy.Start(t)
	t.Cleanup(func() { _ = r.wait(context.Background()) })
	return r
}

// openState is the registry and its sysctl records read from the checkpoint in stateDir, as
// start-up reads them.
func openState(t *testing.T, stateDir string) (*registry.Registry, *sysctl.Records) {
	t.Helper()
	cp := registry.NewCheckpoint(stateDir)
	d, err := cp.ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	reg := registry.NewRegistry(cp, d)
	records, err := sysctl.NewRecords(reg)
	if err != nil {
		t.Fatal(err)
	}
	return reg, records
}

// wait waits for the background work, the verifications' and the status reads', and for the
// checkpoint's writes: what podgate's shutdown waits for.
func (r *rig) wait(ctx context.Context) error {
	for _, wait := range []func(context.Context) error{r.stages.Wait, r.core.Wait} {
		if err := wait(ctx); err != nil {
			return err
		}
	}
	r.registry.Flush()
	return nil
}

// TestCheckAddsDefaults: the check stage adds the node's defaults to a pod that asks for no
// sysctl, and the record says so: applied, none asked.
func TestCheckAddsDefaults(t *testing.T) {
	r := newRig(t, crifake.NewRuntime(), sysctl.Config{PodDefaults: map[string]string{"net.ipv4.tcp_keepalive_time": "600"}}, sysctl.VerifyWarn)
	id, err := r.proxy.RunPod(t, "p")
	if err != nil {
		t.Fatal(err)
	}
	if err := r.wait(t.Context()); err != nil {
		t.Fatal(err)
	}
	rec, _ := r.records.Sandbox(id)
	if rec.Applied["net.ipv4.tcp_keepalive_time"] != "600" || len(rec.Asked) != 0 {
		t.Errorf("sysctls %+v, want the node default applied and nothing asked", rec)
	}
}

// TestRuntimeErrorsKeepTheirClass: with verify: fail the verification needs the new sandbox's
// status; when containerd does not give it, the kubelet gets containerd's own code, not
// FailedPrecondition, with what podgate was doing in the message, and nothing is left.
func TestRuntimeErrorsKeepTheirClass(t *testing.T) {
	for _, code := range []codes.Code{codes.Unavailable, codes.DeadlineExceeded} {
		t.Run(code.String(), func(t *testing.T) {
			rt := crifake.NewRuntime()
			rt.StatusErr = status.Error(code, "containerd says no")
			r := newRig(t, rt, sysctl.Config{PodDefaults: map[string]string{"net.ipv4.tcp_keepalive_time": "600"}}, sysctl.VerifyFail)
			_, err := r.proxy.RunPod(t, "p")
			st := status.Convert(err)
			if st.Code() != code {
				t.Errorf("RunPodSandbox: code %s (%v), want containerd's %s", st.Code(), err, code)
			}
			if !strings.HasPrefix(st.Message(), "verify sysctls of sandbox ") || !strings.HasSuffix(st.Message(), ": containerd says no") {
				t.Errorf("message %q: want what podgate was doing, then containerd's message", st.Message())
			}
			if got := rt.Sandboxes(t); len(got) != 0 {
				t.Errorf("the runtime holds %v", got)
			}
			if err := r.wait(t.Context()); err != nil {
				t.Fatal(err)
			}
			checkRecorded(t, r, "p_ns_uid-p_0", "")
		})
	}
}

// nsRuntime is a runtime whose sandbox is a real process in its own network and IPC
// namespaces, but which never applies the sandbox's sysctls: every requested value mismatches.
type nsRuntime struct {
	runtimeapi.UnimplementedRuntimeServiceServer
	pid             int
	stopped, remove atomic.Int32
	// atCreate is the sysctl's value in the sandbox when CreateContainer arrived.
	atCreate atomic.Pointer[string]
}

func (r *nsRuntime) CreateContainer(context.Context, *runtimeapi.CreateContainerRequest) (*runtimeapi.CreateContainerResponse, error) {
	v, err := sysctl.Read(sysctl.ForPID(r.pid), []sysctl.Name{"net.ipv4.tcp_keepalive_time"})
	if err != nil {
		return nil, err
	}
	s := v["net.ipv4.tcp_keepalive_time"]
	r.atCreate.Store(&s)
	return &runtimeapi.CreateContainerResponse{ContainerId: "c1"}, nil
}

func (r *nsRuntime) RunPodSandbox(context.Context, *runtimeapi.RunPodSandboxRequest) (*runtimeapi.RunPodSandboxResponse, error) {
	return &runtimeapi.RunPodSandboxResponse{PodSandboxId: "sb1"}, nil
}

func (r *nsRuntime) PodSandboxStatus(_ context.Context, req *runtimeapi.PodSandboxStatusRequest) (*runtimeapi.PodSandboxStatusResponse, error) {
	if !req.Verbose {
		return nil, status.Error(codes.InvalidArgument, "want verbose")
	}
	return &runtimeapi.PodSandboxStatusResponse{
		Status: &runtimeapi.PodSandboxStatus{Id: req.PodSandboxId, State: runtimeapi.PodSandboxState_SANDBOX_READY},
		Info:   map[string]string{"info": fmt.Sprintf(`{"pid": %d}`, r.pid)},
	}, nil
}

func (r *nsRuntime) StopPodSandbox(context.Context, *runtimeapi.StopPodSandboxRequest) (*runtimeapi.StopPodSandboxResponse, error) {
	r.stopped.Add(1)
	return &runtimeapi.StopPodSandboxResponse{}, nil
}

func (r *nsRuntime) RemovePodSandbox(context.Context, *runtimeapi.RemovePodSandboxRequest) (*runtimeapi.RemovePodSandboxResponse, error) {
	r.remove.Add(1)
	return &runtimeapi.RemovePodSandboxResponse{}, nil
}

// sandboxProcess starts a process born in new network and IPC namespaces, as a pause
// container. Cloneflags put the child there at its creation: nothing of the test process, no
// thread of it, ever enters them.
func sandboxProcess(t *testing.T) int {
	t.Helper()
	cmd := exec.Command("sleep", "300")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET | syscall.CLONE_NEWIPC}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start a process in new namespaces: %v", err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return cmd.Process.Pid
}

func TestSysctlVerifyPolicies(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: enters the sandbox's network namespace")
	}
	const name = "net.ipv4.tcp_keepalive_time"
	host, err := sysctl.ReadNode(name)
	if err != nil {
		t.Fatal(err)
	}
	want := "611"
	if host == want {
		want = "613"
	}
	for _, tc := range []verifyCase{
		{sysctl.VerifyRepair, codes.OK, want, "repaired", sysctl.ResultRepaired, false},
		{sysctl.VerifyFail, codes.FailedPrecondition, "", "failed", "", true},
		{sysctl.VerifyWarn, codes.OK, "", "mismatch", sysctl.ResultMismatch, false},
	} {
		// The pause process found in the sandbox's cgroup (containerd's layout: verified during
		// RunPodSandbox), or not (verified once the sandbox's status is read: in the background
		// but for verify: fail).
		for _, inCgroup := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/pauseInCgroup=%v", tc.policy, inCgroup), func(t *testing.T) {
				testSysctlVerifyPolicy(t, name, want, host, tc, inCgroup)
			})
		}
	}
}

// verifyCase is a case of TestSysctlVerifyPolicies.
type verifyCase struct {
	policy    sysctl.VerifyMode
	code      codes.Code
	inPod     string // value in the sandbox afterwards; "" = the kernel's default
	result    string // the verifications_total label
	recorded  string // the registry's verification result; "" = no record
	cleanedUp bool
}

func testSysctlVerifyPolicy(t *testing.T, name sysctl.Name, want, host string, tc verifyCase, inCgroup bool) {
	rt := &nsRuntime{pid: sandboxProcess(t)}
	procs := func(path string) ([]int, error) {
		if !inCgroup || path != "/k8s.io/sb1" {
			return nil, errdefs.ErrNotFound
		}
		return []int{rt.pid}, nil
	}
	defaultInPod, err := sysctl.Read(sysctl.ForPID(rt.pid), []sysctl.Name{name})
	if err != nil {
		t.Fatal(err)
	}
	r := newRig(t, rt, sysctl.Config{}, tc.policy, sysctl.WithCgroupProcs(procs))

	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	client := r.proxy.Client
	sbConfig := &runtimeapi.PodSandboxConfig{
		Metadata: &runtimeapi.PodSandboxMetadata{Name: "p", Namespace: "ns", Uid: "u"},
		Linux:    &runtimeapi.LinuxPodSandboxConfig{Sysctls: map[string]string{string(name): want}},
	}
	resp, err := client.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: sbConfig}, grpc.WaitForReady(true))
	if status.Code(err) != tc.code {
		t.Fatalf("RunPodSandbox: %v, want %v", err, tc.code)
	}
	wantInPod := tc.inPod
	if wantInPod == "" {
		wantInPod = defaultInPod[name]
	}
	if tc.code != codes.OK {
		if !strings.Contains(err.Error(), string(name)) {
			t.Errorf("error %v does not name the sysctl", err)
		}
	} else {
		// The kubelet's next step: the container must not reach the runtime before
		// the sandbox's sysctls are verified (and, with repair, repaired).
		if _, err := client.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: resp.PodSandboxId, SandboxConfig: sbConfig}); err != nil {
			t.Fatal(err)
		}
		if at := rt.atCreate.Load(); at == nil || *at != wantInPod {
			t.Errorf("when CreateContainer reached the runtime the sandbox had %s = %v, want %s", name, at, wantInPod)
		}
		waited := findMetric(t, r.metrics, "podgate_sysctl_duration_seconds", "phase", "wait").GetHistogram().GetSampleCount()
		if inCgroup && waited != 0 {
			t.Errorf("CreateContainer waited %d times for a verification, want none: it was done in RunPodSandbox", waited)
		}
		if rec, _ := r.records.Sandbox("sb1"); inCgroup && rec.Verification != tc.recorded {
			t.Errorf("sandbox's verification %q when RunPodSandbox answered, want %q", rec.Verification, tc.recorded)
		}
	}
	got, err := sysctl.Read(sysctl.ForPID(rt.pid), []sysctl.Name{name})
	if err != nil {
		t.Fatal(err)
	}
	if got[name] != wantInPod {
		t.Errorf("in the sandbox %s = %s, want %s", name, got[name], wantInPod)
	}
	if cleaned := rt.stopped.Load() == 1 && rt.remove.Load() == 1; cleaned != tc.cleanedUp {
		t.Errorf("sandbox stopped %d, removed %d times; want cleanup=%v", rt.stopped.Load(), rt.remove.Load(), tc.cleanedUp)
	}
	if n := findMetric(t, r.metrics, "podgate_sysctl_verifications_total", "result", tc.result).GetCounter().GetValue(); n != 1 {
		t.Errorf("verifications_total{result=%q} = %v, want 1", tc.result, n)
	}
	// Waiting for the background verification, as shutdown does: its result is then recorded.
	if err := r.wait(t.Context()); err != nil {
		t.Fatal(err)
	}
	checkRecorded(t, r, "sb1", tc.recorded)
	if now, _ := sysctl.ReadNode(name); now != host {
		t.Errorf("host %s changed to %s", name, now)
	}
}

// checkRecorded checks that the registry (with its sysctl records) and its checkpoint hold
// sandbox id with this sysctl verification result, or, when verification is "", that neither
// holds it.
func checkRecorded(t *testing.T, r *rig, id, verification string) {
	t.Helper()
	onDiskReg, onDiskRecords := openState(t, r.stateDir)
	for _, c := range []struct {
		where   string
		reg     *registry.Registry
		records *sysctl.Records
	}{{"registry", r.registry, r.records}, {"checkpoint", onDiskReg, onDiskRecords}} {
		_, ok := c.reg.Sandbox(id)
		rec, _ := c.records.Sandbox(id)
		switch {
		case verification == "" && ok:
			t.Errorf("%s still holds sandbox %s, sysctls %+v", c.where, id, rec)
		case verification != "" && !ok:
			t.Errorf("%s lacks sandbox %s: %+v", c.where, id, c.reg.Sandboxes())
		case verification != "" && rec.Verification != verification:
			t.Errorf("%s: sandbox %s sysctl verification %q, want %q", c.where, id, rec.Verification, verification)
		}
	}
}

// findMetric returns the series name{label=value} in reg; nil, whose getters give zeros, when
// absent.
func findMetric(t *testing.T, reg prometheus.Gatherer, name, label, value string) *dto.Metric {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if mf.GetName() == name && lp.GetName() == label && lp.GetValue() == value {
					return m
				}
			}
		}
	}
	return nil
}
