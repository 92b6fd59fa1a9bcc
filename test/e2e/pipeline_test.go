package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podgate/podgate/cri/registry"
	"github.com/podgate/podgate/sysctl"
	"github.com/podgate/podgate/test/harness"
	"github.com/podgate/podgate/test/testfs"
)

// roundedSysctl is a namespaced sysctl the kernel stores in jiffies while it is written in
// milliseconds: on a kernel whose HZ is not 1000 it reads back rounded, so a pod asking for an
// odd value gets another one. That is a real mismatch between what was asked and what holds.
const roundedSysctl = "net.ipv4.icmp_ratelimit"

// roundedValue finds a value of roundedSysctl that reads back differently in a new network
// namespace, or skips the test.
func roundedValue(t *testing.T) (asked, got string) {
	t.Helper()
	path := "/proc/sys/" + strings.ReplaceAll(roundedSysctl, ".", "/")
	for _, v := range []string{"1001", "1003", "1007"} {
		out, err := exec.CommandContext(t.Context(), "unshare", "--net", "sh", "-c", fmt.Sprintf("echo %s > %s && cat %s", v, path, path)).CombinedOutput()
		if err != nil {
			t.Fatalf("probe %s in a new network namespace: %v %s", roundedSysctl, err, out)
		}
		if got := strings.TrimSpace(string(out)); got != v {
			return v, got
		}
	}
	t.Skipf("%s reads back every value as written on this kernel (HZ=1000): no real mismatch to provoke", roundedSysctl)
	return "", ""
}

func readCheckpoint(t *testing.T, p *harness.Podgate) []sandboxOnDisk {
	t.Helper()
	d, err := registry.NewCheckpoint(filepath.Join(filepath.Dir(p.Socket), "state")).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	recs := make([]sandboxOnDisk, len(d.Sandboxes))
	for i, sb := range d.Sandboxes {
		recs[i].SandboxRecord = sb
		if raw, ok := d.SandboxFields[sb.ID]["sysctls"]; ok {
			if err := json.Unmarshal(raw, &recs[i].Sysctls); err != nil {
				t.Fatalf("sandbox %s sysctls: %v", sb.ID, err)
			}
		}
	}
	return recs
}

// sandboxOnDisk is a sandbox of the checkpoint with the sysctl feature's record of it.
type sandboxOnDisk struct {
	registry.SandboxRecord
	Sysctls sysctl.Record
}

// waitCheckpoint waits until the checkpoint of a running podgate, which follows its registry
// in the background, satisfies ok; it fails the test after a minute.
func waitCheckpoint(t *testing.T, p *harness.Podgate, ok func([]sandboxOnDisk) bool) []sandboxOnDisk {
	t.Helper()
	var recs []sandboxOnDisk
	waitWithin(t, time.Minute, "the checkpoint as expected", func() bool {
		recs = readCheckpoint(t, p)
		return ok(recs)
	})
	return recs
}

