package rig_test

import (
	"bufio"
	"context"
	"crypto/sha256"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/klog/v2/ktesting"

	"github.com/podgate/podgate/test/rig"
)

// TestRig runs a pod with CNI and a busybox container in a rig, straight through containerd's CRI,
// then checks that the rig's cleanup left no containerd, mount, bridge or directory behind.
func TestRig(t *testing.T) {
	var r *rig.Rig
	t.Run("pod", func(t *testing.T) {
		r = rig.Start(t)
		runHelloPod(t, r)
	})
	if r == nil && !t.Failed() {
		t.Skip("the subtest skipped: no rig here")
	}
	if t.Failed() {
		return
	}
	// The subtest's cleanup has run: everything of r.Dir must be gone.
	if pids := processesMentioning(t, r.Dir); len(pids) > 0 {
		t.Errorf("processes of %s still running after cleanup: %v", r.Dir, pids)
	}
	if m := mountsUnder(t, r.Dir); len(m) > 0 {
		t.Errorf("mounts under %s left after cleanup: %v", r.Dir, m)
	}
	if _, err := os.Stat(r.Dir); !os.IsNotExist(err) {
		t.Errorf("%s still exists after cleanup (stat: %v)", r.Dir, err)
	}
	if owned := linksAliased(t, r.Dir); len(owned) > 0 { // not by name: see TestDownAfterCrash
		t.Errorf("links owned by %s still exist after cleanup: %v", r.Dir, owned)
	}
}

// TestStartSkipsWhenNotInstalled checks that Start skips, rather than fails, a test on a machine
// without the rig.
func TestStartSkipsWhenNotInstalled(t *testing.T) {
	t.Setenv("PODGATE_RIG_DIR", t.TempDir())
	var skipped bool
	t.Run("start", func(t *testing.T) {
		defer func() { skipped = t.Skipped() }()
		rig.Start(t)
	})
	if !skipped {
		t.Error("Start did not skip the test")
	}
}

