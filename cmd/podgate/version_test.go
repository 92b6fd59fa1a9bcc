package main

import (
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
)

func TestReadBuildInfo(t *testing.T) {
	info := func(main string, settings ...debug.BuildSetting) func() (*debug.BuildInfo, bool) {
		return func() (*debug.BuildInfo, bool) {
			return &debug.BuildInfo{GoVersion: "go1.99.1", Main: debug.Module{Path: "github.com/podgate/podgate", Version: main}, Settings: settings}, true
		}
	}
	rev := debug.BuildSetting{Key: "vcs.revision", Value: "0123abc"}
	for _, tc := range []struct {
		name    string
		stamped string
		commit  string
		read    func() (*debug.BuildInfo, bool)
		want    buildInfo
	}{
		{"make build: -X wins over the module version", "v1.2.0-3-gabc", "", info("v0.0.0-2026-abc", rev),
			buildInfo{"v1.2.0-3-gabc", "0123abc", "go1.99.1"}},
		{"go install @version: the module version", "dev", "", info("v1.2.0"), buildInfo{"v1.2.0", "unknown", "go1.99.1"}},
		{"go build in a checkout without -X", "dev", "", info("(devel)", rev), buildInfo{"dev", "0123abc", "go1.99.1"}},
		{"uncommitted changes", "dev", "", info("", rev, debug.BuildSetting{Key: "vcs.modified", Value: "true"}),
			buildInfo{"dev", "0123abc-dirty", "go1.99.1"}},
		{"vcs.revision wins over -X main.commit", "dev", "fedcba", info("", rev), buildInfo{"dev", "0123abc", "go1.99.1"}},
		{"-X main.commit when go build stamped none", "dev", "fedcba", info(""), buildInfo{"dev", "fedcba", "go1.99.1"}},
		{"no build info", "dev", "", func() (*debug.BuildInfo, bool) { return nil, false }, buildInfo{"dev", "unknown", runtime.Version()}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := readBuildInfo(tc.stamped, tc.commit, tc.read); got != tc.want {
				t.Errorf("readBuildInfo = %+v, want %+v", got, tc.want)
			}
		})
	}
}

// TestVersionOfABuiltBinary builds podgate with make build and runs `podgate version`: the
// version make stamps (git describe), the commit (HEAD, "-dirty" with uncommitted changes), the
// toolchain's version.
func TestVersionOfABuiltBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("builds podgate")
	}
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("make is not installed")
	}
	root := filepath.Join("..", "..")
	git := func(args ...string) string {
		out, err := exec.CommandContext(t.Context(), "git", append([]string{"-C", root}, args...)...).Output()
		if err != nil {
			t.Skipf("git %v: %v (not a git checkout?)", args, err)
		}
		return strings.TrimSpace(string(out))
	}
	head, describe := git("rev-parse", "HEAD"), git("describe", "--tags", "--always", "--dirty")
	dir := t.TempDir()
	if out, err := exec.CommandContext(t.Context(), "make", "-C", root, "build", "BIN="+dir).CombinedOutput(); err != nil {
		t.Fatalf("make build: %v\n%s", err, out)
	}
	out, err := exec.CommandContext(t.Context(), filepath.Join(dir, "podgate"), "version").Output()
	if err != nil {
		t.Fatalf("podgate version: %v", err)
	}
	lines := strings.Split(strings.TrimSuffix(string(out), "\n"), "\n")
	if len(lines) != 3 || lines[0] != "podgate "+describe || lines[2] != "go: "+runtime.Version() ||
		strings.TrimSuffix(lines[1], "-dirty") != "commit: "+head {
		t.Errorf("podgate version printed:\n%s\nwant podgate %s, commit: %s[-dirty], go: %s", out, describe, head, runtime.Version())
	}
}
