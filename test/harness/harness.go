// Package harness builds and runs the real podgate binary for end-to-end tests and the demo:
// it starts podgate in front of a backend endpoint, waits for podgate's systemd READY=1
// notification (the same signal systemd waits for), and stops it with SIGTERM.
package harness

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/podgate/podgate/test/scrape"
)

// readyTimeout bounds podgate's start-up: it does not wait for its backend, so READY=1 comes
// as soon as the socket is bound; 30s covers a loaded CI machine under -race.
const readyTimeout = 30 * time.Second

// Build compiles ./cmd/podgate of the module containing this package into dir, with extra go
// build flags (the e2e tests add -race). Like `make build`, it stamps the binary with
// `git describe --tags --always --dirty`, or "dev" outside a git checkout, and builds it
// without cgo (static), as it ships; only with -race, which needs cgo, is cgo left on.
func Build(ctx context.Context, dir string, flags ...string) (string, error) {
	root, err := moduleRoot()
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "podgate")
	args := append(append([]string{"build", "-ldflags", "-X main.version=" + describe(ctx, root)}, flags...), "-o", bin, "./cmd/podgate")
	if err := goBuild(ctx, root, !slices.Contains(flags, "-race"), args); err != nil {
		return "", err
	}
	return bin, nil
}

// BuildPrograms compiles ./cmd/podgate, stamped and static as Build does, and the main packages
// pkgs (paths relative to the module's root, such as ./test/dradriver) into dir, in one go build:
// the packages they share are compiled once and the binaries linked in parallel. Each binary is
// named after its package's directory; the result maps those names to the binaries' paths.
func BuildPrograms(ctx context.Context, dir string, pkgs ...string) (map[string]string, error) {
	root, err := moduleRoot()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	pkgs = append([]string{"./cmd/podgate"}, pkgs...)
	// With -o naming a directory (the trailing slash), go build writes every main package there.
	args := append([]string{"build", "-ldflags", "-X main.version=" + describe(ctx, root), "-o", dir + "/"}, pkgs...)
	if err := goBuild(ctx, root, true, args); err != nil {
		return nil, err
	}
	bins := map[string]string{}
	for _, p := range pkgs {
		bins[filepath.Base(p)] = filepath.Join(dir, filepath.Base(p))
	}
	return bins, nil
}

// goBuild runs go with args in root; static builds without cgo (CGO_ENABLED=0), as the
// Makefile builds podgate (see its build target), unless the environment sets CGO_ENABLED:
// CGO_ENABLED=1 go test ... measures a build linked against libc.
func goBuild(ctx context.Context, root string, static bool, args []string) error {
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = root
	if _, set := os.LookupEnv("CGO_ENABLED"); static && !set {
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return nil
}

// describe is the Makefile's VERSION: `git describe --tags --always --dirty` in dir, or "dev"
// when dir is not a git checkout (or git is missing).
func describe(ctx context.Context, dir string) string {
	cmd := exec.CommandContext(ctx, "git", "describe", "--tags", "--always", "--dirty")
	cmd.Dir = dir
	out, err := cmd.Output()
	if v := strings.TrimSpace(string(out)); err == nil && v != "" {
		return v
	}
	return "dev"
}

func moduleRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	mod := strings.TrimSpace(string(out))
	if mod == "" || mod == os.DevNull {
		return "", errors.New("not inside the podgate module")
	}
	return filepath.Dir(mod), nil
}