// TestUpRejectsLongDir checks that Up refuses a directory whose socket path would not fit a
// unix socket address, and leaves nothing behind.
func TestUpRejectsLongDir(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	if err := rig.CheckInstalled(); err != nil {
		t.Skip(err.Error())
	}
	dir := "/tmp/pgr-" + strings.Repeat("x", 100)
	_, err := rig.Up(t.Context(), dir)
	if err == nil || !strings.Contains(err.Error(), "too long") {
		t.Fatalf("Up(%s) = %v, want a too-long error", dir, err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("%s exists after failed Up (stat: %v)", dir, err)
	}
}

// TestUpRefusesRunningRig checks that Up in the directory of a running rig fails and leaves that
// rig running.
func TestUpRefusesRunningRig(t *testing.T) {
	r := rig.Start(t)
	_, ctx := ktesting.NewTestContext(t)
	if _, err := rig.Up(ctx, r.Dir); err == nil || !strings.Contains(err.Error(), "already runs") {
		t.Fatalf("Up(%s) on a running rig = %v, want an already-runs error", r.Dir, err)
	}
	c := rig.Connect(t, r.Endpoint)
	if _, err := c.Runtime.Version(ctx, "v1"); err != nil {
		t.Errorf("first rig no longer answers: %v", err)
	}
}

func runHelloPod(t *testing.T, r *rig.Rig) {
	ctx := t.Context()
	c := rig.Connect(t, r.Endpoint)

	for _, img := range []string{rig.PauseImage, rig.BusyboxImage} {
		st, err := c.Images.ImageStatus(ctx, &runtimeapi.ImageSpec{Image: img}, false)
		if err != nil {
			t.Fatalf("ImageStatus %s: %v", img, err)
		}
		if st.GetImage() == nil {
			t.Fatalf("image %s not known to CRI", img)
		}
	}

	podID, sbCfg := runPod(t, c, r, "hello")

	ctrID, err := c.Runtime.CreateContainer(ctx, podID, &runtimeapi.ContainerConfig{
		Metadata: &runtimeapi.ContainerMetadata{Name: "hello"},
		Image:    &runtimeapi.ImageSpec{Image: rig.BusyboxImage},
		Command:  []string{"/bin/sh", "-c", "echo hello-rig"},
		LogPath:  "hello/0.log",
		Linux:    &runtimeapi.LinuxContainerConfig{},
	}, sbCfg)
	if err != nil {
		t.Fatalf("CreateContainer: %v", err)
	}
	if err := c.Runtime.StartContainer(ctx, ctrID); err != nil {
		t.Fatalf("StartContainer: %v", err)
	}

	cs := waitExited(t, c, ctrID, 30*time.Second)
	if cs.GetExitCode() != 0 {
		t.Errorf("container exit code %d (reason %q, message %q)", cs.GetExitCode(), cs.GetReason(), cs.GetMessage())
	}
	logPath := filepath.Join(sbCfg.LogDirectory, "hello", "0.log")
	if cs.GetLogPath() != logPath {
		t.Errorf("container log path %q, want %q", cs.GetLogPath(), logPath)
	}
	b, err := os.ReadFile(logPath)
	if err != nil {
		t.Fatalf("container log: %v", err)
	}
	// CRI log lines read "<time> stdout F hello-rig".
	if !strings.Contains(string(b), " stdout F hello-rig\n") {
		t.Errorf("container log %s lacks hello-rig:\n%s", logPath, b)
	}

	if err := c.Runtime.StopContainer(ctx, ctrID, 0); err != nil {
		t.Errorf("StopContainer: %v", err)
	}
	if err := c.Runtime.RemoveContainer(ctx, ctrID); err != nil {
		t.Errorf("RemoveContainer: %v", err)
	}
	if err := c.Runtime.StopPodSandbox(ctx, podID); err != nil {
		t.Errorf("StopPodSandbox: %v", err)
	}
	if err := c.Runtime.RemovePodSandbox(ctx, podID); err != nil {
		t.Errorf("RemovePodSandbox: %v", err)
	}
	pods, err := c.Runtime.ListPodSandbox(ctx, nil)
	if err != nil {
		t.Fatalf("ListPodSandbox: %v", err)
	}
	if len(pods) != 0 {
		t.Errorf("%d pods left after RemovePodSandbox", len(pods))
	}
}

// runPod runs a pod sandbox named name in r and checks that it got an address in r's subnet.
func runPod(t *testing.T, c *rig.Client, r *rig.Rig, name string) (string, *runtimeapi.PodSandboxConfig) {
	t.Helper()
	cfg := &runtimeapi.PodSandboxConfig{
		Metadata: &runtimeapi.PodSandboxMetadata{
			Name:      name,
			Uid:       "uid-" + name,
			Namespace: "rig-test",
		},
		Hostname:     name,
		LogDirectory: filepath.Join(r.Dir, "pods", name),
		Linux:        &runtimeapi.LinuxPodSandboxConfig{},
	}
	id, err := c.Runtime.RunPodSandbox(t.Context(), cfg, "")
	if err != nil {
		t.Fatalf("RunPodSandbox %s: %v", name, err)
	}
	ip := podIP(t, c, id)
	// 10.77.0.0/16 holds every rig's subnet; tests send traffic only there.
	if !r.Subnet.Contains(ip) || !netip.MustParsePrefix("10.77.0.0/16").Contains(ip) {
		t.Fatalf("pod %s has IP %s, not in the rig's subnet %s", name, ip, r.Subnet)
	}
	t.Logf("pod %s (%s) has IP %s", name, id, ip)
	return id, cfg
}

func podIP(t *testing.T, c *rig.Client, podID string) netip.Addr {
	t.Helper()
	st, err := c.Runtime.PodSandboxStatus(t.Context(), podID, false)
	if err != nil {
		t.Fatalf("PodSandboxStatus: %v", err)
	}
	ip, err := netip.ParseAddr(st.GetStatus().GetNetwork().GetIp())
	if err != nil {
		t.Fatalf("pod %s IP: %v", podID, err)
	}
	return ip
}

// startContainer creates and starts a busybox container running command in the pod.
func startContainer(t *testing.T, c *rig.Client, podID string, pod *runtimeapi.PodSandboxConfig, name string, command ...string) string {
	t.Helper()
	id, err := c.Runtime.CreateContainer(t.Context(), podID, &runtimeapi.ContainerConfig{
		Metadata: &runtimeapi.ContainerMetadata{Name: name},
		Image:    &runtimeapi.ImageSpec{Image: rig.BusyboxImage},
		Command:  command,
		LogPath:  name + ".log",
		Linux:    &runtimeapi.LinuxContainerConfig{},
	}, pod)
	if err != nil {
		t.Fatalf("CreateContainer %s: %v", name, err)
	}
	if err := c.Runtime.StartContainer(t.Context(), id); err != nil {
		t.Fatalf("StartContainer %s: %v", name, err)
	}
	return id
}

// TestRigsSideBySide runs two rigs at once, as parallel test packages do: each gets its own
// bridge and subnet, and the host reaches a TCP server in each rig's pod.
func TestRigsSideBySide(t *testing.T) {
	var rigs [2]*rig.Rig
	for i := range rigs {
		rigs[i] = rig.Start(t)
	}
	if rigs[0].Bridge == rigs[1].Bridge || rigs[0].Subnet.Overlaps(rigs[1].Subnet) {
		t.Fatalf("rigs share a network: %s %s and %s %s", rigs[0].Bridge, rigs[0].Subnet, rigs[1].Bridge, rigs[1].Subnet)
	}
	for i, r := range rigs {
		c := rig.Connect(t, r.Endpoint)
		name := fmt.Sprintf("pong%d", i)
		podID, pod := runPod(t, c, r, name)
		startContainer(t, c, podID, pod, "server", "nc", "-ll", "-p", "8080", "-e", "echo", name)
		addr := netip.AddrPortFrom(podIP(t, c, podID), 8080)
		if got := dialUntil(t, addr, 30*time.Second); got != name {
			t.Errorf("%s answered %q, want %q", addr, got, name)
		}
	}
}

// dialUntil connects to addr, a pod of the test, until the server answers or timeout passes,
// and returns the first line it sends.
func dialUntil(t *testing.T, addr netip.AddrPort, timeout time.Duration) string {
	t.Helper()
	var line string
	var last error
	// Every 100ms: the server may still be starting.
	if err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		line, last = readLine(addr)
		return last == nil, nil
	}); err != nil {
		t.Fatalf("pod server %s: %v (%v)", addr, last, err)
	}
	return line
}

