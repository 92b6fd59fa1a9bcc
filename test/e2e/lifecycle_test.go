package e2e

import (
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/util/wait"
)

func TestSocketAndSecondInstance(t *testing.T) {
	n := startNode(t)
	fi, err := os.Stat(n.podgate.Socket)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o660 {
		t.Errorf("socket mode %v, want a socket with 0660", fi.Mode())
	}

	// A second podgate on the same socket must refuse, not steal it.
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, podgateBin, "--cri-socket", n.podgate.Socket,
		"--runtime-endpoint", n.rig.Endpoint, "--metrics-address", "", "--state-dir", t.TempDir()).CombinedOutput()
	if code := exitCode(err); code != 1 {
		t.Errorf("second podgate exited %d (%v), want 1; output:\n%s", code, err, out)
	}
	if !strings.Contains(string(out), "is in use") {
		t.Errorf("second podgate output lacks a clear reason:\n%s", out)
	}
	// The first still serves.
	if _, err := n.through.Runtime.Version(t.Context(), "v1"); err != nil {
		t.Errorf("first podgate after the second tried: %v", err)
	}
}

func TestContainerdRestart(t *testing.T) {
	n := startNode(t)
	ctx := t.Context()
	if code, body := get(t, n.podgate.MetricsURL+"/readyz"); code != http.StatusOK {
		t.Fatalf("readyz with containerd up: %d %s", code, body)
	}

	if err := n.rig.StopContainerd(ctx); err != nil {
		t.Fatal(err)
	}
	code, body := get(t, n.podgate.MetricsURL+"/readyz")
	if code != http.StatusServiceUnavailable || !strings.Contains(body, n.rig.Endpoint) {
		t.Errorf("readyz with containerd down: %d %q, want 503 naming %s", code, body, n.rig.Endpoint)
	}
	// The kubelet's call fails fast, with the kubelet's own 2-minute-style deadline far away.
	callCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	_, err := n.through.Runtime.Version(callCtx, "v1")
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "runtime backend") {
		t.Errorf("Version with containerd down: %v, want Unavailable naming the runtime backend", err)
	}
	if code, _ := get(t, n.podgate.MetricsURL+"/healthz"); code != http.StatusOK {
		t.Errorf("healthz with containerd down: %d, want 200 (podgate itself is fine)", code)
	}

	if err := n.rig.RestartContainerd(ctx); err != nil {
		t.Fatal(err)
	}
	// podgate reconnects with a backoff capped at 2s: ready again within a few attempts.
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		code, body = get(t, n.podgate.MetricsURL+"/readyz")
		return code == http.StatusOK, nil
	}); err != nil {
		t.Fatalf("readyz after containerd restart: %d %s (%v)", code, body, err)
	}
	if _, err := n.through.Runtime.Status(ctx, false); err != nil {
		t.Errorf("Status after restart: %v", err)
	}
	metrics, err := n.podgate.Metrics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(metrics, `podgate_cri_requests_total{code="Unavailable",method="Version"} 1`) {
		t.Errorf("metrics do not count the failed Version call")
	}
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	c := http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func exitCode(err error) int {
	if err == nil {
		return 0
	}
	if ee, ok := errors.AsType[*exec.ExitError](err); ok {
		return ee.ExitCode()
	}
	return -1
}
