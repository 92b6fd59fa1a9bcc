package agent

import (
	"os"
	"os/user"
	"path/filepath"
	"strings"
	"testing"

	"github.com/podgate/podgate/agent/config"
	"github.com/podgate/podgate/cri/registry"
)

const checkKubeconfigYAML = `apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: "https://127.0.0.1:1", insecure-skip-tls-verify: true}
users:
- name: u
  user: {token: t}
contexts:
- name: x
  context: {cluster: c, user: u}
current-context: x
`

// missingGID is a group id no group on this machine has.
func missingGID(t *testing.T) string {
	t.Helper()
	for _, g := range []string{"2147483646", "987654321", "55555"} {
		if _, err := user.LookupGroupId(g); err != nil {
			return g
		}
	}
	t.Skip("every candidate gid exists on this machine")
	return ""
}

func writeCheckFile(t *testing.T, dir, name, body string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// Check refuses what start-up would refuse, naming the key; it accepts what start-up accepts.
func TestCheckConfiguration(t *testing.T) {
	dir := t.TempDir()
	goodKubeconfig := writeCheckFile(t, dir, "kubeconfig", checkKubeconfigYAML)
	garbageKubeconfig := writeCheckFile(t, dir, "garbage", "{this is: [not a kubeconfig\n")
	damaged := filepath.Join(dir, "damaged")
	if err := os.Mkdir(damaged, 0o700); err != nil {
		t.Fatal(err)
	}
	damagedFile := writeCheckFile(t, damaged, registry.CheckpointFile, "{not json")
	good := filepath.Join(dir, "good")
	if err := os.Mkdir(good, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := registry.NewCheckpoint(good).Write(registry.CheckpointData{}); err != nil {
		t.Fatal(err)
	}
	notDir := writeCheckFile(t, dir, "file", "")
	gid := missingGID(t)

	for _, tc := range []struct {
		name string
		edit func(*config.Configuration)
		want []string // each must be in the error; none: no error
	}{
		{name: "defaults", edit: func(*config.Configuration) {}},
		{name: "group name", edit: func(c *config.Configuration) { c.CRISocketGroup = "root" }},
		{name: "group id", edit: func(c *config.Configuration) { c.CRISocketGroup = "0" }},
		{name: "unknown group name", edit: func(c *config.Configuration) { c.CRISocketGroup = "podgate-no-such-group" },
			want: []string{`criSocketGroup: group "podgate-no-such-group": not found`}},
		{name: "unknown group id", edit: func(c *config.Configuration) { c.CRISocketGroup = gid },
			want: []string{`criSocketGroup: group "` + gid + `": not found`}},
		{name: "kubeconfig", edit: func(c *config.Configuration) { c.Kubeconfig = goodKubeconfig }},
		{name: "missing kubeconfig", edit: func(c *config.Configuration) { c.Kubeconfig = filepath.Join(dir, "nonexistent") },
			want: []string{"kubeconfig: ", "nonexistent"}},
		{name: "garbage kubeconfig", edit: func(c *config.Configuration) { c.Kubeconfig = garbageKubeconfig },
			want: []string{"kubeconfig: ", garbageKubeconfig}},
		{name: "missing stateDir", edit: func(c *config.Configuration) { c.StateDir = filepath.Join(dir, "nonexistent") }},
		{name: "stateDir with a checkpoint", edit: func(c *config.Configuration) { c.StateDir = good }},
		{name: "stateDir a file", edit: func(c *config.Configuration) { c.StateDir = notDir },
			want: []string{"stateDir: ", "not a directory"}},
		{name: "damaged checkpoint", edit: func(c *config.Configuration) { c.StateDir = damaged },
			want: []string{"stateDir: ", damagedFile, "damaged"}},
		{name: "every error", edit: func(c *config.Configuration) {
			c.CRISocketGroup = "podgate-no-such-group"
			c.Kubeconfig = garbageKubeconfig
			c.StateDir = damaged
			c.RuntimeEndpoint = "tcp://x:1"
		}, want: []string{"criSocketGroup: ", "kubeconfig: ", "stateDir: ", "runtimeEndpoint: "}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := config.DefaultConfiguration()
			c.StateDir = filepath.Join(dir, "fresh") // the default may exist on the test machine
			tc.edit(c)
			err := Check(c)
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("Check: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Check: no error, want %q", tc.want)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Check: %v\nwant it to say %q", err, w)
				}
			}
		})
	}
}
