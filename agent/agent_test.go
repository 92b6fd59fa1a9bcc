package agent

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/cri-client/pkg/fake"

	"github.com/podgate/podgate/agent/config"
	"github.com/podgate/podgate/test/testfs"
)

func testConfig(dir, backend string) *config.Configuration {
	c := config.DefaultConfiguration()
	c.CRISocket = filepath.Join(dir, "run", "cri.sock") // the directory does not exist yet
	c.RuntimeEndpoint = "unix://" + backend
	off := ""
	c.MetricsAddress = &off
	pr := filepath.Join(dir, "run", "pr.sock")
	c.PodResources.Socket = &pr
	c.PodResources.KubeletSocket = &off
	c.KubeletPodsAPISocket = &off // the pods from the test's API server, whatever the machine runs
	c.StateDir = filepath.Join(dir, "state")
	return c
}

// runAgent starts the agent and returns a function that stops it and returns Run's result.
func runAgent(t *testing.T, cfg *config.Configuration) (stop func() error) {
	t.Helper()
	return runAgentOf(t, New(cfg, "test"))
}

// runAgentOf runs a and returns a function that stops it and returns Run's result.
func runAgentOf(t *testing.T, a *Agent) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	errc := make(chan error, 1)
	go func() { errc <- a.Run(ctx) }()
	return func() error {
		cancel()
		select {
		case err := <-errc:
			return err
		case <-time.After(30 * time.Second):
			t.Fatal("agent did not stop within 30s of cancellation")
			return nil
		}
	}
}

func criClient(t testing.TB, socket string) runtimeapi.RuntimeServiceClient {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return runtimeapi.NewRuntimeServiceClient(conn)
}

// startFakeRuntime serves cri-client's fake runtime on dir/containerd.sock until the test ends
// and returns it with the socket's path.
func startFakeRuntime(t *testing.T, dir string) (*fake.RemoteRuntime, string) {
	t.Helper()
	path := filepath.Join(dir, "containerd.sock")
	f := fake.NewFakeRemoteRuntime()
	if err := f.Start("unix://" + path); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.Stop)
	return f, path
}

func TestRunServesAndStopsCleanly(t *testing.T) {
	dir := testfs.ShortDir(t)
	_, backend := startFakeRuntime(t, dir)
	cfg := testConfig(dir, backend)
	stop := runAgent(t, cfg)

	// WaitForReady: the socket appears once Run has bound it.
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	v, err := criClient(t, cfg.CRISocket).Version(ctx, &runtimeapi.VersionRequest{}, grpc.WaitForReady(true))
	if err != nil {
		t.Fatal(err)
	}
	if v.RuntimeName != "fakeRuntime" {
		t.Errorf("Version through the agent = %v", v)
	}
	if fi, err := os.Stat(cfg.StateDir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("state dir: %v %v, want 0700", fi, err)
	}
	if err := stop(); err != nil {
		t.Fatalf("Run after cancel: %v, want nil", err)
	}
	if _, err := os.Stat(cfg.CRISocket); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket left behind after stop: %v", err)
	}
}

func TestRunStartsWithoutBackend(t *testing.T) {
	dir := testfs.ShortDir(t)
	cfg := testConfig(dir, filepath.Join(dir, "missing.sock"))
	stop := runAgent(t, cfg)
	defer stop() //nolint:errcheck // the assertion is on the call below

	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	client := criClient(t, cfg.CRISocket)
	// WaitForReady waits for the agent's socket; the answer must then be the backend's absence.
	_, err := client.Version(ctx, &runtimeapi.VersionRequest{}, grpc.WaitForReady(true))
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "missing.sock") {
		t.Fatalf("got %v, want Unavailable naming the missing backend", err)
	}
}

// listenOnCRISocket makes cfg's CRI socket exist, with a listener behind it.
func listenOnCRISocket(t *testing.T, cfg *config.Configuration) *net.UnixListener {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(cfg.CRISocket), 0o755); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("unix", cfg.CRISocket)
	if err != nil {
		t.Fatal(err)
	}
	return l.(*net.UnixListener)
}

func TestRunRefusesSocketInUse(t *testing.T) {
	dir := testfs.ShortDir(t)
	cfg := testConfig(dir, filepath.Join(dir, "missing.sock"))
	l := listenOnCRISocket(t, cfg)
	defer l.Close()
	err := New(cfg, "test").Run(t.Context())
	if err == nil || !strings.Contains(err.Error(), "criSocket:") || !strings.Contains(err.Error(), "in use") {
		t.Fatalf("got %v, want a criSocket in-use error", err)
	}
}

func TestRunRefusesBackendThatIsItself(t *testing.T) {
	dir := testfs.ShortDir(t)
	cfg := testConfig(dir, filepath.Join(dir, "containerd.sock"))
	// The image endpoint reaches podgate's own socket through a symlink: only the files tell.
	link := filepath.Join(dir, "images.sock")
	if err := os.Symlink(cfg.CRISocket, link); err != nil {
		t.Fatal(err)
	}
	cfg.ImageEndpoint = "unix://" + link
	if err := Validate(cfg); err != nil {
		t.Fatalf("Validate: %v (the symlink is for Run to find)", err)
	}
	err := New(cfg, "test").Run(t.Context())
	if err == nil || !strings.Contains(err.Error(), "imageEndpoint:") || !strings.Contains(err.Error(), "forward to itself") {
		t.Fatalf("got %v, want imageEndpoint refused as podgate's own socket", err)
	}
	if _, err := os.Stat(cfg.CRISocket); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket left behind: %v", err)
	}
}

func TestRunRemovesStaleSocket(t *testing.T) {
	dir := testfs.ShortDir(t)
	cfg := testConfig(dir, filepath.Join(dir, "missing.sock"))
	l := listenOnCRISocket(t, cfg)
	l.SetUnlinkOnClose(false)
	l.Close() // a socket file nobody listens on: what a crashed podgate leaves
	stop := runAgent(t, cfg)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	_, err := criClient(t, cfg.CRISocket).Version(ctx, &runtimeapi.VersionRequest{}, grpc.WaitForReady(true))
	if status.Code(err) != codes.Unavailable {
		t.Errorf("got %v, want the agent serving (Unavailable: no backend)", err)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}
