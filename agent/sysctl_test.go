package agent

import (
	"context"
	"errors"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"k8s.io/apimachinery/pkg/util/wait"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/cri-client/pkg/fake"

	"github.com/podgate/podgate/agent/config"
	"github.com/podgate/podgate/sysctl"
	"github.com/podgate/podgate/test/testfs"
)

// heldStatus is a fake runtime that gives a sandbox's status only once release is closed, and
// notes a CreateContainer that comes before.
type heldStatus struct {
	*fake.RemoteRuntime
	release chan struct{}
	early   atomic.Bool
}

func newHeldStatus() *heldStatus {
	return &heldStatus{RemoteRuntime: fake.NewFakeRemoteRuntime(), release: make(chan struct{})}
}

func (r *heldStatus) PodSandboxStatus(ctx context.Context, req *runtimeapi.PodSandboxStatusRequest) (*runtimeapi.PodSandboxStatusResponse, error) {
	select {
	case <-r.release:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return r.RemoteRuntime.PodSandboxStatus(ctx, req)
}

func (r *heldStatus) CreateContainer(ctx context.Context, req *runtimeapi.CreateContainerRequest) (*runtimeapi.CreateContainerResponse, error) {
	select {
	case <-r.release:
	default:
		r.early.Store(true)
	}
	return r.RemoteRuntime.CreateContainer(ctx, req)
}

// runSysctlPod starts an agent whose runtime is rt and asks it for a sandbox whose sysctl is
// verified in the background (verify: warn, no pause process in a cgroup here).
func runSysctlPod(t *testing.T, rt runtimeapi.RuntimeServiceServer) (a *Agent, cfg *config.Configuration, stop func() error, sb *runtimeapi.PodSandboxConfig, id string) {
	t.Helper()
	dir := testfs.ShortDir(t)
	cfg = testConfig(dir, "")
	cfg.RuntimeEndpoint = "unix://" + serveRuntime(t, dir, rt)
	cfg.Sysctls.Verify = config.VerifyWarn
	a = newAgent(t, cfg)
	stop = runAgentOf(t, a)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	sb = podConfig("p")
	sb.Linux = &runtimeapi.LinuxPodSandboxConfig{Sysctls: map[string]string{"net.ipv4.tcp_keepalive_time": "600"}}
	resp, err := criClient(t, cfg.CRISocket).RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: sb}, grpc.WaitForReady(true))
	if err != nil {
		t.Fatal(err)
	}
	return a, cfg, stop, sb, resp.PodSandboxId
}

// TestShutdownRecordsSysctlVerifications: the sysctl stages are in the agent's pipeline, and a
// verification still running in the background when podgate stops (it waits for the sandbox's
// status, which the runtime gives only then) is waited for: its result reaches the registry
// and the checkpoint (here "error": the fake runtime gives no namespace to read the sysctls
// in), never "pending". How each verify mode acts is package sysctl's to test.
func TestShutdownRecordsSysctlVerifications(t *testing.T) {
	rt := newHeldStatus()
	a, cfg, stop, _, id := runSysctlPod(t, rt)
	go func() { // the runtime answers once podgate's CRI socket is gone: podgate is stopping
		_ = wait.PollUntilContextCancel(t.Context(), time.Millisecond, true, func(context.Context) (bool, error) {
			_, err := os.Stat(cfg.CRISocket)
			return errors.Is(err, os.ErrNotExist), nil
		})
		close(rt.release)
	}()
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	running, _ := proxyOf(t, a).state.Sysctls.Sandbox(id)
	onDisk, _ := openTestState(t, cfg.StateDir).Sysctls.Sandbox(id)
	if running.Verification != sysctl.ResultError || onDisk.Verification != sysctl.ResultError {
		t.Errorf("after the stop the registry holds %+v, the checkpoint %+v; want the verification's result, error", running, onDisk)
	}
	// The feature's metrics are the agent's.
	if n := histogramCount(t, a.registry, "podgate_sysctl_duration_seconds", "phase", "verify"); n != 1 {
		t.Errorf("podgate_sysctl_duration_seconds{phase=verify} has %d samples, want the one verification", n)
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
