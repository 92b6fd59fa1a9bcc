package cgroup

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	"github.com/google/go-cmp/cmp"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// realV1 skips unless the test can make cgroups in this machine's cgroup v1 hierarchies: root,
// and a hybrid or legacy node with cpu, cpuset and memory mounted under /sys/fs/cgroup.
func realV1(tb testing.TB) {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Skip("needs root: it makes cgroups under /sys/fs/cgroup/{cpu,cpuset,memory}")
	}
	if mode := Detect().Mode; mode != ModeHybrid && mode != ModeLegacy {
		tb.Skipf("needs cgroup v1 (a hybrid or legacy node); this node is %s", mode)
	}
	for _, c := range []string{"cpu", "cpuset", "memory"} {
		if _, err := os.Stat(filepath.Join(DefaultRoot, c, "cgroup.procs")); err != nil {
			tb.Skipf("needs the cgroup v1 %s hierarchy at %s: %v", c, filepath.Join(DefaultRoot, c), err)
		}
	}
}

// randomName is a name no other test run uses.
func randomName(tb testing.TB) string {
	b := make([]byte, 6)
	if _, err := rand.Read(b); err != nil {
		tb.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// v1Limits are what makeV1Cgroup writes in each cgroup of the path, in order, by controller.
type v1Limits map[string][][2]string

// makeV1Cgroup makes the cgroup at path (below the hierarchies' root) in the cpu, cpuset and
// memory hierarchies, level by level, writing the cpuset of each level (a cpuset cgroup
// starts empty: its parent's mems, CPU 0) and limits in the last. Everything is removed when
// the test ends, deepest first.
func makeV1Cgroup(tb testing.TB, path string, limits v1Limits) {
	tb.Helper()
	mems, err := os.ReadFile(filepath.Join(DefaultRoot, "cpuset", "cpuset.mems"))
	if err != nil {
		tb.Fatal(err)
	}
	levels := strings.Split(strings.TrimPrefix(path, "/"), "/")
	for _, c := range []string{"cpu", "cpuset", "memory"} {
		dir := filepath.Join(DefaultRoot, c)
		for i, level := range levels {
			dir = filepath.Join(dir, level)
			if err := os.Mkdir(dir, 0o755); err != nil {
				tb.Fatal(err)
			}
			made := dir
			tb.Cleanup(func() {
				if err := os.Remove(made); err != nil {
					tb.Errorf("remove test cgroup: %v", err)
				}
			})
			writes := limits[c]
			if c == "cpuset" {
				writes = append([][2]string{{"cpuset.mems", strings.TrimSpace(string(mems))}, {"cpuset.cpus", "0"}}, writes...)
				if i < len(levels)-1 {
					writes = writes[:2]
				}
			} else if i < len(levels)-1 {
				writes = nil
			}
			for _, w := range writes {
				if err := os.WriteFile(filepath.Join(dir, w[0]), []byte(w[1]), 0); err != nil {
					tb.Fatalf("write %s: %v", filepath.Join(dir, w[0]), err)
				}
			}
		}
	}
}

// containerLimits are the limits of the test's container: 0.5 CPU at 512 shares on CPU 0,
// 64 MiB of memory and no swap (memory+swap = memory, as containerd asks when the node has swap
// accounting).
func containerLimits() v1Limits {
	l := v1Limits{
		"cpu":    {{"cpu.cfs_period_us", "100000"}, {"cpu.cfs_quota_us", "50000"}, {"cpu.shares", "512"}},
		"memory": {{"memory.limit_in_bytes", "67108864"}},
	}
	if _, err := os.Stat(filepath.Join(DefaultRoot, "memory", "memory.memsw.limit_in_bytes")); err == nil {
		l["memory"] = append(l["memory"], [2]string{"memory.memsw.limit_in_bytes", "67108864"})
	}
	return l
}

// TestReadRealV1 makes a container's cgroup in this machine's cgroup v1 hierarchies, in either
// driver's layout, reads it and compares it with CRI requests that match it and that do not.
func TestReadRealV1(t *testing.T) {
	realV1(t)
	mems, err := os.ReadFile(filepath.Join(DefaultRoot, "cpuset", "cpuset.mems"))
	if err != nil {
		t.Fatal(err)
	}
	matching := &runtimeapi.LinuxContainerResources{
		CpuShares: 512, CpuQuota: 50000, CpuPeriod: 100000, CpusetCpus: "0", CpusetMems: strings.TrimSpace(string(mems)),
		MemoryLimitInBytes: 64 * mib,
	}
	other := &runtimeapi.LinuxContainerResources{
		CpuShares: 1024, CpuQuota: 25000, CpuPeriod: 100000, CpusetCpus: "0-1", MemoryLimitInBytes: 128 * mib,
	}
	wantFields := []string{"cpu.shares", "cpu.cfs_quota_us", "cpuset.cpus", "memory.limit_in_bytes"}
	if swapControllerAvailable() {
		// containerd asks memory+swap = memory: 128 MiB, the cgroup holds 64 MiB.
		wantFields = append(wantFields, "memory.memsw.limit_in_bytes")
	}
	name := randomName(t)
	for _, tc := range []struct {
		name, cgroupsPath, dir string
	}{
		{name: "cgroupfs", cgroupsPath: "/podgate-test-" + name, dir: "/podgate-test-" + name},
		{
			name:        "systemd",
			cgroupsPath: "podgatetest" + name + "-pod1.slice:cri-containerd:" + name,
			dir:         "/podgatetest" + name + ".slice/podgatetest" + name + "-pod1.slice/cri-containerd-" + name + ".scope",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			makeV1Cgroup(t, tc.dir, containerLimits())
			held, err := Read(t.Context(), tc.cgroupsPath)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("held: %+v", held.Files)
			if held.Version != 1 || held.Path != tc.dir || held.Driver != Driver(tc.cgroupsPath) {
				t.Errorf("Read: version %d, path %q, driver %q; want 1, %q, %q", held.Version, held.Path, held.Driver, tc.dir, Driver(tc.cgroupsPath))
			}
			for _, c := range []string{"cpu", "cpuset", "memory"} {
				if want := filepath.Join(DefaultRoot, c, tc.dir); held.Dirs[c] != want {
					t.Errorf("Dirs[%s] = %q, want %q", c, held.Dirs[c], want)
				}
			}
			if !equal(held.CPUShares, 512) || !equal(held.CPUQuota, 50000) || !equal(held.CPUPeriod, 100000) ||
				held.CPUs != "0" || held.EffectiveCPUs != "0" || !equal(held.MemoryLimit, 64*mib) {
				t.Errorf("Read: %+v", held.Files)
			}
			// SpecResources looks at this node as containerd does (swap accounting, hugetlb).
			if m := Compare(SpecResources(matching), held); len(m) != 0 {
				t.Errorf("Compare(matching) = %v, want no mismatch", m)
			}
			var fields []string
			for _, m := range Compare(SpecResources(other), held) {
				fields = append(fields, m.Field)
				t.Log(m)
			}
			if diff := cmp.Diff(wantFields, fields); diff != "" {
				t.Errorf("Compare(other) fields (-want +got):\n%s", diff)
			}
		})
	}
	t.Run("not found", func(t *testing.T) {
		if _, err := Read(t.Context(), "/podgate-test-"+name+"-nope"); !errdefs.IsNotFound(err) {
			t.Fatalf("err = %v, want not found", err)
		}
	})
}
