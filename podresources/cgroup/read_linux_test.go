package cgroup

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	"github.com/google/go-cmp/cmp"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// The systemd driver's cgroups path of a BestEffort container, and where it is.
const (
	besteffortPath = "kubepods-besteffort-pod123.slice:cri-containerd:abc"
	besteffortDir  = "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod123.slice/cri-containerd-abc.scope"
)

// v2Tree lays out a directory like a cgroup v2 mount, as cgroups/v3 and Read need it: the
// root's cgroup.controllers and cgroup.subtree_control, and two containers' cgroups —
// besteffortDir with every controller, /kubepods/burstable/pod456/def without memory (as on
// the unified mount of a hybrid node).
func v2Tree(t testing.TB) string {
	t.Helper()
	root := t.TempDir()
	container := map[string]string{
		"cgroup.controllers": "cpuset cpu io memory hugetlb pids",
		"cpu.weight":         "59\n", "cpu.max": "50000 100000\n", "cpu.stat": "usage_usec 0\n",
		"cpuset.cpus": "0-1\n", "cpuset.cpus.effective": "0-1\n", "cpuset.mems": "0\n",
		"memory.min": "0\n", "memory.high": "max\n", "memory.max": "67108864\n", "memory.swap.max": "0\n",
		"memory.oom.group": "1\n",
		"hugetlb.2MB.max":  "0\n", "hugetlb.2MB.rsvd.max": "0\n", "hugetlb.2MB.current": "0\n", "hugetlb.1GB.max": "max\n",
		"io.weight": "default 100\n",
	}
	files := map[string]string{
		"cgroup.controllers":     "cpuset cpu io memory hugetlb pids rdma misc\n",
		"cgroup.subtree_control": "cpuset cpu io memory hugetlb pids\n",
		// The slices on the way, as systemd makes them.
		"kubepods.slice/cgroup.controllers":                                                            "cpuset cpu io memory hugetlb pids\n",
		"kubepods.slice/kubepods-besteffort.slice/cgroup.controllers":                                  "cpuset cpu io memory hugetlb pids\n",
		"kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod123.slice/cgroup.controllers": "cpuset cpu io memory hugetlb pids\n",
		"kubepods/burstable/pod456/def/cgroup.controllers":                                             "cpu pids\n",
		"kubepods/burstable/pod456/def/cpu.weight":                                                     "100\n",
		"kubepods/burstable/pod456/def/cpu.max":                                                        "max 100000\n",
	}
	for name, content := range container {
		files[filepath.Join(besteffortDir, name)] = content
	}
	writeTree(t, root, files)
	return root
}