func readLine(addr netip.AddrPort) (string, error) {
	conn, err := net.DialTimeout("tcp", addr.String(), 2*time.Second)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(5 * time.Second)); err != nil {
		return "", err
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	return strings.TrimSpace(line), err
}

// TestDownAfterCrash kills containerd while a pod runs, so that nothing is removed through CRI,
// and checks that Down still removes the containers, shims, mounts, bridge and directory.
func TestDownAfterCrash(t *testing.T) {
	r := rig.Start(t)
	c := rig.Connect(t, r.Endpoint)
	podID, pod := runPod(t, c, r, "crash")
	// The marker argument names the container's process as one of r.Dir's.
	startContainer(t, c, podID, pod, "loop", "/bin/sh", "-c", "while :; do sleep 1; done", r.Dir+"/marker")
	if pids := processesMentioning(t, r.Dir); len(pids) < 3 { // containerd, shim, container
		t.Fatalf("expected containerd, a shim and the container among %v", pids)
	}
	shimSocket := fmt.Sprintf("/run/containerd/s/%x", sha256.Sum256([]byte(r.Dir+"/containerd.sock/k8s.io/"+podID)))
	if _, err := os.Stat(shimSocket); err != nil {
		t.Fatalf("shim socket: %v", err)
	}

	b, err := os.ReadFile(filepath.Join(r.Dir, "containerd.pid"))
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill containerd: %v", err)
	}

	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := r.Down(ctx); err != nil {
		t.Fatalf("Down: %v", err)
	}
	if pids := processesMentioning(t, r.Dir); len(pids) > 0 {
		t.Errorf("processes of %s still running after Down: %v", r.Dir, pids)
	}
	if m := mountsUnder(t, r.Dir); len(m) > 0 {
		t.Errorf("mounts under %s left after Down: %v", r.Dir, m)
	}
	for _, p := range []string{r.Dir, shimSocket} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s still exists after Down (stat: %v)", p, err)
		}
	}
	// The name pgrigN may already belong to another package's rig started meanwhile; what must be
	// gone is the bridge this rig owned, which carries r.Dir as its alias.
	if owned := linksAliased(t, r.Dir); len(owned) > 0 {
		t.Errorf("links owned by %s still exist after Down: %v", r.Dir, owned)
	}
}

