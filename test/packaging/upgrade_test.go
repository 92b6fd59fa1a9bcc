package packaging

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podgate/podgate/test/harness"
	"github.com/podgate/podgate/test/rig"
	"github.com/podgate/podgate/test/testfs"
)

// TestPackageUpgradeKeepsPodsRunning upgrades the installed package under running pods of a
// real containerd, and restarts podgate as the package's postinst has systemd do it
// (try-restart podgate.service): no pod or container restarts, and a new pod starts after it.
//
// No systemd runs on the test machine, so the test stands in for it, and says so: it runs the
// installed unit's ExecStart (/usr/bin/podgate --config /etc/podgate/config.yaml), with the
// test's own socket, state and metrics flags so that it meets no other test, waits for READY=1
// as a Type=notify unit does; after dpkg -i of the newer package (whose postinst finds no
// systemd and restarts nothing) it does what try-restart does to a running unit: SIGTERM, wait
// for the exit, run ExecStart again, now the new /usr/bin/podgate. The kubelet is not involved:
// the test is the kubelet, through CRI.
func TestPackageUpgradeKeepsPodsRunning(t *testing.T) {
	requireInstallable(t)
	r := rig.Start(t)
	newDir := makeRelease(t, newVersion)
	installDeb(t, oldVersion) // purged at the end, after podgate stops (cleanups run last first)

	execStart := unitExecStart(t)
	dir := testfs.ShortDir(t)
	start := func() *harness.Podgate {
		t.Helper()
		p, err := harness.Start(t.Context(), execStart[0], harness.Options{Dir: dir, RuntimeEndpoint: r.Endpoint, Args: execStart[1:]})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	old := start()
	oldStopped := false
	t.Cleanup(func() {
		if !oldStopped {
			old.Kill()
		}
	})
	c := rig.Connect(t, old.Endpoint)
	for i := range 2 {
		runPod(t, c, r, fmt.Sprintf("before-%d", i))
	}
	before := snapshot(t, c)
	if len(before) != 4 {
		t.Fatalf("before the upgrade: %d sandboxes and containers, want 2 pods with a container each: %v", len(before), before)
	}

	dpkg(t, "--install", debFile(newDir, newVersion, runtime.GOARCH))
	checkVersion(t, newVersion)
	// What systemctl try-restart podgate does: the unit runs, so stop it and start it again.
	code, err := old.Stop(30 * time.Second)
	oldStopped = true
	if err != nil || code != 0 {
		t.Fatalf("stopping the old podgate: exit %d, %v\n%s", code, err, old.Log)
	}
	restarted := time.Now()
	p := start()
	t.Cleanup(func() {
		if code, err := p.Stop(30 * time.Second); err != nil || code != 0 {
			t.Errorf("podgate stop: exit %d, %v", code, err)
		}
		if t.Failed() {
			t.Logf("podgate log:\n%s", p.Log)
		}
	})
	t.Logf("podgate %s serves again %s after SIGTERM to %s", newVersion, time.Since(restarted).Round(time.Millisecond), oldVersion)
	m, err := p.Metrics(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(m, `podgate_build_info{version="`+newVersion+`"} 1`) {
		t.Errorf("the restarted podgate is not %s: its build_info:\n%s", newVersion, grepLines(m, "podgate_build_info"))
	}
	// The registry is rebuilt in the background once podgate serves: wait for it, then check
	// that the new podgate knew both pods from the old one's checkpoint (none adopted).
	err = wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		m, err := p.Metrics(ctx)
		return err == nil && strings.Contains(m, `podgate_registry_rebuilds_total{result="ok"} 1`), nil
	})
	if err != nil {
		t.Fatalf("the new podgate did not rebuild its registry from containerd: %v", err)
	}
	if want := `"Pod registry rebuilt from the runtime" sandboxes=2 adopted=0 dropped=0`; !strings.Contains(p.Log.String(), want) {
		t.Errorf("the new podgate's log lacks %s:\n%s", want, grepLines(p.Log.String(), "Pod registry"))
	}

	c = rig.Connect(t, p.Endpoint)
	after := snapshot(t, c)
	if !slices.Equal(after, before) {
		t.Errorf("the upgrade restarted something (sandbox or container ID, state, attempt, start time):\nbefore %v\nafter  %v", before, after)
	}
	if direct := snapshot(t, rig.Connect(t, r.Endpoint)); !slices.Equal(direct, before) {
		t.Errorf("containerd's own view changed:\nbefore %v\nnow    %v", before, direct)
	}
	runPod(t, c, r, "after")
	if got := len(snapshot(t, c)); got != 6 {
		t.Errorf("after a new pod: %d sandboxes and containers, want 6", got)
	}
}

