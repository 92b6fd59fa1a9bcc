//go:build linux

package agent

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podgate/podgate/agent/config"
	"github.com/podgate/podgate/sysctl"
	"github.com/podgate/podgate/test/testfs"
)

// nsRuntime is a runtime whose sandbox is a real process in its own network and IPC
// namespaces, but which never applies the sandbox's sysctls: every requested value mismatches.
type nsRuntime struct {
	runtimeapi.UnimplementedRuntimeServiceServer
	pid             int
	exists          atomic.Bool
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
	r.exists.Store(true)
	return &runtimeapi.RunPodSandboxResponse{PodSandboxId: "sb1"}, nil
}

// ListPodSandbox lists the sandbox while it exists: podgate's start-up rebuild of its
// registry, which may run at any time during the test, sees the runtime as it is.
func (r *nsRuntime) ListPodSandbox(context.Context, *runtimeapi.ListPodSandboxRequest) (*runtimeapi.ListPodSandboxResponse, error) {
	resp := &runtimeapi.ListPodSandboxResponse{}
	if r.exists.Load() {
		resp.Items = append(resp.Items, &runtimeapi.PodSandbox{Id: "sb1", State: runtimeapi.PodSandboxState_SANDBOX_READY})
	}
	return resp, nil
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
	r.exists.Store(false)
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
		{config.VerifyRepair, codes.OK, want, "repaired", sysctl.ResultRepaired, false},
		{config.VerifyFail, codes.FailedPrecondition, "", "failed", "", true},
		{config.VerifyWarn, codes.OK, "", "mismatch", sysctl.ResultMismatch, false},
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
	policy    string
	code      codes.Code
	inPod     string // value in the sandbox afterwards; "" = the kernel's default
	result    string // the verifications_total label
	recorded  string // the registry's verification result; "" = no record
	cleanedUp bool
}

func testSysctlVerifyPolicy(t *testing.T, name sysctl.Name, want, host string, tc verifyCase, inCgroup bool) {
	rt := &nsRuntime{pid: sandboxProcess(t)}
	procs := cgroupProcs
	t.Cleanup(func() { cgroupProcs = procs })
	cgroupProcs = func(path string) ([]int, error) {
		if !inCgroup || path != "/k8s.io/sb1" {
			return nil, errdefs.ErrNotFound
		}
		return []int{rt.pid}, nil
	}
	defaultInPod, err := sysctl.Read(sysctl.ForPID(rt.pid), []sysctl.Name{name})
	if err != nil {
		t.Fatal(err)
	}
	dir := testfs.ShortDir(t)
	cfg := testConfig(dir, serveRuntime(t, dir, rt))
	cfg.Sysctls.Verify = tc.policy
	a := newAgent(t, cfg)
	stop := runAgentOf(t, a)

	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	client := criClient(t, cfg.CRISocket)
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
		if waited := histogramCount(t, a.registry, "podgate_sysctl_duration_seconds", "phase", "wait"); inCgroup && waited != 0 {
			t.Errorf("CreateContainer waited %d times for a verification, want none: it was done in RunPodSandbox", waited)
		}
		if rec, _ := proxyOf(t, a).state.sysctls.Sandbox("sb1"); inCgroup && rec.Verification != tc.recorded {
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
	if n := counterValue(t, a.registry, "podgate_sysctl_verifications_total", "result", tc.result); n != 1 {
		t.Errorf("verifications_total{result=%q} = %v, want 1", tc.result, n)
	}
	// Stopping waits for the background verification, whose result is then recorded.
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	checkRecorded(t, proxyOf(t, a).state, cfg.StateDir, "sb1", tc.recorded)
	if now, _ := sysctl.ReadNode(name); now != host {
		t.Errorf("host %s changed to %s", name, now)
	}
}

// checkRecorded checks that the registry (of running, its sysctl records) and its checkpoint
// hold sandbox id with this sysctl verification result, or, when verification is "", that
// neither holds it.
func checkRecorded(t *testing.T, running *state, stateDir, id, verification string) {
	t.Helper()
	for _, c := range []struct {
		where string
		st    *state
	}{{"registry", running}, {"checkpoint", openTestState(t, stateDir)}} {
		_, ok := c.st.sandboxes.Sandbox(id)
		rec, _ := c.st.sysctls.Sandbox(id)
		switch {
		case verification == "" && ok:
			t.Errorf("%s still holds sandbox %s, sysctls %+v", c.where, id, rec)
		case verification != "" && !ok:
			t.Errorf("%s lacks sandbox %s: %+v", c.where, id, c.st.sandboxes.Sandboxes())
		case verification != "" && rec.Verification != verification:
			t.Errorf("%s: sandbox %s sysctl verification %q, want %q", c.where, id, rec.Verification, verification)
		}
	}
}

// TestVerifyModesMatchConfig: agent hands the configuration's sysctls.verify to package sysctl
// as it is, so each mode must be spelled the same in both.
func TestVerifyModesMatchConfig(t *testing.T) {
	for c, s := range map[string]sysctl.VerifyMode{
		config.VerifyRepair: sysctl.VerifyRepair, config.VerifyFail: sysctl.VerifyFail, config.VerifyWarn: sysctl.VerifyWarn,
	} {
		if string(s) != c {
			t.Errorf("config's verify mode %q is sysctl's %q", c, s)
		}
	}
}
