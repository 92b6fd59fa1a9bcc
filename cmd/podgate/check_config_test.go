package main

import (
	"bytes"
	"os"
	"os/user"
	"path/filepath"
	"strings"
	"testing"

	"github.com/podgate/podgate/agent/registry"
)

// podgate check-config refuses, with exit status 1 and the key named, what would stop podgate at
// start-up though the file's values are well formed.
func TestCheckConfigResolvesStartUp(t *testing.T) {
	dir := t.TempDir()
	garbage := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(garbage, []byte("{this is: [not a kubeconfig\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	stateDir := filepath.Join(dir, "state")
	if err := os.Mkdir(stateDir, 0o700); err != nil {
		t.Fatal(err)
	}
	checkpoint := filepath.Join(stateDir, registry.CheckpointFile)
	if err := os.WriteFile(checkpoint, []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	gid := ""
	for _, g := range []string{"2147483646", "987654321", "55555"} {
		if _, err := user.LookupGroupId(g); err != nil {
			gid = g
			break
		}
	}
	fresh := "stateDir: " + filepath.Join(dir, "fresh") + "\n"

	for _, tc := range []struct {
		name string
		body string
		code int
		want []string
	}{
		{name: "existing group", body: fresh + "criSocketGroup: root\n", code: 0, want: []string{": ok"}},
		{name: "existing gid", body: fresh + "criSocketGroup: \"0\"\n", code: 0, want: []string{": ok"}},
		{name: "unknown group", body: fresh + "criSocketGroup: podgate-no-such-group\n", code: 1,
			want: []string{`criSocketGroup: group "podgate-no-such-group": not found`}},
		{name: "unknown gid", body: fresh + "criSocketGroup: \"" + gid + "\"\n", code: 1,
			want: []string{`criSocketGroup: group "` + gid + `": not found`}},
		{name: "missing kubeconfig", body: fresh + "kubeconfig: " + filepath.Join(dir, "nonexistent") + "\n", code: 1,
			want: []string{"kubeconfig: ", "nonexistent"}},
		{name: "garbage kubeconfig", body: fresh + "kubeconfig: " + garbage + "\n", code: 1,
			want: []string{"kubeconfig: " + garbage}},
		{name: "damaged checkpoint", body: "stateDir: " + stateDir + "\n", code: 1,
			want: []string{"stateDir: ", checkpoint, "damaged"}},
		{name: "all at once", body: "stateDir: " + stateDir + "\nkubeconfig: " + garbage + "\ncriSocketGroup: podgate-no-such-group\n", code: 1,
			want: []string{"invalid:", "criSocketGroup: ", "kubeconfig: ", checkpoint}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if gid == "" && strings.Contains(tc.name, "gid") && tc.code != 0 {
				t.Skip("every candidate gid exists on this machine")
			}
			file := writeConfig(t, tc.body)
			var stdout, stderr bytes.Buffer
			code := run([]string{"check-config", file}, &stdout, &stderr)
			out := stdout.String() + stderr.String()
			if code != tc.code {
				t.Errorf("podgate check-config: exit %d, want %d; output:\n%s", code, tc.code, out)
			}
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("podgate check-config: output\n%s\nwant it to say %q", out, w)
				}
			}
		})
	}
}