// unitExecStart is the installed unit's ExecStart, split into words.
func unitExecStart(t *testing.T) []string {
	t.Helper()
	unit, err := os.ReadFile(unitPath)
	if err != nil {
		t.Fatal(err)
	}
	for l := range strings.SplitSeq(string(unit), "\n") {
		if cmd, ok := strings.CutPrefix(l, "ExecStart="); ok {
			return strings.Fields(cmd)
		}
	}
	t.Fatalf("%s has no ExecStart:\n%s", unitPath, unit)
	return nil
}

// runPod runs a sandbox and a long-running busybox container in it, as the kubelet would.
func runPod(t *testing.T, c *rig.Client, r *rig.Rig, name string) {
	t.Helper()
	ctx := t.Context()
	cfg := &runtimeapi.PodSandboxConfig{
		Metadata:     &runtimeapi.PodSandboxMetadata{Name: name, Uid: "uid-" + name, Namespace: "packaging-test"},
		Hostname:     name,
		LogDirectory: filepath.Join(r.Dir, "pods", name),
		Linux:        &runtimeapi.LinuxPodSandboxConfig{},
	}
	id, err := c.Runtime.RunPodSandbox(ctx, cfg, "")
	if err != nil {
		t.Fatalf("RunPodSandbox %s: %v", name, err)
	}
	ctr, err := c.Runtime.CreateContainer(ctx, id, &runtimeapi.ContainerConfig{
		Metadata: &runtimeapi.ContainerMetadata{Name: "sleep"},
		Image:    &runtimeapi.ImageSpec{Image: rig.BusyboxImage},
		Command:  []string{"/bin/sleep", "3600"},
		LogPath:  "sleep.log",
		Linux:    &runtimeapi.LinuxContainerConfig{},
	}, cfg)
	if err != nil {
		t.Fatalf("CreateContainer in %s: %v", name, err)
	}
	if err := c.Runtime.StartContainer(ctx, ctr); err != nil {
		t.Fatalf("StartContainer in %s: %v", name, err)
	}
}

// snapshot is every sandbox and container as the kubelet sees them through CRI: what changes
// when one restarts (a new ID, a higher attempt, a later start, a state other than ready or
// running), sorted.
func snapshot(t *testing.T, c *rig.Client) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	sandboxes, err := c.Runtime.ListPodSandbox(ctx, nil)
	if err != nil {
		t.Fatalf("ListPodSandbox: %v", err)
	}
	var s []string
	for _, sb := range sandboxes {
		s = append(s, fmt.Sprintf("sandbox %s %s attempt %d %s created %d", sb.GetMetadata().GetName(), sb.GetId(),
			sb.GetMetadata().GetAttempt(), sb.GetState(), sb.GetCreatedAt()))
	}
	containers, err := c.Runtime.ListContainers(ctx, nil)
	if err != nil {
		t.Fatalf("ListContainers: %v", err)
	}
	for _, ctr := range containers {
		st, err := c.Runtime.ContainerStatus(ctx, ctr.GetId(), false)
		if err != nil {
			t.Fatalf("ContainerStatus %s: %v", ctr.GetId(), err)
		}
		s = append(s, fmt.Sprintf("container %s in %s attempt %d %s started %d", ctr.GetId(), ctr.GetPodSandboxId(),
			ctr.GetMetadata().GetAttempt(), st.GetStatus().GetState(), st.GetStatus().GetStartedAt()))
	}
	slices.Sort(s)
	for _, e := range s {
		if !strings.Contains(e, "SANDBOX_READY") && !strings.Contains(e, "CONTAINER_RUNNING") {
			t.Errorf("not ready or running: %s", e)
		}
	}
	return s
}

func grepLines(text, substr string) string {
	var out []string
	for l := range strings.SplitSeq(text, "\n") {
		if strings.Contains(l, substr) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
