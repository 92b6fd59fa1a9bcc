package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	pb "github.com/podgate/podgate/podresources/api/v1alpha1"
	"github.com/podgate/podgate/test/rig"
)

// v1Root is where this machine's cgroup v1 hierarchies are mounted.
const v1Root = "/sys/fs/cgroup"

// TestContainerResourcesVerified creates a container with a CPU quota, CPU shares and a memory
// limit through podgate on the real rig, and checks that podgate's PodResources extension
// reports what the kernel's cgroup files hold, after StartContainer and after an
// UpdateContainerResources to new values; a change made behind podgate's back is reported as a
// mismatch. With memory QoS asked for on a node without the cgroup v2 memory controller, podgate
// reports it as not applicable and changes nothing.
func TestContainerResourcesVerified(t *testing.T) {
	if _, err := os.Stat(filepath.Join(v1Root, "cpu", "cpu.cfs_quota_us")); err != nil {
		t.Skipf("needs the cgroup v1 cpu hierarchy at %s/cpu (this test reads its files): %v", v1Root, err)
	}
	n := startNode(t, "--config", writeConfig(t, "resources:\n  memoryQoS: true\n  recheckPeriod: 200ms\n"))
	ext := extensionClient(t, n.podgate.PodResourcesSocket)
	sb := &runtimeapi.PodSandboxConfig{
		Metadata: &runtimeapi.PodSandboxMetadata{Name: "limited", Namespace: "e2e", Uid: "uid-limited-1"},
		Linux:    &runtimeapi.LinuxPodSandboxConfig{},
	}
	podID, err := n.through.Runtime.RunPodSandbox(t.Context(), sb, "")
	if err != nil {
		t.Fatal(err)
	}
	asked := &runtimeapi.LinuxContainerResources{CpuPeriod: 100000, CpuQuota: 50000, CpuShares: 512, MemoryLimitInBytes: 64 << 20}
	ctrID, err := n.through.Runtime.CreateContainer(t.Context(), podID, &runtimeapi.ContainerConfig{
		Metadata: &runtimeapi.ContainerMetadata{Name: "sleeper"},
		Image:    &runtimeapi.ImageSpec{Image: rig.BusyboxImage},
		Command:  []string{"sleep", "3600"},
		Linux:    &runtimeapi.LinuxContainerConfig{Resources: asked},
	}, sb)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.through.Runtime.StartContainer(t.Context(), ctrID); err != nil {
		t.Fatal(err)
	}

	c := waitContainer(t, ext, "limited", ctrID, func(c *pb.Container) bool { return c.GetVerification() == "ok" })
	dir := c.GetCgroupsPath()
	checkHeldIsKernel(t, c, dir)
	if got := c.GetHeld().GetCpuQuota(); got != 50000 {
		t.Errorf("held CPU quota %d, want 50000", got)
	}

	// Memory QoS: asked for, not applicable on this hybrid node, nothing added.
	pod := getPod(t, ext, "limited")
	if cg := pod.GetCgroup(); cg.GetMemoryQos() || !strings.Contains(cg.GetMemoryQosReason(), "memory") || cg.GetMode() == "" || cg.GetDriver() != "cgroupfs" {
		t.Errorf("pod cgroup = %v; want mode set, driver cgroupfs, memory QoS off with a reason naming the memory controller", cg)
	}
	for _, key := range []string{"memory.min", "memory.high"} {
		if _, ok := c.GetAsked().GetUnified()[key]; ok {
			t.Errorf("asked resources hold %s although memory QoS is not applicable here", key)
		}
	}

	// An in-place resize, verified the same way.
	if err := n.through.Runtime.UpdateContainerResources(t.Context(), ctrID, &runtimeapi.ContainerResources{
		Linux: &runtimeapi.LinuxContainerResources{CpuPeriod: 100000, CpuQuota: 20000, CpuShares: 256, MemoryLimitInBytes: 128 << 20},
	}); err != nil {
		t.Fatal(err)
	}
	c = waitContainer(t, ext, "limited", ctrID, func(c *pb.Container) bool {
		return c.GetAsked().GetCpuQuota() == 20000 && c.GetHeld().GetCpuQuota() == 20000 && c.GetVerification() == "ok"
	})
	checkHeldIsKernel(t, c, dir)

	// Behind podgate's back: the recheck finds it.
	writeCgroupFile(t, filepath.Join(v1Root, "cpu", dir, "cpu.cfs_quota_us"), "30000")
	c = waitContainer(t, ext, "limited", ctrID, func(c *pb.Container) bool { return c.GetVerification() == "mismatch" })
	if len(c.GetMismatches()) == 0 || !strings.Contains(strings.Join(c.GetMismatches(), "; "), "quota") {
		t.Errorf("mismatches %q, want one naming the CPU quota", c.GetMismatches())
	}
	if got := c.GetHeld().GetCpuQuota(); got != 30000 {
		t.Errorf("held CPU quota %d after the change behind podgate's back, want 30000", got)
	}
	waitMetric(t, n.podgate, `podgate_resources_verifications_total{after="recheck",result="mismatch"}`)
}

// checkHeldIsKernel compares what podgate reports the cgroup holds with the kernel's files.
func checkHeldIsKernel(t *testing.T, c *pb.Container, dir string) {
	t.Helper()
	h := c.GetHeld()
	for _, f := range []struct {
		file string
		got  int64
	}{
		{"cpu/cpu.cfs_quota_us", h.GetCpuQuota()},
		{"cpu/cpu.cfs_period_us", int64(h.GetCpuPeriod())},
		{"cpu/cpu.shares", int64(h.GetCpuShares())},
		{"memory/memory.limit_in_bytes", h.GetMemoryMax()},
	} {
		sub, file, _ := strings.Cut(f.file, "/")
		want := readCgroupInt(t, filepath.Join(v1Root, sub, dir, file))
		if f.got != want {
			t.Errorf("podgate reports %s = %d, the kernel's file holds %d", f.file, f.got, want)
		}
	}
}

func readCgroupInt(t *testing.T, path string) int64 {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	v, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return v
}

func writeCgroupFile(t *testing.T, path, value string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(value), 0o644); err != nil {
		t.Fatal(err)
	}
}

func extensionClient(t *testing.T, socket string) pb.PodResourcesClient {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return pb.NewPodResourcesClient(conn)
}

func getPod(t *testing.T, ext pb.PodResourcesClient, name string) *pb.Pod {
	t.Helper()
	resp, err := ext.Get(t.Context(), &pb.GetRequest{PodName: name, PodNamespace: "e2e"})
	if err != nil {
		t.Fatal(err)
	}
	return resp.GetPod()
}

// waitContainer polls podgate's extension until the container's report satisfies cond.
func waitContainer(t *testing.T, ext pb.PodResourcesClient, pod, id string, cond func(*pb.Container) bool) *pb.Container {
	t.Helper()
	var last *pb.Container
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	waitFor(ctx, t, "container "+id+" report", func() bool {
		for _, c := range getPod(t, ext, pod).GetContainers() {
			if c.GetId() == id {
				last = c
				return cond(c)
			}
		}
		return false
	})
	if last == nil {
		t.Fatalf("container %s not reported", id)
	}
	return last
}
