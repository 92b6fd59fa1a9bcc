package agent

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/podgate/podgate/agent/config"
	"github.com/podgate/podgate/cri/registry"
)

func writeCheckFile(t *testing.T, dir, name, body string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// Check refuses what start-up would refuse, naming the key; it accepts what start-up accepts.
// Each check is tested where it is written (cri's socket group, agent/kube's kubeconfig,
// cri/registry's state directory, config's and the features' sections); here, that Check runs
// them all and reports every error, and reads the checkpoint's sections as start-up does.
func TestCheckConfiguration(t *testing.T) {
	dir := t.TempDir()
	garbageKubeconfig := writeCheckFile(t, dir, "garbage", "{this is: [not a kubeconfig\n")
	damaged, good := filepath.Join(dir, "damaged"), filepath.Join(dir, "good")
	for _, d := range []string{damaged, good} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	damagedFile := writeCheckFile(t, damaged, registry.CheckpointFile, "{not json")
	if err := registry.NewCheckpoint(good).Write(registry.CheckpointData{}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		edit func(*config.Configuration)
		want []string // each must be in the error; none: no error
	}{
		{name: "defaults", edit: func(*config.Configuration) {}},
		{name: "stateDir with a checkpoint", edit: func(c *config.Configuration) { c.StateDir = good }},
		{name: "every error", edit: func(c *config.Configuration) {
			c.CRISocketGroup = "podgate-no-such-group"
			c.Kubeconfig = garbageKubeconfig
			c.StateDir = damaged
			c.RuntimeEndpoint = "tcp://x:1"
		}, want: []string{`criSocketGroup: group "podgate-no-such-group": not found`, "kubeconfig: " + garbageKubeconfig,
			"stateDir: checkpoint " + damagedFile + " is damaged", "runtimeEndpoint: "}},
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
			for _, w := range tc.want {
				if err == nil || !strings.Contains(err.Error(), w) {
					t.Errorf("Check: %v\nwant it to say %q", err, w)
				}
			}
		})
	}
}