// linksAliased lists the network links whose alias is alias.
func linksAliased(t *testing.T, alias string) []string {
	t.Helper()
	paths, err := filepath.Glob("/sys/class/net/*/ifalias")
	if err != nil {
		t.Fatal(err)
	}
	var links []string
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			continue // the link went away while we looked
		}
		if strings.TrimSpace(string(b)) == alias {
			links = append(links, filepath.Base(filepath.Dir(p)))
		}
	}
	return links
}

// waitExited polls the container's status until it has exited, for at most timeout.
func waitExited(t *testing.T, c *rig.Client, id string, timeout time.Duration) *runtimeapi.ContainerStatus {
	t.Helper()
	var st *runtimeapi.ContainerStatus
	err := wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		resp, err := c.Runtime.ContainerStatus(ctx, id, false)
		if err != nil {
			return false, fmt.Errorf("ContainerStatus: %w", err)
		}
		st = resp.GetStatus()
		return st.GetState() == runtimeapi.ContainerState_CONTAINER_EXITED, nil
	})
	if err != nil {
		t.Fatalf("container %s not exited after %v: state %v: %v", id, timeout, st.GetState(), err)
	}
	return st
}

// processesMentioning returns the pids of processes with an argument that is dir or lies in it.
func processesMentioning(t *testing.T, dir string) []string {
	t.Helper()
	procs, err := filepath.Glob("/proc/[0-9]*/cmdline")
	if err != nil {
		t.Fatal(err)
	}
	var pids []string
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil {
			continue // exited meanwhile
		}
		for _, arg := range strings.Split(string(b), "\x00") {
			if arg == dir || strings.HasPrefix(arg, dir+"/") {
				pids = append(pids, strings.Split(p, "/")[2]+": "+strings.ReplaceAll(string(b), "\x00", " "))
				break
			}
		}
	}
	return pids
}

// mountsUnder returns the mount points at or below dir.
func mountsUnder(t *testing.T, dir string) []string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var mounts []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && (f[4] == dir || strings.HasPrefix(f[4], dir+"/")) {
			mounts = append(mounts, f[4])
		}
	}
	return mounts
}

// TestNeighbourVersions: every neighbour has a pinned version in neighbours.env, a release tag.
func TestNeighbourVersions(t *testing.T) {
	for _, n := range []string{rig.Multus, rig.DRAExampleDriver, rig.DRANet} {
		if v := rig.NeighbourVersion(n); !strings.HasPrefix(v, "v") || strings.Count(v, ".") != 2 {
			t.Errorf("%s: version %q is not a release tag vX.Y.Z", n, v)
		}
		if rig.NeighbourModule(n) == "" {
			t.Errorf("%s: no module", n)
		}
	}
}
