package cgroup

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/cgroups/v3"
	"github.com/containerd/errdefs"
)

func TestProcs(t *testing.T) {
	root := t.TempDir()
	write := func(dir, content string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Join(root, dir), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, dir, "cgroup.procs"), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("pids/k8s.io/abc", "4242\n")
	write("memory/kubepods/pod1/def", "17\n18\n") // no pids hierarchy holds it
	write("kubepods.slice/kubepods-pod1.slice/cri-containerd-ghi.scope", "99\n")
	for _, tc := range []struct {
		mode, path string
		want       []int
	}{
		{ModeHybrid, "/k8s.io/abc", []int{4242}},
		{ModeLegacy, "/kubepods/pod1/def", []int{17, 18}},
		{ModeUnified, "kubepods-pod1.slice:cri-containerd:ghi", []int{99}},
	} {
		got, err := procs(tc.mode, root, tc.path)
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("procs(%s, %s) = %v, %v; want %v", tc.mode, tc.path, got, err, tc.want)
		}
	}
	for _, tc := range []struct {
		mode, path string
		is         func(error) bool
	}{
		{ModeHybrid, "/k8s.io/gone", errdefs.IsNotFound},
		{ModeUnified, "/k8s.io/abc", errdefs.IsNotFound},
		{ModeHybrid, "/k8s.io/../abc", errdefs.IsInvalidArgument},
		{ModeUnavailable, "/k8s.io/abc", errdefs.IsFailedPrecondition},
	} {
		if got, err := procs(tc.mode, root, tc.path); !tc.is(err) {
			t.Errorf("procs(%s, %s) = %v, %v; want an error of its class", tc.mode, tc.path, got, err)
		}
	}
}

// The test's own process is in its cgroup's cgroup.procs, found from /proc/self/cgroup.
func TestProcsOfOwnCgroup(t *testing.T) {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		t.Skip(err)
	}
	var path string
	unified := modeName(cgroups.Mode()) == ModeUnified
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.SplitN(line, ":", 3); len(f) == 3 && ((!unified && f[1] == "pids") || (unified && f[0] == "0")) {
			path = f[2]
		}
	}
	if path == "" || path == "/" {
		t.Skip("no pids (or unified) cgroup below the root here")
	}
	got, err := Procs(path)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(got, os.Getpid()) {
		t.Errorf("Procs(%s) = %v, want it to hold %d", path, got, os.Getpid())
	}
}
