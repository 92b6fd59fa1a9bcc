package cgroup

import (
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// TestCPUSharesToWeight checks the conversion against what runc v1.5.2 computes: the values
// are the output of github.com/opencontainers/cgroups v0.1.0's ConvertCPUSharesToCgroupV2Value
// (the version runc v1.5.2 requires), run for this table.
func TestCPUSharesToWeight(t *testing.T) {
	for _, tc := range []struct{ shares, weight uint64 }{
		{0, 0}, // unset
		{1, 1},
		{2, 1}, // the kubelet's minimum (BestEffort)
		{3, 2},
		{10, 4},
		{102, 17}, // 100m
		{128, 21},
		{256, 35},
		{512, 59},
		{1024, 100}, // the defaults: the linear formula of runc < 1.3.2 gave 39
		{2048, 174},
		{4096, 303},
		{10000, 627},
		{100000, 4340},
		{262143, 10000},
		{262144, 10000}, // the maximum
		{300000, 10000},
	} {
		if got := CPUSharesToWeight(tc.shares); got != tc.weight {
			t.Errorf("CPUSharesToWeight(%d) = %d, runc v1.5.2 gives %d", tc.shares, got, tc.weight)
		}
	}
}

// TestKubeletCPUSharesToWeight: the kubelet's own conversion for the cgroups it writes
// (pkg/kubelet/cm CpuSharesToCpuWeight), linear; 307 shares is what kubelet 1.37.2 wrote as
// weight 12 into a pod's slice in the VM lane (test/vm), where runc's would be 40.
func TestKubeletCPUSharesToWeight(t *testing.T) {
	for _, tc := range []struct{ shares, weight uint64 }{
		{0, 0}, // unset
		{1, 1}, // clamped to 2
		{2, 1},
		{307, 12},
		{1024, 39},
		{262144, 10000},
		{300000, 10000}, // clamped
	} {
		if got := KubeletCPUSharesToWeight(tc.shares); got != tc.weight {
			t.Errorf("KubeletCPUSharesToWeight(%d) = %d, the kubelet writes %d", tc.shares, got, tc.weight)
		}
	}
	if CPUSharesToWeight(307) == KubeletCPUSharesToWeight(307) {
		t.Error("runc's and the kubelet's conversions agree on 307 shares: the test shows nothing")
	}
}

// A pod's cgroup, which the kubelet writes itself, is compared with the kubelet's conversion
// (WrittenByKubelet); a container's with runc's.
func TestCompareWrittenByKubelet(t *testing.T) {
	shares := uint64(307)
	asked := &specs.LinuxResources{CPU: &specs.LinuxCPU{Shares: &shares}}
	kubelet, runc := KubeletCPUSharesToWeight(shares), CPUSharesToWeight(shares)
	for _, tc := range []struct {
		name   string
		held   uint64
		opts   []CompareOption
		wantOK bool
	}{
		{"pod cgroup with the kubelet's weight", kubelet, []CompareOption{WrittenByKubelet()}, true},
		{"pod cgroup with runc's weight", runc, []CompareOption{WrittenByKubelet()}, false},
		{"container cgroup with runc's weight", runc, nil, true},
		{"container cgroup with the kubelet's weight", kubelet, nil, false},
	} {
		held := &Held{Version: 2, CPUWeight: &tc.held}
		if got := Compare(asked, held, tc.opts...); (len(got) == 0) != tc.wantOK {
			t.Errorf("%s: mismatches %v, want none = %v", tc.name, got, tc.wantOK)
		}
	}
}

// TestSwapToV2 checks the swap conversion against runc v1.5.2's ConvertMemorySwapToCgroupV2Value
// (github.com/opencontainers/cgroups v0.1.0), whose results for these are in the table.
func TestSwapToV2(t *testing.T) {
	for _, tc := range []struct {
		swap, memory, want int64
		err                bool
	}{
		{swap: 0, memory: 0, want: 0},
		{swap: 0, memory: -1, want: -1},
		{swap: -1, memory: -1, want: -1},
		{swap: -1, memory: 100, want: -1},
		{swap: 100, memory: 100, want: 0},
		{swap: 200, memory: 100, want: 100},
		{swap: 0, memory: 100, want: 0},
		{swap: 100, memory: -1, want: 100},
		{swap: 100, memory: 0, err: true},
		{swap: 50, memory: 100, err: true},
		{swap: 100, memory: -2, err: true},
	} {
		got, err := swapToV2(tc.swap, tc.memory)
		if (err != nil) != tc.err || (err == nil && got != tc.want) {
			t.Errorf("swapToV2(%d, %d) = %d, %v; want %d, error %v", tc.swap, tc.memory, got, err, tc.want, tc.err)
		}
	}
}

func TestCanonicalCPUList(t *testing.T) {
	for _, tc := range []struct {
		in, want string
		err      bool
	}{
		{in: "", want: ""},
		{in: "0", want: "0"},
		{in: "0-3", want: "0-3"},
		{in: "0,1,2,3", want: "0-3"},
		{in: "3,2,1,0", want: "0-3"},
		{in: "0-1,2-3,7", want: "0-3,7"},
		{in: "0-5,2-3", want: "0-5"},
		{in: " 0-1\n", want: "0-1"},
		{in: "0-4294967295", want: "0-4294967295"}, // never expanded
		{in: "3-1", err: true},
		{in: "a", err: true},
		{in: "0,", err: true},
		{in: "-1", err: true},
	} {
		got, err := canonicalCPUList(tc.in)
		if (err != nil) != tc.err || got != tc.want {
			t.Errorf("canonicalCPUList(%q) = %q, %v; want %q, error %v", tc.in, got, err, tc.want, tc.err)
		}
	}
}

func TestParsePageSize(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
		ok   bool
	}{
		{"2MB", 2 << 20, true}, {"1GB", 1 << 30, true}, {"64KB", 64 << 10, true}, {"16GB", 16 << 30, true},
		{"2M", 0, false}, {"MB", 0, false}, {"0MB", 0, false}, {"x", 0, false},
	} {
		got, ok := parsePageSize(tc.in)
		if got != tc.want || ok != tc.ok {
			t.Errorf("parsePageSize(%q) = %d, %v; want %d, %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
}
