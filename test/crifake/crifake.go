// Package crifake is a CRI runtime for unit tests, served over real gRPC on a unix socket, and
// podgate's CRI server in front of it, so that a package's tests meet the runtime as podgate
// does in production: cri-client's fake runtime (k8s.io/cri-client/pkg/fake, what the
// kubelet's own tests use) with the few hooks the sandbox pipeline's tests need.
package crifake

import (
	"context"
	"encoding/json"
	"net"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/cri-client/pkg/fake"

	"github.com/podgate/podgate/cri"
	"github.com/podgate/podgate/test/testfs"
)

// Runtime is cri-client's fake runtime with hooks in RunPodSandbox and PodSandboxStatus.
type Runtime struct {
	*fake.RemoteRuntime
	// OnRun, when set, runs in RunPodSandbox before the sandbox is created.
	OnRun func()
	// StatusErr, when set, is the answer to every PodSandboxStatus.
	StatusErr error
	// NetNS, when set, is every sandbox's network namespace in its verbose status, where
	// containerd reports it (the runtime spec's namespaces).
	NetNS string
}

// NewRuntime returns a fake runtime without hooks.
func NewRuntime() *Runtime { return &Runtime{RemoteRuntime: fake.NewFakeRemoteRuntime()} }

// RunPodSandbox runs OnRun, then creates the sandbox.
func (r *Runtime) RunPodSandbox(ctx context.Context, req *runtimeapi.RunPodSandboxRequest) (*runtimeapi.RunPodSandboxResponse, error) {
	if r.OnRun != nil {
		r.OnRun()
	}
	return r.RemoteRuntime.RunPodSandbox(ctx, req)
}

// PodSandboxStatus answers StatusErr when set, else the fake's status with NetNS in its
// verbose info.
func (r *Runtime) PodSandboxStatus(ctx context.Context, req *runtimeapi.PodSandboxStatusRequest) (*runtimeapi.PodSandboxStatusResponse, error) {
	if r.StatusErr != nil {
		return nil, r.StatusErr
	}
	resp, err := r.RemoteRuntime.PodSandboxStatus(ctx, req)
	if err != nil || r.NetNS == "" {
		return resp, err
	}
	info, err := json.Marshal(map[string]any{"runtimeSpec": map[string]any{"linux": map[string]any{
		"namespaces": []map[string]string{{"type": "network", "path": r.NetNS}},
	}}})
	if err != nil {
		return nil, err
	}
	resp.Info = map[string]string{"info": string(info)}
	return resp, nil
}

// Sandboxes is what the runtime holds, read past podgate.
func (r *Runtime) Sandboxes(t testing.TB) []*runtimeapi.PodSandbox {
	t.Helper()
	items, err := r.RuntimeService.ListPodSandbox(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	return items
}

// Serve serves rt as a CRI runtime on the unix socket path until the test ends.
func Serve(t testing.TB, path string, rt runtimeapi.RuntimeServiceServer) {
	t.Helper()
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	runtimeapi.RegisterRuntimeServiceServer(gs, rt)
	served := make(chan struct{})
	go func() { defer close(served); _ = gs.Serve(l) }() // returns when stopped below
	t.Cleanup(func() { gs.Stop(); <-served })
}

// Proxy is podgate's CRI server in front of a runtime, both on unix sockets in Dir (short
// enough for a socket's path).
type Proxy struct {
	Dir    string
	Server *cri.Server
	// Client is the kubelet's: a client of the proxy's socket, once Start has run.
	Client runtimeapi.RuntimeServiceClient
}

// NewProxy serves rt and builds a CRI server in front of it. The test plugs its hooks into
// Server, then calls Start.
func NewProxy(t testing.TB, rt runtimeapi.RuntimeServiceServer) *Proxy {
	t.Helper()
	dir := testfs.ShortDir(t)
	path := filepath.Join(dir, "rt.sock")
	Serve(t, path, rt)
	backend, err := cri.NewBackend(t.Context(), "runtime", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = backend.Close() })
	return &Proxy{Dir: dir, Server: cri.NewServer(backend, backend)}
}

// Start serves the CRI socket until the test ends and connects Client to it.
func (p *Proxy) Start(t testing.TB) {
	t.Helper()
	socket := filepath.Join(p.Dir, "cri.sock")
	l, err := cri.Listen(socket, cri.SocketOptions{Mode: 0o600})
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- p.Server.Serve(l) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		p.Server.Shutdown(ctx)
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	p.Client = runtimeapi.NewRuntimeServiceClient(conn)
}

// RunPod asks the proxy for a sandbox of pod ns/name (UID "uid-"+name), as the kubelet does,
// and returns its ID.
func (p *Proxy) RunPod(t testing.TB, name string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	resp, err := p.Client.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: PodConfig(name)}, grpc.WaitForReady(true))
	return resp.GetPodSandboxId(), err
}

// PodConfig is the sandbox config of pod ns/name, UID "uid-"+name.
func PodConfig(name string) *runtimeapi.PodSandboxConfig {
	return &runtimeapi.PodSandboxConfig{
		Metadata: &runtimeapi.PodSandboxMetadata{Name: name, Namespace: "ns", Uid: "uid-" + name},
	}
}
