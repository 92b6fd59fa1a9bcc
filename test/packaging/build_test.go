package packaging

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// Versions of the packages the tests build: the second one is the upgrade.
const (
	oldVersion = "v0.0.1"
	newVersion = "v0.0.2"
)

// Architectures of make package, and their names in the packages' file names.
var (
	arches  = []string{"amd64", "arm64"}
	rpmArch = map[string]string{"amd64": "x86_64", "arm64": "aarch64"}
)

// release is one make release (or make package) into its own directory.
type release struct {
	dir string
	err error
}

var (
	releasesMu sync.Mutex
	releases   = map[string]*release{}
)

// repoRoot is the module's root, where the Makefile is.
func repoRoot(t testing.TB) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// makeRelease runs `make TARGET VERSION=version` once per test binary for each version, into a
// directory removed when the tests end (TestMain), and returns that directory. oldVersion is a
// full make release (both architectures, SBOMs, SHA256SUMS); newVersion only the amd64 packages
// the upgrade installs.
func makeRelease(t testing.TB, version string) string {
	t.Helper()
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("make is not installed")
	}
	releasesMu.Lock()
	defer releasesMu.Unlock()
	if r, ok := releases[version]; ok {
		if r.err != nil {
			t.Fatal(r.err)
		}
		return r.dir
	}
	r := &release{}
	releases[version] = r
	r.dir, r.err = os.MkdirTemp("", "podgate-release-"+version+"-")
	if r.err != nil {
		t.Fatal(r.err)
	}
	args := []string{"-C", repoRoot(t), "release", "VERSION=" + version, "RELEASE_DIR=" + r.dir}
	if version != oldVersion {
		args = []string{"-C", repoRoot(t), "package", "VERSION=" + version, "RELEASE_DIR=" + r.dir, "PKG_ARCHES=amd64"}
	}
	// Two cross builds, nfpm and cyclonedx-gomod (installed once into bin/): minutes on a busy
	// 2-core machine.
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	start := time.Now()
	out, err := exec.CommandContext(ctx, "make", args...).CombinedOutput()
	if err != nil {
		r.err = &makeError{args: args, err: err, out: string(out)}
		t.Fatal(r.err)
	}
	t.Logf("make %s: %s", strings.Join(args[2:], " "), time.Since(start).Round(time.Second))
	return r.dir
}

type makeError struct {
	args []string
	err  error
	out  string
}

func (e *makeError) Error() string {
	return "make " + strings.Join(e.args, " ") + ": " + e.err.Error() + "\n" + e.out
}

func TestMain(m *testing.M) {
	code := m.Run()
	for _, r := range releases {
		if r.dir != "" {
			_ = os.RemoveAll(r.dir)
		}
	}
	os.Exit(code)
}

// debFile and rpmFile are the packages' file names as nfpm writes them.
func debFile(dir, version, arch string) string {
	return filepath.Join(dir, "podgate_"+strings.TrimPrefix(version, "v")+"-1_"+arch+".deb")
}

func rpmFile(dir, version, arch string) string {
	return filepath.Join(dir, "podgate-"+strings.TrimPrefix(version, "v")+"-1."+rpmArch[arch]+".rpm")
}

// run runs a command and returns its standard output; it fails the test on a non-zero exit.
func run(t testing.TB, name string, args ...string) string {
	t.Helper()
	cmd := exec.CommandContext(context.Background(), name, args...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s%s", name, strings.Join(args, " "), err, out, stderr.String())
	}
	return string(out)
}

// lines splits a command's output into its non-empty lines.
func lines(out string) []string {
	var ls []string
	for l := range strings.SplitSeq(out, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			ls = append(ls, l)
		}
	}
	return ls
}