func TestVerifyFailRemovesSandboxThroughThePipeline(t *testing.T) {
	asked, got := roundedValue(t)
	n := startNode(t, "--config", writeConfig(t, fmt.Sprintf(`
sysctls:
  allowedUnsafe: [%q]
  verify: fail
`, roundedSysctl)))
	ctx := t.Context()
	before, err := n.direct.Runtime.ListPodSandbox(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	sb := &runtimeapi.PodSandboxConfig{
		Metadata:     &runtimeapi.PodSandboxMetadata{Name: "rounded", Namespace: "web", Uid: "uid-rounded"},
		LogDirectory: filepath.Join(n.rig.Dir, "pods", "rounded"),
		Linux:        &runtimeapi.LinuxPodSandboxConfig{Sysctls: map[string]string{roundedSysctl: asked}},
	}
	_, err = n.through.Runtime.RunPodSandbox(ctx, sb, "")
	st := status.Convert(err)
	if st.Code() != codes.FailedPrecondition || !strings.Contains(st.Message(), roundedSysctl) || !strings.Contains(st.Message(), got) {
		t.Fatalf("RunPodSandbox asking %s=%s: %v; want FailedPrecondition naming it and the %s that holds", roundedSysctl, asked, err, got)
	}
	after, err := n.direct.Runtime.ListPodSandbox(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(after) != len(before) {
		t.Errorf("containerd holds %d sandboxes, %d before: the failed one was not removed", len(after), len(before))
	}

	// A value that holds starts and is recorded, verified.
	sb.Metadata = &runtimeapi.PodSandboxMetadata{Name: "exact", Namespace: "web", Uid: "uid-exact"}
	sb.Linux.Sysctls = map[string]string{roundedSysctl: "1000"}
	id, err := n.through.Runtime.RunPodSandbox(ctx, sb, "")
	if err != nil {
		t.Fatalf("RunPodSandbox asking %s=1000: %v", roundedSysctl, err)
	}
	// The failed sandbox never reaches the checkpoint; the good one does, verified.
	waitCheckpoint(t, n.podgate, func(recs []sandboxOnDisk) bool {
		return len(recs) == 1 && recs[0].ID == id && recs[0].Sysctls.Verification == sysctl.ResultOK &&
			recs[0].NetNS != "" && recs[0].PID != 0 && len(recs[0].IPs) != 0
	})
	metrics, err := n.podgate.Metrics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []string{`podgate_sysctl_verifications_total{result="failed"} 1`, `podgate_sandbox_stage_failures_total{stage="sysctl-verify"} 1`, "podgate_registry_sandboxes 1"} {
		if !strings.Contains(metrics, m) {
			t.Errorf("metrics lack %q", m)
		}
	}
}

// waitMetric polls podgate's metrics until they contain line, or fails after a minute.
func waitMetric(t *testing.T, p *harness.Podgate, line string) {
	t.Helper()
	waitWithin(t, time.Minute, "metrics showing "+line, func() bool {
		m, err := p.Metrics(t.Context())
		return err == nil && strings.Contains(m, line)
	})
}

func TestRegistryRebuiltAfterPodgateRestart(t *testing.T) {
	n := startNode(t, "--config", writeConfig(t, `
sysctls:
  podDefaults: {net.ipv4.tcp_keepalive_time: "300"}
`))
	ctx := t.Context()
	var ids []string
	for _, name := range []string{"one", "two"} {
		id, err := n.through.Runtime.RunPodSandbox(ctx, &runtimeapi.PodSandboxConfig{
			Metadata:     &runtimeapi.PodSandboxMetadata{Name: name, Namespace: "web", Uid: "uid-" + name},
			LogDirectory: filepath.Join(n.rig.Dir, "pods", name),
		}, "")
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	// Verifications run in the background; stopping podgate waits for them and records them.
	waitMetric(t, n.podgate, `podgate_sysctl_verifications_total{result="ok"} 2`)
	dir := filepath.Dir(n.podgate.Socket)
	if code, err := n.podgate.Stop(30 * time.Second); err != nil || code != 0 {
		t.Fatalf("stop podgate: exit %d, %v", code, err)
	}
	before := readCheckpoint(t, n.podgate)
	if len(before) != 2 || before[0].Origin != registry.OriginStarted {
		t.Fatalf("checkpoint before the restart: %+v", before)
	}

	// A sandbox started past podgate while it was down.
	past, err := n.direct.Runtime.RunPodSandbox(ctx, &runtimeapi.PodSandboxConfig{
		Metadata:     &runtimeapi.PodSandboxMetadata{Name: "past", Namespace: "web", Uid: "uid-past"},
		LogDirectory: filepath.Join(n.rig.Dir, "pods", "past"),
	}, "")
	if err != nil {
		t.Fatal(err)
	}
	p, err := harness.Start(ctx, podgateBin, harness.Options{Dir: dir, RuntimeEndpoint: n.rig.Endpoint})
	if err != nil {
		t.Fatal(err)
	}
	// The node's cleanup stops the podgate it started, which is stopped already; this one is
	// the test's to stop.
	t.Cleanup(func() {
		if code, err := p.Stop(30 * time.Second); err != nil || code != 0 {
			t.Errorf("stop the restarted podgate: exit %d, %v", code, err)
		}
	})
	n.podgate = p
	waitMetric(t, p, `podgate_registry_rebuilds_total{result="ok"} 1`)
	after := waitCheckpoint(t, p, func(recs []sandboxOnDisk) bool { return len(recs) == 3 })
	i := slices.IndexFunc(after, func(r sandboxOnDisk) bool { return r.ID == past })
	if i < 0 || after[i].Origin != registry.OriginAdopted || after[i].Sysctls.Verification != sysctl.ResultUnverified || after[i].NetNS == "" {
		t.Errorf("sandbox started past podgate: %+v; want adopted, sysctls unverified, its netns known", after)
	} else {
		after = slices.Delete(after, i, i+1)
	}
	if !sameJSON(t, after, before) {
		t.Errorf("records of the sandboxes podgate saw start changed across the restart:\nbefore %+v\nafter  %+v", before, after)
	}
	// The sandboxes still run, untouched.
	for _, id := range append(ids, past) {
		st, err := n.direct.Runtime.PodSandboxStatus(ctx, id, false)
		if err != nil || st.GetStatus().GetState() != runtimeapi.PodSandboxState_SANDBOX_READY {
			t.Errorf("sandbox %s after the restart: %v %v", id, st.GetStatus().GetState(), err)
		}
	}
}

func sameJSON(t *testing.T, a, b any) bool {
	t.Helper()
	ja, err := json.Marshal(a)
	if err != nil {
		t.Fatal(err)
	}
	jb, err := json.Marshal(b)
	if err != nil {
		t.Fatal(err)
	}
	return bytes.Equal(ja, jb)
}

func TestSecondInstanceChangesNoSysctl(t *testing.T) {
	n := startNode(t)
	// The second podgate runs in a network namespace of its own, standing in for the node,
	// with a node sysctl to set there. It must stop at the CRI socket, before the sysctl.
	ns := fmt.Sprintf("pg-second-%d", os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "delete", ns).Run() })
	read := func() string {
		out, err := exec.Command("ip", "netns", "exec", ns, "cat", "/proc/sys/net/ipv4/tcp_keepalive_time").CombinedOutput()
		if err != nil {
			t.Fatalf("read the sysctl in %s: %v %s", ns, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	before := read()
	want := "777"
	if before == want {
		want = "778"
	}
	cfg := writeConfig(t, "sysctls:\n  node: {net.ipv4.tcp_keepalive_time: \""+want+"\"}\n")
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "ip", "netns", "exec", ns, podgateBin, "--config", cfg,
		"--cri-socket", n.podgate.Socket, "--runtime-endpoint", n.rig.Endpoint,
		"--metrics-address", "", "--state-dir", testfs.ShortDir(t)).CombinedOutput()
	if code := exitCode(err); code != 1 || !strings.Contains(string(out), "is in use") {
		t.Fatalf("second podgate exited %d (%v), want 1 and \"is in use\"; output:\n%s", code, err, out)
	}
	if got := read(); got != before {
		t.Errorf("the refused second podgate set net.ipv4.tcp_keepalive_time to %s (was %s)", got, before)
	}
}