func TestReadV2Tree(t *testing.T) {
	root := v2Tree(t)
	pageSize := int64(os.Getpagesize())
	wantSystemd := &Held{
		Mode: ModeUnified, Version: 2, Driver: DriverSystemd, Path: besteffortDir,
		Dirs: map[string]string{"unified": filepath.Join(root, besteffortDir)}, PageSize: pageSize,
		CPUWeight: ptr(uint64(59)), CPUQuota: ptr(int64(50000)), CPUPeriod: ptr(uint64(100000)),
		CPUs: "0-1", EffectiveCPUs: "0-1", Mems: "0",
		MemoryLimit: ptr(64 * mib), MemoryMin: ptr(int64(0)), MemoryHigh: ptr(int64(-1)), Swap: ptr(int64(0)),
		Hugepages: map[string]int64{"2MB": 0, "1GB": -1},
		Files: map[string]string{
			"cpu.weight": "59", "cpu.max": "50000 100000",
			"cpuset.cpus": "0-1", "cpuset.cpus.effective": "0-1", "cpuset.mems": "0",
			"memory.min": "0", "memory.high": "max", "memory.max": "67108864", "memory.swap.max": "0", "memory.oom.group": "1",
			"hugetlb.2MB.max": "0", "hugetlb.1GB.max": "max",
		},
	}
	wantNoMemory := &Held{
		Mode: ModeUnified, Version: 2, Driver: DriverCgroupfs, Path: "/kubepods/burstable/pod456/def",
		Dirs: map[string]string{"unified": filepath.Join(root, "kubepods/burstable/pod456/def")}, PageSize: pageSize,
		CPUWeight: ptr(uint64(100)), CPUQuota: ptr(int64(-1)), CPUPeriod: ptr(uint64(100000)),
		Files: map[string]string{"cpu.weight": "100", "cpu.max": "max 100000"},
		Absent: []string{
			"cpuset.cpus", "cpuset.cpus.effective", "cpuset.mems",
			"memory.high", "memory.max", "memory.min", "memory.oom.group", "memory.swap.max",
		},
	}
	wantIOWeight := func() *Held {
		h := *wantSystemd
		h.Files = map[string]string{"io.weight": "default 100"}
		for k, v := range wantSystemd.Files {
			h.Files[k] = v
		}
		h.Absent = []string{"io.latency"}
		return &h
	}()
	for _, tc := range []struct {
		name  string
		path  string
		opts  []ReadOption
		want  *Held
		asked *runtimeapi.LinuxContainerResources
		// mismatches are the Fields of Compare(SpecResources(asked), held).
		mismatches []string
	}{{
		name: "systemd driver, every controller", path: besteffortPath, want: wantSystemd,
		asked: &runtimeapi.LinuxContainerResources{
			CpuShares: 512, CpuQuota: 50000, CpuPeriod: 100000, CpusetCpus: "0,1", CpusetMems: "0",
			MemoryLimitInBytes: 64 * mib,
			HugepageLimits:     []*runtimeapi.HugepageLimit{{PageSize: "2MB", Limit: 0}},
			Unified:            map[string]string{"memory.oom.group": "1"},
		},
	}, {
		name: "systemd driver, asked otherwise", path: besteffortPath, want: wantSystemd,
		asked: &runtimeapi.LinuxContainerResources{
			CpuShares: 1024, CpuQuota: 50000, CpuPeriod: 100000, MemoryLimitInBytes: 128 * mib,
			HugepageLimits: []*runtimeapi.HugepageLimit{{PageSize: "1GB", Limit: 0}},
			Unified:        map[string]string{"memory.high": "100663296"},
		},
		mismatches: []string{"cpu.weight", "memory.max", "hugetlb.1GB.max", "memory.high"},
	}, {
		name: "cgroupfs driver, no memory controller", path: "/kubepods/burstable/pod456/def", want: wantNoMemory,
		asked: &runtimeapi.LinuxContainerResources{
			CpuShares: 1024, CpuPeriod: 100000, CpuQuota: -1, MemoryLimitInBytes: 64 * mib,
			Unified: map[string]string{"memory.min": "1048576"},
		},
		mismatches: []string{"memory.max", "memory.min"},
	}, {
		name: "unified keys", path: besteffortPath, opts: []ReadOption{WithUnifiedKeys("io.weight", "io.latency", "memory.max")},
		want: wantIOWeight,
	}, {
		name: "unified keys for the asked", path: besteffortPath,
		opts: []ReadOption{ForResources(SpecResources(&runtimeapi.LinuxContainerResources{
			Unified: map[string]string{"io.weight": "default 100", "io.latency": "x"},
		}))},
		want: wantIOWeight,
		asked: &runtimeapi.LinuxContainerResources{
			Unified: map[string]string{"io.weight": "default 100", "io.latency": "x"},
		},
		mismatches: []string{"io.latency"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			opts := append([]ReadOption{WithMode(ModeUnified), WithRoot(root)}, tc.opts...)
			held, err := Read(t.Context(), tc.path, opts...)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, held); diff != "" {
				t.Errorf("Read (-want +got):\n%s", diff)
			}
			if tc.asked == nil {
				return
			}
			// What containerd's CRI plugin makes of the request on a node with swap and hugetlb.
			asked := SpecResources(tc.asked, WithSwapController(true), WithHugetlbController(true))
			var fields []string
			for _, m := range Compare(asked, held) {
				fields = append(fields, m.Field)
			}
			if diff := cmp.Diff(tc.mismatches, fields); diff != "" {
				t.Errorf("Compare fields (-want +got):\n%s", diff)
			}
		})
	}
}