// Podgate is a running podgate process.
type Podgate struct {
	// Socket is podgate's CRI socket path.
	Socket string
	// Endpoint is unix://Socket.
	Endpoint string
	// PodResourcesSocket is podgate's PodResources socket path.
	PodResourcesSocket string
	// MetricsURL is http://host:port of the metrics listener.
	MetricsURL string
	// Log holds everything podgate wrote to stderr so far.
	Log *SyncBuffer

	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

// Options for Start.
type Options struct {
	// Dir holds podgate's socket, state and notify socket; keep it short (unix socket paths).
	Dir string
	// RuntimeEndpoint is the backend (containerd).
	RuntimeEndpoint string
	// Args are more command-line arguments.
	Args []string
	// Stderr, when set, also receives podgate's log.
	Stderr io.Writer
	// Env holds more environment variables (KEY=value) for podgate, beside the caller's own.
	Env []string
}

// Start runs podgate and waits until it told systemd it is ready.
func Start(ctx context.Context, bin string, o Options) (*Podgate, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	p := &Podgate{
		Socket:             filepath.Join(o.Dir, "cri.sock"),
		PodResourcesSocket: filepath.Join(o.Dir, "pr.sock"),
		MetricsURL:         fmt.Sprintf("http://127.0.0.1:%d", port),
		Log:                &SyncBuffer{},
		done:               make(chan struct{}),
	}
	p.Endpoint = "unix://" + p.Socket
	notifyPath := filepath.Join(o.Dir, "notify.sock")
	_ = os.Remove(notifyPath)
	notify, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: notifyPath, Net: "unixgram"})
	if err != nil {
		return nil, fmt.Errorf("notify socket: %w", err)
	}
	defer notify.Close()

	args := append([]string{
		"--cri-socket", p.Socket,
		"--podresources-socket", p.PodResourcesSocket,
		"--runtime-endpoint", o.RuntimeEndpoint,
		"--metrics-address", fmt.Sprintf("127.0.0.1:%d", port),
		"--state-dir", filepath.Join(o.Dir, "state"),
	}, o.Args...)
	p.cmd = exec.Command(bin, args...)
	p.cmd.Env = append(append(os.Environ(), o.Env...), "NOTIFY_SOCKET="+notifyPath)
	var stderr io.Writer = p.Log
	if o.Stderr != nil {
		stderr = io.MultiWriter(p.Log, o.Stderr)
	}
	p.cmd.Stderr = stderr
	p.cmd.Stdout = stderr
	if err := p.cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.done)
	}()

	ready := make(chan error, 1)
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := notify.Read(buf)
			if err != nil {
				ready <- err
				return
			}
			if bytes.Contains(buf[:n], []byte("READY=1")) {
				ready <- nil
				return
			}
		}
	}()
	timer := time.NewTimer(readyTimeout)
	defer timer.Stop()
	select {
	case err := <-ready:
		if err != nil {
			p.Kill()
			return nil, fmt.Errorf("wait for READY=1: %w", err)
		}
		return p, nil
	case <-p.done:
		return nil, fmt.Errorf("podgate exited before it was ready: %w\n%s", p.err, p.Log)
	case <-timer.C:
		p.Kill()
		return nil, fmt.Errorf("podgate not ready after %s:\n%s", readyTimeout, p.Log)
	case <-ctx.Done():
		p.Kill()
		return nil, ctx.Err()
	}
}

// Stop sends SIGTERM and waits for podgate to exit; it returns the exit code.
func (p *Podgate) Stop(timeout time.Duration) (int, error) {
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return -1, err
	}
	select {
	case <-p.done:
	case <-time.After(timeout):
		p.Kill()
		return -1, fmt.Errorf("podgate did not exit within %s of SIGTERM", timeout)
	}
	return p.cmd.ProcessState.ExitCode(), nil
}

// PID is the podgate process's ID.
func (p *Podgate) PID() int { return p.cmd.Process.Pid }

// Kill ends podgate at once.
func (p *Podgate) Kill() {
	_ = p.cmd.Process.Kill() // already gone is fine
	<-p.done
}

// Metrics returns podgate's /metrics page.
func (p *Podgate) Metrics(ctx context.Context) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.MetricsURL+"/metrics", nil)
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// Scrape reads and parses podgate's /metrics page.
func (p *Podgate) Scrape(ctx context.Context) (scrape.Metrics, error) {
	page, err := p.Metrics(ctx)
	if err != nil {
		return nil, err
	}
	return scrape.Parse(page)
}

var pullStarted = regexp.MustCompile(`"Image pull started" image="([^"]+)"`)

// PullsStarted returns the images whose pulls podgate's log (klog's text format) says started,
// in that order: the order of the pull governor's queue.
func PullsStarted(log string) []string {
	var out []string
	for _, m := range pullStarted.FindAllStringSubmatch(log, -1) {
		out = append(out, m[1])
	}
	return out
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// SyncBuffer is a bytes.Buffer safe for one writer and concurrent readers.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String returns what was written so far.
func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// buildTimeout bounds BuildProgram: one main package of this module on two loaded cores.
const buildTimeout = 5 * time.Minute

// BuildProgram compiles the main package pkg of this module (an import path, such as
// github.com/podgate/podgate/test/cni/recorder) into dir/name for a test, and returns the
// binary's path; a build that fails, or takes more than five minutes, fails t. CNI plugins are
// named after their type (pgrecorder), hence the name.
func BuildProgram(t testing.TB, pkg, dir, name string) string {
	t.Helper()
	root, err := moduleRoot()
	if err != nil {
		t.Fatalf("build %s: %v", pkg, err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), buildTimeout)
	defer cancel()
	bin := filepath.Join(dir, name)
	if err := goBuild(ctx, root, false, []string{"build", "-o", bin, pkg}); err != nil {
		t.Fatalf("build %s: %v", pkg, err)
	}
	return bin
}
