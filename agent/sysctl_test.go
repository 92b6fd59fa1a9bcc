package agent

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/vishvananda/netns"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/klog/v2"

	"github.com/podgate/podgate/cri"
	"github.com/podgate/podgate/sysctl"
	"github.com/podgate/podgate/test/testfs"
)

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
		Status: &runtimeapi.PodSandboxStatus{Id: req.PodSandboxId},
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

// sandboxProcess starts a process in new network and IPC namespaces, as a pause container.
func sandboxProcess(t *testing.T) int {
	t.Helper()
	cmd := exec.Command("unshare", "--net", "--ipc", "sleep", "300")
	if err := cmd.Start(); err != nil {
		t.Fatalf("unshare: %v", err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	self, _ := os.Readlink("/proc/self/ns/net")
	deadline := time.Now().Add(10 * time.Second)
	for {
		if l, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", cmd.Process.Pid)); err == nil && l != self {
			return cmd.Process.Pid
		}
		if time.Now().After(deadline) {
			t.Fatal("unshared process never got its own network namespace")
		}
		time.Sleep(5 * time.Millisecond)
	}
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
	for _, tc := range []struct {
		policy    string
		code      codes.Code
		inPod     string // value in the sandbox afterwards; "" = the kernel's default
		result    string
		cleanedUp bool
	}{
		{VerifyRepair, codes.OK, want, "repaired", false},
		{VerifyFail, codes.FailedPrecondition, "", "failed", true},
		{VerifyWarn, codes.OK, "", "mismatch", false},
	} {
		t.Run(tc.policy, func(t *testing.T) {
			rt := &nsRuntime{pid: sandboxProcess(t)}
			defaultInPod, err := sysctl.Read(sysctl.ForPID(rt.pid), []sysctl.Name{name})
			if err != nil {
				t.Fatal(err)
			}
			dir := testfs.ShortDir(t)
			backendPath := filepath.Join(dir, "rt.sock")
			l, err := net.Listen("unix", backendPath)
			if err != nil {
				t.Fatal(err)
			}
			gs := grpc.NewServer()
			runtimeapi.RegisterRuntimeServiceServer(gs, rt)
			go gs.Serve(l) //nolint:errcheck // ends with Stop
			defer gs.Stop()

			backend, err := cri.NewBackend(t.Context(), "runtime", backendPath)
			if err != nil {
				t.Fatal(err)
			}
			defer backend.Close()
			srv := cri.NewServer(backend, backend)
			policy, err := sysctl.NewPolicy(sysctl.Config{}, sysctl.KernelVersion{Major: 6, Minor: 0}, sysctl.ProcSys)
			if err != nil {
				t.Fatal(err)
			}
			guard := newSysctlGuard(policy, tc.policy, srv.RuntimeClient(), prometheus.NewRegistry())
			guard.register(srv)
			pl, err := cri.Listen(filepath.Join(dir, "pg.sock"), cri.SocketOptions{Mode: 0o600})
			if err != nil {
				t.Fatal(err)
			}
			go srv.Serve(pl) //nolint:errcheck // returns nil after Shutdown
			defer srv.Shutdown(context.Background())

			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			client := criClient(t, filepath.Join(dir, "pg.sock"))
			sbConfig := &runtimeapi.PodSandboxConfig{
				Metadata: &runtimeapi.PodSandboxMetadata{Name: "p", Namespace: "ns", Uid: "u"},
				Linux:    &runtimeapi.LinuxPodSandboxConfig{Sysctls: map[string]string{name: want}},
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
				if !strings.Contains(err.Error(), name) {
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
			if n := testutil.ToFloat64(guard.verified.WithLabelValues(tc.result)); n != 1 {
				t.Errorf("verifications_total{result=%q} = %v, want 1", tc.result, n)
			}
			if now, _ := sysctl.ReadNode(name); now != host {
				t.Errorf("host %s changed to %s", name, now)
			}
		})
	}
}

func TestNodeSysctlsWrittenOnlyWhenDifferent(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates a network namespace to stand in for the node")
	}
	const name = "net.ipv4.tcp_keepalive_time"
	host, err := sysctl.ReadNode(name)
	if err != nil {
		t.Fatal(err)
	}
	// Run on a thread moved into a fresh network namespace, so the "node" is not the host.
	// The thread stays locked and is dropped with its goroutine: it never returns to the pool.
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread()
		if _, err := netns.New(); err != nil {
			t.Error(err)
			return
		}
		logger := klog.Background()
		changed, err := applyNodeSysctls(logger, map[sysctl.Name]string{name: "777", "net.ipv4.tcp_fin_timeout": "33"})
		if err != nil || !slices.Equal(changed, []sysctl.Name{"net.ipv4.tcp_fin_timeout", name}) {
			t.Errorf("first apply: changed %v, %v", changed, err)
		}
		if v, _ := sysctl.ReadNode(name); v != "777" {
			t.Errorf("%s = %s after apply, want 777", name, v)
		}
		changed, err = applyNodeSysctls(logger, map[sysctl.Name]string{name: "777", "net.ipv4.tcp_fin_timeout": "20"})
		if err != nil || !slices.Equal(changed, []sysctl.Name{"net.ipv4.tcp_fin_timeout"}) {
			t.Errorf("second apply (lowering one value, keeping the other): changed %v, %v", changed, err)
		}
	}()
	<-done
	if v, _ := sysctl.ReadNode(name); v != host {
		t.Errorf("host %s changed to %s", name, v)
	}
}
