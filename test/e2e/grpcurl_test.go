package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
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

// readmePodResourcesSocket is the socket path the README's grpcurl commands use: podgate's default.
const readmePodResourcesSocket = "/var/lib/kubelet/pod-resources/podgate.sock"

// readmeCommand is one "$ command" of a README console block and the output shown under it.
type readmeCommand struct {
	line   string
	output string
}

// TestGrpcurlCommandsOfReadme runs the grpcurl commands of docs/podresources.md (once the
// README's PodResources section), as written there, against a real podgate with a real pod, and checks that the README shows
// what they print: list and describe byte for byte, a Get's JSON with the same fields.
func TestGrpcurlCommandsOfReadme(t *testing.T) {
	grpcurl := filepath.Join(rig.InstallDir(), "bin", "grpcurl")
	if _, err := os.Stat(grpcurl); err != nil {
		t.Skipf("grpcurl is not installed (%v): run `make rig` (test/rig/install.sh builds it) as root", err)
	}
	cmds := readmeConsole(t, filepath.Join("..", "..", "docs", "podresources.md"), "## PodResources", "$ grpcurl ")
	n := startNode(t, "--config", writeConfig(t, "sysctls:\n  podDefaults: {net.ipv4.tcp_keepalive_time: \"600\"}\n"))
	if _, err := n.through.Runtime.RunPodSandbox(t.Context(), &runtimeapi.PodSandboxConfig{
		Metadata: &runtimeapi.PodSandboxMetadata{Name: "web", Namespace: "default", Uid: "0c2d9a4e-5b8f-4a43-9d1e-2f6a7c1b3e55"},
		Linux:    &runtimeapi.LinuxPodSandboxConfig{Sysctls: map[string]string{"net.ipv4.ip_unprivileged_port_start": "80"}},
	}, ""); err != nil {
		t.Fatal(err)
	}
	for _, c := range cmds {
		if !strings.Contains(c.line, readmePodResourcesSocket) {
			t.Errorf("README command %q does not use podgate's default socket %s", c.line, readmePodResourcesSocket)
			continue
		}
		args, err := shellFields(strings.ReplaceAll(strings.TrimPrefix(c.line, "$ "), readmePodResourcesSocket, n.podgate.PodResourcesSocket))
		if err != nil {
			t.Fatalf("%s: %v", c.line, err)
		}
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		out, err := exec.CommandContext(ctx, grpcurl, args[1:]...).CombinedOutput()
		cancel()
		t.Logf("%s\n%s", c.line, out)
		if err != nil {
			t.Errorf("%s: %v\n%s", c.line, err, out)
			continue
		}
		if slices.Contains(args, "list") || slices.Contains(args, "describe") {
			if string(out) != c.output {
				t.Errorf("README shows under %q:\n%s\ngrpcurl printed:\n%s", c.line, c.output, out)
			}
			continue
		}
		want, got := jsonFields(t, c.output), jsonFields(t, string(out))
		if !slices.Equal(want, got) {
			t.Errorf("README's output of %q has the fields %v; grpcurl printed %v:\n%s", c.line, want, got, out)
		}
	}
}

// readmeConsole returns the commands starting with prefix, and their outputs, of the ```console
// blocks of the README's section.
func readmeConsole(t *testing.T, readme, section, prefix string) []readmeCommand {
	t.Helper()
	f, err := os.Open(readme)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var (
		cmds               []readmeCommand
		inSection, inBlock bool
		cur                *readmeCommand
	)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		l := sc.Text()
		switch {
		case strings.HasPrefix(l, "## "):
			inSection = l == section
		case !inSection:
		case !inBlock && l == "```console":
			inBlock = true
		case inBlock && l == "```":
			inBlock, cur = false, nil
		case inBlock && strings.HasPrefix(l, "$ "):
			cur = nil
			if strings.HasPrefix(l, prefix) {
				cmds = append(cmds, readmeCommand{line: l})
				cur = &cmds[len(cmds)-1]
			}
		case inBlock && cur != nil:
			cur.output += l + "\n"
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(cmds) == 0 {
		t.Fatalf("%s: no %q commands in a ```console block of its %q section", readme, prefix, section)
	}
	return cmds
}

// shellFields splits a command line as the shell would for the README's commands: words
// separated by spaces, single quotes keeping what they hold as one word.
func shellFields(s string) ([]string, error) {
	var (
		out    []string
		word   strings.Builder
		quoted bool
		inWord bool
	)
	for _, r := range s {
		switch {
		case r == '\'':
			quoted, inWord = !quoted, true
		case r == ' ' && !quoted:
			if inWord {
				out = append(out, word.String())
				word.Reset()
				inWord = false
			}
		default:
			word.WriteRune(r)
			inWord = true
		}
	}
	if quoted {
		return nil, errUnclosedQuote
	}
	if inWord {
		out = append(out, word.String())
	}
	return out, nil
}

var errUnclosedQuote = errors.New("unclosed single quote")

// jsonFields returns the paths of every field of a JSON document, sorted.
func jsonFields(t *testing.T, doc string) []string {
	t.Helper()
	var v any
	if err := json.Unmarshal([]byte(doc), &v); err != nil {
		t.Fatalf("not JSON (%v):\n%s", err, doc)
	}
	var out []string
	var walk func(prefix string, v any)
	walk = func(prefix string, v any) {
		switch x := v.(type) {
		case map[string]any:
			for k, e := range x {
				p := prefix + "." + k
				out = append(out, p)
				walk(p, e)
			}
		case []any:
			for _, e := range x {
				walk(prefix+"[]", e)
			}
		}
	}
	walk("", v)
	slices.Sort(out)
	return slices.Compact(out)
}