func TestReadErrors(t *testing.T) {
	root := v2Tree(t)
	outside := t.TempDir()
	writeTree(t, outside, map[string]string{"cgroup.controllers": "memory", "memory.max": "1"})
	if err := os.Symlink(outside, filepath.Join(root, "kubepods", "evil")); err != nil {
		t.Fatal(err)
	}
	writeTree(t, root, map[string]string{"bad/cgroup.controllers": "cpu", "bad/cpu.max": "lots"})
	canceled, cancel := context.WithCancel(t.Context())
	cancel()
	for _, tc := range []struct {
		name  string
		ctx   context.Context
		path  string
		opts  []ReadOption
		check func(error) bool
	}{
		{name: "no such cgroupfs cgroup", path: "/kubepods/burstable/pod456/nope", check: errdefs.IsNotFound},
		{name: "no such systemd cgroup", path: "kubepods-besteffort-pod123.slice:cri-containerd:nope", check: errdefs.IsNotFound},
		{name: "no such slice", path: "kubepods-burstable-pod9.slice:cri-containerd:abc", check: errdefs.IsNotFound},
		{name: "dot-dot", path: "/kubepods/../../etc", check: errdefs.IsInvalidArgument},
		{name: "not clean", path: "/kubepods//def", check: errdefs.IsInvalidArgument},
		{name: "NUL", path: "/kubepods\x00", check: errdefs.IsInvalidArgument},
		{name: "relative", path: "kubepods/burstable", check: errdefs.IsInvalidArgument},
		{name: "bad unified key", path: besteffortPath, opts: []ReadOption{WithUnifiedKeys("../memory.max")}, check: errdefs.IsInvalidArgument},
		{name: "unified key without controller", path: besteffortPath, opts: []ReadOption{WithUnifiedKeys("weight")}, check: errdefs.IsInvalidArgument},
		// The symlink is refused by os.Root, whatever it is classified as: nothing outside is read.
		{name: "symlink out of the mount", path: "/kubepods/evil", check: func(err error) bool { return err != nil }},
		{name: "unexpected content", path: "/bad", check: errdefs.IsInternal},
		{name: "no hierarchy", path: besteffortPath, opts: []ReadOption{WithMode(ModeUnavailable)}, check: errdefs.IsFailedPrecondition},
		{name: "no mount", path: besteffortPath, opts: []ReadOption{WithV2Mountpoint(filepath.Join(root, "nope"))}, check: errdefs.IsFailedPrecondition},
		{name: "canceled", ctx: canceled, path: besteffortPath, check: func(err error) bool { return errors.Is(err, context.Canceled) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := tc.ctx
			if ctx == nil {
				ctx = t.Context()
			}
			opts := append([]ReadOption{WithMode(ModeUnified), WithRoot(root)}, tc.opts...)
			held, err := Read(ctx, tc.path, opts...)
			t.Logf("Read(%q): %v", tc.path, err)
			if !tc.check(err) || held != nil {
				t.Fatalf("Read(%q) = %+v, %v; want the error the test names", tc.path, held, err)
			}
		})
	}
}

// v1Tree lays out cgroup v1 hierarchies under a directory: cpu, cpuset and memory, the
// container's cgroup /kubepods/pod1/c1 in all three, /kubepods/pod1/c2 only in cpu; and,
// when hybrid, the unified mount at root/unified with the hugetlb controller.
func v1Tree(t testing.TB, hybrid bool) string {
	t.Helper()
	root := t.TempDir()
	files := map[string]string{
		"cpu/kubepods/pod1/c1/cpu.shares": "512\n", "cpu/kubepods/pod1/c1/cpu.cfs_quota_us": "-1\n",
		"cpu/kubepods/pod1/c1/cpu.cfs_period_us": "100000\n", "cpu/kubepods/pod1/c1/cpu.stat": "nr_periods 0\n",
		"cpuset/kubepods/pod1/c1/cpuset.cpus": "0\n", "cpuset/kubepods/pod1/c1/cpuset.effective_cpus": "0\n",
		"cpuset/kubepods/pod1/c1/cpuset.mems":                 "0\n",
		"memory/kubepods/pod1/c1/memory.limit_in_bytes":       "67108864\n",
		"memory/kubepods/pod1/c1/memory.memsw.limit_in_bytes": v1Unlimited + "\n",
		"cpu/kubepods/pod1/c2/cpu.shares":                     "2\n",
	}
	if hybrid {
		files["unified/cgroup.controllers"] = "hugetlb\n"
		files["unified/kubepods/pod1/c1/cgroup.controllers"] = "hugetlb\n"
		files["unified/kubepods/pod1/c1/hugetlb.2MB.max"] = "max\n"
	}
	writeTree(t, root, files)
	return root
}

