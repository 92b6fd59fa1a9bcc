package cgroup

import (
	"maps"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// The files of a cgroup holding 512 shares, a 50000/100000 quota, CPUs 0-1, memory node 0,
// 64 MiB of memory and no swap.
var (
	v1Files512 = map[string]string{
		"cpu.shares": "512", "cpu.cfs_quota_us": "50000", "cpu.cfs_period_us": "100000",
		"cpuset.cpus": "0-1", "cpuset.effective_cpus": "0-1", "cpuset.mems": "0",
		"memory.limit_in_bytes": "67108864", "memory.memsw.limit_in_bytes": "67108864",
	}
	v2Files512 = map[string]string{
		"cpu.weight": "59", "cpu.max": "50000 100000",
		"cpuset.cpus": "0-1", "cpuset.cpus.effective": "0-1", "cpuset.mems": "0",
		"memory.min": "0", "memory.high": "max", "memory.max": "67108864", "memory.swap.max": "0",
		"memory.oom.group": "0",
	}
)

const v1Unlimited = "9223372036854771712"

// asked512 is what those cgroups were asked.
func asked512() *specs.LinuxResources {
	return &specs.LinuxResources{
		CPU:    &specs.LinuxCPU{Shares: ptr(uint64(512)), Quota: ptr(int64(50000)), Period: ptr(uint64(100000)), Cpus: "0,1", Mems: "0"},
		Memory: &specs.LinuxMemory{Limit: ptr(64 * mib), Swap: ptr(64 * mib)},
	}
}

// heldFrom is the Held of a cgroup of version with base's files, changed: a value replaces
// a file's content, "-" removes the file (absent).
func heldFrom(t testing.TB, version int, base, changes map[string]string) *Held {
	t.Helper()
	h := &Held{Version: version, PageSize: page, Files: maps.Clone(base)}
	for k, v := range changes {
		if v == "-" {
			delete(h.Files, k)
			h.Absent = append(h.Absent, k)
			continue
		}
		h.Files[k] = v
	}
	if err := h.fill(); err != nil {
		t.Fatal(err)
	}
	return h
}

func TestCompare(t *testing.T) {
	for _, tc := range []struct {
		name    string
		version int
		changes map[string]string
		asked   func(r *specs.LinuxResources) // changes asked512; nil: as it is
		want    []Mismatch
	}{{
		name: "v1 as asked", version: 1,
	}, {
		name: "v1 nothing asked", version: 1, changes: map[string]string{"cpu.shares": "2", "memory.limit_in_bytes": v1Unlimited},
		asked: func(r *specs.LinuxResources) { *r = specs.LinuxResources{} },
	}, {
		name: "v1 zero and unset not compared", version: 1,
		changes: map[string]string{"cpu.shares": "2", "cpu.cfs_quota_us": "-1", "cpuset.cpus": "1", "memory.limit_in_bytes": v1Unlimited},
		asked: func(r *specs.LinuxResources) {
			r.CPU = &specs.LinuxCPU{Shares: ptr(uint64(0)), Quota: ptr(int64(0)), Period: ptr(uint64(0))}
			r.Memory = &specs.LinuxMemory{Limit: ptr(int64(0)), Swap: ptr(int64(0))}
		},
	}, {
		name: "v1 everything differs", version: 1,
		changes: map[string]string{
			"cpu.shares": "1024", "cpu.cfs_quota_us": "-1", "cpu.cfs_period_us": "50000", "cpuset.cpus": "0",
			"cpuset.mems": "0-1", "memory.limit_in_bytes": v1Unlimited, "memory.memsw.limit_in_bytes": v1Unlimited,
		},
		want: []Mismatch{
			{"cpu.shares", "512", "1024"},
			{"cpu.cfs_quota_us", "50000", "-1"},
			{"cpu.cfs_period_us", "100000", "50000"},
			{"cpuset.cpus", "0,1", "0"},
			{"cpuset.mems", "0", "0-1"},
			{"memory.limit_in_bytes", "67108864", v1Unlimited},
			{"memory.memsw.limit_in_bytes", "67108864", v1Unlimited},
		},
	}, {
		name: "v1 no quota", version: 1, changes: map[string]string{"cpu.cfs_quota_us": "-1"},
		asked: func(r *specs.LinuxResources) { r.CPU.Quota = ptr(int64(-5)) },
	}, {
		name: "v1 limits rounded down to pages", version: 1,
		changes: map[string]string{"memory.limit_in_bytes": "99999744", "memory.memsw.limit_in_bytes": "99999744"},
		asked: func(r *specs.LinuxResources) {
			r.Memory = &specs.LinuxMemory{Limit: ptr(int64(100000001)), Swap: ptr(int64(100000001))}
		},
	}, {
		name: "v1 unlimited", version: 1,
		changes: map[string]string{"memory.limit_in_bytes": v1Unlimited, "memory.memsw.limit_in_bytes": v1Unlimited},
		asked:   func(r *specs.LinuxResources) { r.Memory = &specs.LinuxMemory{Limit: ptr(int64(-1))} },
	}, {
		name: "v1 unlimited memory, limited swap", version: 1,
		changes: map[string]string{"memory.limit_in_bytes": v1Unlimited},
		asked:   func(r *specs.LinuxResources) { r.Memory = &specs.LinuxMemory{Limit: ptr(int64(-1))} },
		want:    []Mismatch{{"memory.memsw.limit_in_bytes", "unlimited", "67108864"}},
	}, {
		name: "v1 unlimited memory without swap accounting", version: 1,
		changes: map[string]string{"memory.limit_in_bytes": v1Unlimited, "memory.memsw.limit_in_bytes": "-"},
		asked:   func(r *specs.LinuxResources) { r.Memory = &specs.LinuxMemory{Limit: ptr(int64(-1))} },
	}, {
		name: "v1 memory controller absent", version: 1,
		changes: map[string]string{"memory.limit_in_bytes": "-", "memory.memsw.limit_in_bytes": "-"},
		want: []Mismatch{
			{"memory.limit_in_bytes", "67108864", "absent"},
			{"memory.memsw.limit_in_bytes", "67108864", "absent"},
		},
	}, {
		name: "v1 unified keys refused", version: 1,
		asked: func(r *specs.LinuxResources) { r.Unified = map[string]string{"memory.min": "1", "memory.high": "2"} },
		want: []Mismatch{
			{"memory.high", "2", "nothing: cgroup v1, where runc refuses unified keys"},
			{"memory.min", "1", "nothing: cgroup v1, where runc refuses unified keys"},
		},
	}, {
		name: "v1 hugepages", version: 1,
		changes: map[string]string{"hugetlb.2MB.limit_in_bytes": "4194304", "hugetlb.1GB.limit_in_bytes": v1Unlimited},
		asked: func(r *specs.LinuxResources) {
			r.HugepageLimits = []specs.LinuxHugepageLimit{{Pagesize: "2MB", Limit: 4194304 + 1}, {Pagesize: "1GB", Limit: 0}, {Pagesize: "16GB", Limit: 0}}
		},
		want: []Mismatch{
			{"hugetlb.1GB.limit_in_bytes", "0", v1Unlimited},
			{"hugetlb.16GB.limit_in_bytes", "0", "absent"},
		},
	}, {
		name: "v2 as asked", version: 2,
	}, {
		name: "v2 default shares are the default weight", version: 2, changes: map[string]string{"cpu.weight": "100"},
		asked: func(r *specs.LinuxResources) { r.CPU.Shares = ptr(uint64(1024)) },
	}, {
		name: "v2 weight of the old linear conversion", version: 2, changes: map[string]string{"cpu.weight": "39"},
		asked: func(r *specs.LinuxResources) { r.CPU.Shares = ptr(uint64(1024)) },
		want:  []Mismatch{{"cpu.weight", "100 (cpu shares 1024)", "39"}},
	}, {
		name: "v2 zero and unset not compared", version: 2,
		changes: map[string]string{"cpu.weight": "1", "cpu.max": "max 100000", "memory.max": "max", "memory.swap.max": "max"},
		asked: func(r *specs.LinuxResources) {
			r.CPU = &specs.LinuxCPU{Shares: ptr(uint64(0)), Quota: ptr(int64(0)), Period: ptr(uint64(0))}
			r.Memory = &specs.LinuxMemory{Limit: ptr(int64(0)), Swap: ptr(int64(0))}
		},
	}, {
		name: "v2 everything differs", version: 2,
		changes: map[string]string{
			"cpu.weight": "100", "cpu.max": "max 50000", "cpuset.cpus": "", "cpuset.mems": "",
			"memory.max": "max", "memory.swap.max": "max",
		},
		want: []Mismatch{
			{"cpu.weight", "59 (cpu shares 512)", "100"},
			{"cpu.max quota", "50000", "max 50000"},
			{"cpu.max period", "100000", "max 50000"},
			{"cpuset.cpus", "0,1", `""`},
			{"cpuset.mems", "0", `""`},
			{"memory.max", "67108864", "max"},
			{"memory.swap.max", "0", "max"},
		},
	}, {
		name: "v2 no quota", version: 2, changes: map[string]string{"cpu.max": "max 100000"},
		asked: func(r *specs.LinuxResources) { r.CPU.Quota = ptr(int64(-1)) },
	}, {
		name: "v2 swap is swap alone", version: 2, changes: map[string]string{"memory.swap.max": "67108864"},
		asked: func(r *specs.LinuxResources) { r.Memory.Swap = ptr(128 * mib) },
	}, {
		name: "v2 swap differs", version: 2,
		asked: func(r *specs.LinuxResources) { r.Memory.Swap = ptr(128 * mib) },
		want:  []Mismatch{{"memory.swap.max", "67108864", "0"}},
	}, {
		name: "v2 swap unset", version: 2, changes: map[string]string{"memory.swap.max": "max"},
		asked: func(r *specs.LinuxResources) { r.Memory.Swap = nil },
	}, {
		name: "v2 no swap accounting", version: 2, changes: map[string]string{"memory.swap.max": "-"},
	}, {
		name: "v2 unlimited memory and swap", version: 2, changes: map[string]string{"memory.max": "max", "memory.swap.max": "max"},
		asked: func(r *specs.LinuxResources) { r.Memory = &specs.LinuxMemory{Limit: ptr(int64(-1))} },
	}, {
		name: "v2 unlimited memory, swap left limited", version: 2, changes: map[string]string{"memory.max": "max"},
		asked: func(r *specs.LinuxResources) { r.Memory = &specs.LinuxMemory{Limit: ptr(int64(-1))} },
		want:  []Mismatch{{"memory.swap.max", "max", "0"}},
	}, {
		name: "v2 swap runc refuses", version: 2,
		asked: func(r *specs.LinuxResources) { r.Memory = &specs.LinuxMemory{Swap: ptr(128 * mib)} },
		want: []Mismatch{{"memory.swap.max",
			"nothing: runc refuses swap 134217728 with memory limit 0 (unable to set swap limit without memory limit)", "0"}},
	}, {
		name: "v2 memory controller absent", version: 2,
		changes: map[string]string{"memory.min": "-", "memory.high": "-", "memory.max": "-", "memory.swap.max": "-", "memory.oom.group": "-"},
		asked:   func(r *specs.LinuxResources) { r.Unified = map[string]string{"memory.min": "1048576"} },
		want: []Mismatch{
			{"memory.max", "67108864", "absent"},
			{"memory.min", "1048576", "absent"},
		},
	}, {
		name: "v2 unified as asked", version: 2,
		changes: map[string]string{"memory.min": "99999744", "memory.oom.group": "1"},
		asked: func(r *specs.LinuxResources) {
			r.Unified = map[string]string{
				"memory.min": "100000001", "memory.high": "max", "memory.oom.group": " 1\n",
				"cpu.max": "50000", "cpuset.cpus": "0,1",
			}
		},
	}, {
		name: "v2 unified differs", version: 2,
		asked: func(r *specs.LinuxResources) {
			r.Unified = map[string]string{"memory.high": "199229440", "memory.oom.group": "1", "io.weight": "default 200", "cpu.max": "40000"}
		},
		want: []Mismatch{
			{"cpu.max", "40000", "50000 100000"},
			{"io.weight", "default 200", "not read"},
			{"memory.high", "199229440", "max"},
			{"memory.oom.group", "1", "0"},
		},
	}, {
		name: "v2 unified overrides limits", version: 2,
		changes: map[string]string{"cpu.weight": "200", "memory.max": "134217728", "memory.swap.max": "1073741824", "cpu.max": "max 100000"},
		asked: func(r *specs.LinuxResources) {
			r.Unified = map[string]string{"cpu.weight": "200", "memory.max": "134217728", "memory.swap.max": "1073741824", "cpu.max": "max"}
		},
	}, {
		name: "v2 hugepages", version: 2,
		changes: map[string]string{"hugetlb.2MB.max": "max", "hugetlb.2MB.rsvd.max": "0", "hugetlb.1GB.max": "0"},
		asked: func(r *specs.LinuxResources) {
			r.HugepageLimits = []specs.LinuxHugepageLimit{{Pagesize: "2MB", Limit: 0}, {Pagesize: "1GB", Limit: 0}}
		},
		want: []Mismatch{{"hugetlb.2MB.max", "0", "max"}},
	}, {
		name: "hybrid hugepages on v2", version: 1,
		changes: map[string]string{"hugetlb.2MB.max": "0"},
		asked: func(r *specs.LinuxResources) {
			r.HugepageLimits = []specs.LinuxHugepageLimit{{Pagesize: "2MB", Limit: 0}, {Pagesize: "1GB", Limit: 1 << 30}}
		},
		want: []Mismatch{{"hugetlb.1GB.max", "1073741824", "absent"}},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			base := v1Files512
			if tc.version == 2 {
				base = v2Files512
			}
			held := heldFrom(t, tc.version, base, tc.changes)
			asked := asked512()
			if tc.asked != nil {
				tc.asked(asked)
			}
			got := Compare(asked, held)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Compare (-want +got):\n%s", diff)
			}
		})
	}
}

