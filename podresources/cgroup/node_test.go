package cgroup

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// writeTree writes files (path relative to root → content) under root, making directories.
func writeTree(t testing.TB, root string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func TestDetectAt(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mode   string
		files  map[string]string
		want   Node // V2Mountpoint relative to the root
		reason string
	}{{
		name:  "unified with memory",
		mode:  ModeUnified,
		files: map[string]string{"cgroup.controllers": "cpuset cpu io memory hugetlb pids rdma misc\n"},
		want: Node{Mode: ModeUnified, V2Mountpoint: ".", MemoryQoS: true,
			V2Controllers: []string{"cpu", "cpuset", "hugetlb", "io", "memory", "misc", "pids", "rdma"}},
	}, {
		name:  "unified without memory",
		mode:  ModeUnified,
		files: map[string]string{"cgroup.controllers": "cpu io pids\n"},
		want: Node{Mode: ModeUnified, V2Mountpoint: ".", V2Controllers: []string{"cpu", "io", "pids"},
			MemoryQoSReason: "unified hierarchy, but the memory controller is not enabled (v2 has: cpu io pids)"},
	}, {
		name:  "hybrid, hugetlb on v2 (this machine)",
		mode:  ModeHybrid,
		files: map[string]string{"unified/cgroup.controllers": "hugetlb\n", "memory/memory.limit_in_bytes": "9223372036854771712\n"},
		want: Node{Mode: ModeHybrid, V2Mountpoint: "unified", V2Controllers: []string{"hugetlb"},
			MemoryQoSReason: "hybrid hierarchy: the memory controller is on cgroup v1 (v2 has: hugetlb)"},
	}, {
		name:  "hybrid, empty v2",
		mode:  ModeHybrid,
		files: map[string]string{"unified/cgroup.controllers": ""},
		want: Node{Mode: ModeHybrid, V2Mountpoint: "unified", V2Controllers: []string{},
			MemoryQoSReason: "hybrid hierarchy: the memory controller is on cgroup v1 (v2 has: none)"},
	}, {
		name:  "hybrid, memory on v2",
		mode:  ModeHybrid,
		files: map[string]string{"unified/cgroup.controllers": "memory hugetlb"},
		want: Node{Mode: ModeHybrid, V2Mountpoint: "unified", V2Controllers: []string{"hugetlb", "memory"},
			MemoryQoSReason: "hybrid hierarchy: memory QoS needs the unified hierarchy, and memory limits are set on cgroup v1 here (v2 has: hugetlb memory)"},
	}, {
		name: "legacy",
		mode: ModeLegacy,
		want: Node{Mode: ModeLegacy, MemoryQoSReason: "legacy hierarchy: cgroup v1 only, which has no memory.min or memory.high"},
	}, {
		name:   "unified, controllers unreadable",
		mode:   ModeUnified,
		want:   Node{Mode: ModeUnified, V2Mountpoint: "."},
		reason: "unified hierarchy, but its controllers cannot be read: ROOT/cgroup.controllers does not exist",
	}, {
		name:   "unavailable",
		mode:   ModeUnavailable,
		want:   Node{Mode: ModeUnavailable},
		reason: "no cgroup hierarchy mounted at ROOT",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			writeTree(t, root, tc.files)
			want := tc.want
			if want.V2Mountpoint != "" {
				want.V2Mountpoint = filepath.Join(root, want.V2Mountpoint)
			}
			if tc.reason != "" {
				want.MemoryQoSReason = strings.ReplaceAll(tc.reason, "ROOT", root)
			}
			got := DetectAt(tc.mode, root)
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("DetectAt(%s) (-want +got):\n%s", tc.mode, diff)
			}
		})
	}
}

func TestNodeKeysAndValues(t *testing.T) {
	for _, tc := range []struct {
		name string
		node Node
		want []any
	}{{
		name: "applicable",
		node: Node{Mode: ModeUnified, V2Controllers: []string{"memory"}, MemoryQoS: true},
		want: []any{"mode", ModeUnified, "v2Controllers", []string{"memory"}, "memoryQoS", true},
	}, {
		name: "not applicable",
		node: Node{Mode: ModeHybrid, V2Controllers: []string{"hugetlb"}, MemoryQoSReason: "why"},
		want: []any{"mode", ModeHybrid, "v2Controllers", []string{"hugetlb"}, "memoryQoS", false, "memoryQoSReason", "why"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, tc.node.KeysAndValues()); diff != "" {
				t.Errorf("KeysAndValues (-want +got):\n%s", diff)
			}
		})
	}
}

// TestDetectThisMachine checks Detect on the machines podgate is developed on: hybrid, with
// only hugetlb on cgroup v2.
func TestDetectThisMachine(t *testing.T) {
	n := Detect()
	if n.Mode != ModeHybrid || !slices.Equal(n.V2Controllers, []string{"hugetlb"}) {
		t.Skipf("this test is for a hybrid node whose cgroup v2 has only hugetlb; this one is %s with v2 controllers %v", n.Mode, n.V2Controllers)
	}
	want := Node{
		Mode: ModeHybrid, V2Mountpoint: "/sys/fs/cgroup/unified", V2Controllers: []string{"hugetlb"},
		MemoryQoSReason: "hybrid hierarchy: the memory controller is on cgroup v1 (v2 has: hugetlb)",
	}
	if diff := cmp.Diff(want, n); diff != "" {
		t.Errorf("Detect (-want +got):\n%s", diff)
	}
}