func TestReadV1Tree(t *testing.T) {
	pageSize := int64(os.Getpagesize())
	for _, tc := range []struct {
		name string
		mode string
		path string
		want func(root string) *Held
	}{{
		name: "legacy, three controllers", mode: ModeLegacy, path: "/kubepods/pod1/c1",
		want: func(root string) *Held {
			return &Held{
				Mode: ModeLegacy, Version: 1, Driver: DriverCgroupfs, Path: "/kubepods/pod1/c1", PageSize: pageSize,
				Dirs: map[string]string{
					"cpu": filepath.Join(root, "cpu/kubepods/pod1/c1"), "cpuset": filepath.Join(root, "cpuset/kubepods/pod1/c1"),
					"memory": filepath.Join(root, "memory/kubepods/pod1/c1"),
				},
				CPUShares: ptr(uint64(512)), CPUQuota: ptr(int64(-1)), CPUPeriod: ptr(uint64(100000)),
				CPUs: "0", EffectiveCPUs: "0", Mems: "0", MemoryLimit: ptr(64 * mib), Swap: ptr(int64(-1)),
				Files: map[string]string{
					"cpu.shares": "512", "cpu.cfs_quota_us": "-1", "cpu.cfs_period_us": "100000",
					"cpuset.cpus": "0", "cpuset.effective_cpus": "0", "cpuset.mems": "0",
					"memory.limit_in_bytes": "67108864", "memory.memsw.limit_in_bytes": v1Unlimited,
				},
			}
		},
	}, {
		name: "legacy, only in cpu", mode: ModeLegacy, path: "/kubepods/pod1/c2",
		want: func(root string) *Held {
			return &Held{
				Mode: ModeLegacy, Version: 1, Driver: DriverCgroupfs, Path: "/kubepods/pod1/c2", PageSize: pageSize,
				Dirs:      map[string]string{"cpu": filepath.Join(root, "cpu/kubepods/pod1/c2")},
				CPUShares: ptr(uint64(2)),
				Files:     map[string]string{"cpu.shares": "2"},
				Absent: []string{
					"cpu.cfs_period_us", "cpu.cfs_quota_us", "cpuset.cpus", "cpuset.effective_cpus", "cpuset.mems",
					"memory.limit_in_bytes", "memory.memsw.limit_in_bytes",
				},
			}
		},
	}, {
		name: "hybrid, hugetlb on v2", mode: ModeHybrid, path: "/kubepods/pod1/c1",
		want: func(root string) *Held {
			return &Held{
				Mode: ModeHybrid, Version: 1, Driver: DriverCgroupfs, Path: "/kubepods/pod1/c1", PageSize: pageSize,
				Dirs: map[string]string{
					"cpu": filepath.Join(root, "cpu/kubepods/pod1/c1"), "cpuset": filepath.Join(root, "cpuset/kubepods/pod1/c1"),
					"memory": filepath.Join(root, "memory/kubepods/pod1/c1"), "hugetlb": filepath.Join(root, "unified/kubepods/pod1/c1"),
				},
				CPUShares: ptr(uint64(512)), CPUQuota: ptr(int64(-1)), CPUPeriod: ptr(uint64(100000)),
				CPUs: "0", EffectiveCPUs: "0", Mems: "0", MemoryLimit: ptr(64 * mib), Swap: ptr(int64(-1)),
				Hugepages: map[string]int64{"2MB": -1},
				Files: map[string]string{
					"cpu.shares": "512", "cpu.cfs_quota_us": "-1", "cpu.cfs_period_us": "100000",
					"cpuset.cpus": "0", "cpuset.effective_cpus": "0", "cpuset.mems": "0",
					"memory.limit_in_bytes": "67108864", "memory.memsw.limit_in_bytes": v1Unlimited,
					"hugetlb.2MB.max": "max",
				},
			}
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			root := v1Tree(t, tc.mode == ModeHybrid)
			held, err := Read(t.Context(), tc.path, WithMode(tc.mode), WithRoot(root))
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want(root), held); diff != "" {
				t.Errorf("Read (-want +got):\n%s", diff)
			}
		})
	}
	t.Run("not found", func(t *testing.T) {
		root := v1Tree(t, false)
		if _, err := Read(t.Context(), "/kubepods/pod1/nope", WithMode(ModeLegacy), WithRoot(root)); !errdefs.IsNotFound(err) {
			t.Fatalf("err = %v, want not found", err)
		}
	})
}

func TestReadAt(t *testing.T) {
	dir := t.TempDir()
	long := strings.Repeat("0,", 3000) + "0"
	writeTree(t, dir, map[string]string{"short": "1\n", "long": long, "empty": ""})
	if err := os.Symlink("/etc/hostname", filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	d, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	for _, tc := range []struct {
		name, want string
		buf        []byte
		notExist   bool
		fails      bool
	}{
		{name: "short", want: "1\n", buf: make([]byte, 0, 512)},
		{name: "short", want: "1\n"}, // no buffer
		{name: "long", want: long, buf: make([]byte, 0, 512)},
		{name: "empty", want: "", buf: make([]byte, 0, 512)},
		{name: "nope", notExist: true},
		{name: "link", fails: true}, // O_NOFOLLOW
	} {
		got, err := readAt(d, tc.name, tc.buf)
		switch {
		case tc.notExist:
			if !errors.Is(err, os.ErrNotExist) {
				t.Errorf("readAt(%s) = %v, want not exist", tc.name, err)
			}
		case tc.fails:
			if err == nil {
				t.Errorf("readAt(%s) read %q through a symlink", tc.name, got)
			}
		case err != nil || string(got) != tc.want:
			t.Errorf("readAt(%s) = %d bytes, %v; want %d bytes", tc.name, len(got), err, len(tc.want))
		}
	}
}