func TestCompareNil(t *testing.T) {
	held := heldFrom(t, 1, v1Files512, nil)
	if got := Compare(nil, held); got != nil {
		t.Errorf("Compare(nil, held) = %v", got)
	}
	if got := Compare(asked512(), nil); got != nil {
		t.Errorf("Compare(asked, nil) = %v", got)
	}
	empty := &specs.LinuxResources{CPU: &specs.LinuxCPU{}, Memory: &specs.LinuxMemory{}}
	if got := Compare(empty, &Held{}); got != nil {
		t.Errorf("Compare(empty, empty) = %v", got)
	}
}

func TestMismatchString(t *testing.T) {
	m := Mismatch{Field: "cpu.weight", Asked: "100 (cpu shares 1024)", Held: "39"}
	if got, want := m.String(), "cpu.weight: asked 100 (cpu shares 1024), cgroup holds 39"; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
}

func TestHeldFill(t *testing.T) {
	for _, tc := range []struct {
		name    string
		version int
		files   map[string]string
		errHas  string
	}{
		{name: "v1 shares not a number", version: 1, files: map[string]string{"cpu.shares": "x"}, errHas: "cpu.shares"},
		{name: "v2 cpu.max one field", version: 2, files: map[string]string{"cpu.max": "max"}, errHas: "cpu.max"},
		{name: "v2 memory.max word", version: 2, files: map[string]string{"memory.max": "lots"}, errHas: "memory.max"},
		{name: "v1 beyond int64 is unlimited", version: 1, files: map[string]string{"memory.limit_in_bytes": "18446744073709551615"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := &Held{Version: tc.version, PageSize: page, Files: tc.files}
			err := h.fill()
			if tc.errHas == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.errHas) {
				t.Fatalf("fill() = %v, want an error naming %s", err, tc.errHas)
			}
		})
	}
}
