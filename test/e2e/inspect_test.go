package e2e

import (
	"bytes"
	"errors"
	"os/exec"
	"strings"
	"testing"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// TestInspectCommands runs podgate pods, podgate pod and podgate pulls, the podgate binary
// itself, against a running podgate with a pod started through it on the rig's containerd:
// the tables show the pod, -o yaml and -o json the extension's messages, and bad input gets a
// clear message and exit status 1 (podgate cannot answer, or does not know the pod) or 2
// (usage).
func TestInspectCommands(t *testing.T) {
	n := startNode(t)
	if _, err := n.through.Runtime.RunPodSandbox(t.Context(), &runtimeapi.PodSandboxConfig{
		Metadata: &runtimeapi.PodSandboxMetadata{Name: "web", Namespace: "default", Uid: "5e3b1c2a-8f9d-4b6e-a7c0-1d2e3f4a5b6c"},
	}, ""); err != nil {
		t.Fatal(err)
	}
	sock := n.podgate.PodResourcesSocket
	run := func(args ...string) (string, string, int) {
		t.Helper()
		cmd := exec.CommandContext(t.Context(), podgateBin, args...)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		var exit *exec.ExitError
		switch {
		case errors.As(err, &exit):
			return stdout.String(), stderr.String(), exit.ExitCode()
		case err != nil:
			t.Fatal(err)
		}
		return stdout.String(), stderr.String(), 0
	}
	tests := []struct {
		name   string
		args   []string
		code   int
		stdout []string
		stderr string
	}{
		{"pods", []string{"pods", "--socket", sock}, 0, []string{"NAMESPACE   NAME   SANDBOX", "default     web    ", "Ready"}, ""},
		{"pods yaml", []string{"pods", "--socket", sock, "-o", "yaml"}, 0, []string{"pods:", "name: web", "state: READY"}, ""},
		{"pod", []string{"pod", "default/web", "--socket", sock}, 0, []string{"Name:", "web", "Namespace:", "default", "State:", "Ready", "Image pulls:"}, ""},
		{"pod json", []string{"pod", "default/web", "--socket", sock, "-o", "json"}, 0, []string{"{\n  \"uid\": \"5e3b1c2a-8f9d-4b6e-a7c0-1d2e3f4a5b6c\",\n", "\n  \"sandbox\": {\n    \"id\": "}, ""},
		{"pulls, none", []string{"pulls", "--socket", sock}, 0, []string{"POD   IMAGE   STATE   PLACE   WAITING FOR"}, ""},
		{"unknown pod", []string{"pod", "default/nope", "--socket", sock}, 1, nil, "podgate: pod default/nope: not known to podgate"},
		{"bad output", []string{"pulls", "--socket", sock, "-o", "wide"}, 2, nil, `invalid output format "wide": want table, json or yaml`},
		{"not a pod", []string{"pod", "web", "--socket", sock}, 2, nil, `"web": want NAMESPACE/NAME`},
		{"no podgate there", []string{"pods", "--socket", sock + ".none"}, 1, nil, "cannot reach podgate at " + sock + ".none"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			stdout, stderr, code := run(tt.args...)
			if code != tt.code {
				t.Errorf("podgate %s: exit status %d, want %d; stderr %q", strings.Join(tt.args, " "), code, tt.code, stderr)
			}
			for _, want := range tt.stdout {
				if !strings.Contains(stdout, want) {
					t.Errorf("podgate %s: output lacks %q:\n%s", strings.Join(tt.args, " "), want, stdout)
				}
			}
			if !strings.Contains(stderr, tt.stderr) {
				t.Errorf("podgate %s: stderr %q, want %q", strings.Join(tt.args, " "), stderr, tt.stderr)
			}
		})
	}
}
