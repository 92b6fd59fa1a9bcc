package e2e

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podgate/podgate/test/rig"
)

// readmeSocket is the socket path the README's commands use: podgate's default.
const readmeSocket = "unix:///run/podgate/cri.sock"

// TestCrictlCommandsOfReadme runs the crictl lines of the README's "Debugging" section, as
// written there, against a real podgate: what the README tells people to type must work.
func TestCrictlCommandsOfReadme(t *testing.T) {
	crictl := filepath.Join(rig.InstallDir(), "bin", "crictl")
	if _, err := os.Stat(crictl); err != nil {
		t.Skipf("crictl is not installed (%v): run `make rig` (test/rig/install.sh builds it) as root", err)
	}
	lines := readmeCrictlLines(t, filepath.Join("..", "..", "README.md"))
	// An empty config file of its own, so that a /etc/crictl.yaml on this machine does not count.
	config := filepath.Join(t.TempDir(), "crictl.yaml")
	if err := os.WriteFile(config, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	n := startNode(t)
	// A pod, so that `pods` has something to show.
	if _, err := n.through.Runtime.RunPodSandbox(t.Context(), &runtimeapi.PodSandboxConfig{
		Metadata: &runtimeapi.PodSandboxMetadata{Name: "crictl-pod", Namespace: "e2e", Uid: "uid-crictl-1"},
		Linux:    &runtimeapi.LinuxPodSandboxConfig{},
	}, ""); err != nil {
		t.Fatal(err)
	}

	// What some subcommands must show: containerd behind podgate, the pod, a rig image.
	want := map[string]string{"version": "containerd", "pods": "crictl-pod", "images": rig.BusyboxImage}
	for _, line := range lines {
		if !strings.Contains(line, readmeSocket) {
			t.Errorf("README line %q does not use podgate's default socket %s", line, readmeSocket)
			continue
		}
		args := strings.Fields(strings.ReplaceAll(line, readmeSocket, n.podgate.Endpoint))[1:]
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		cmd := exec.CommandContext(ctx, crictl, args...)
		cmd.Env = append(os.Environ(), "CRI_CONFIG_FILE="+config)
		out, err := cmd.CombinedOutput()
		cancel()
		if err != nil {
			t.Errorf("%s: %v\n%s", line, err, out)
			continue
		}
		t.Logf("%s:\n%s", line, out)
		sub := args[slices.Index(args, n.podgate.Endpoint)+1:] // the subcommand and its flags
		if len(sub) == 0 {
			continue
		}
		if w, ok := want[sub[0]]; ok && !containsField(string(out), w) {
			t.Errorf("%s does not show %s:\n%s", line, w, out)
		}
	}
}

// readmeCrictlLines returns the lines starting with "crictl " of the first ```sh block of the
// README's "## Debugging" section.
func readmeCrictlLines(t *testing.T, readme string) []string {
	t.Helper()
	f, err := os.Open(readme)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var (
		lines                      []string
		inSection, inBlock, closed bool
	)
	sc := bufio.NewScanner(f)
	for sc.Scan() && !closed {
		l := sc.Text()
		switch {
		case strings.HasPrefix(l, "## "):
			if inSection {
				closed = true
			}
			inSection = l == "## Debugging"
		case !inSection:
		case !inBlock && l == "```sh":
			inBlock = true
		case inBlock && l == "```":
			closed = true
		case inBlock && strings.HasPrefix(l, "crictl "):
			lines = append(lines, strings.TrimSpace(l))
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(lines) == 0 {
		t.Fatalf("%s: no crictl lines in a ```sh block of its \"## Debugging\" section", readme)
	}
	return lines
}

// containsField reports whether want is one of out's whitespace-separated fields, or, for an
// image reference name:tag, the name and tag are two fields of one line (crictl images' columns).
func containsField(out, want string) bool {
	name, tag, _ := strings.Cut(want, ":")
	for l := range strings.Lines(out) {
		f := strings.Fields(l)
		if slices.Contains(f, want) || tag != "" && slices.Contains(f, name) && slices.Contains(f, tag) {
			return true
		}
	}
	return false
}
