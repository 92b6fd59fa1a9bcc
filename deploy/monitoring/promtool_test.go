package monitoring

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/common/model"
	"go.yaml.in/yaml/v3"
)

// promtool is Prometheus' rule checker (Debian's prometheus package; test/rig/install.sh installs
// it); tests that need it skip without it.
func promtool(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("promtool not found: install Debian's prometheus package (test/rig/install.sh tools does)")
	}
	return p
}

func run(t *testing.T, name string, args ...string) {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Errorf("%s %v: %v\n%s", filepath.Base(name), args, err, out)
	}
}

// TestPromtoolCheckRules: promtool accepts the shipped rule files, and the files a changed
// configuration makes.
func TestPromtoolCheckRules(t *testing.T) {
	p := promtool(t)
	run(t, p, "check", "rules", AlertsFile, RulesFile)
	cfg := Default()
	cfg.NodeLabel, cfg.EventWindow, cfg.BackendDownFor, cfg.EvaluationInterval = "node", model.Duration(30*time.Second), 0, model.Duration(time.Second)
	files, err := cfg.Files()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for _, name := range []string{AlertsFile, RulesFile} {
		if err := os.WriteFile(filepath.Join(dir, name), files[name], 0o644); err != nil {
			t.Fatal(err)
		}
	}
	run(t, p, "check", "rules", filepath.Join(dir, AlertsFile), filepath.Join(dir, RulesFile))
}

// TestPromtoolTestRules: promtool test rules testdata/alerts.test.yaml passes: for each alert,
// series that fire it and a healthy node that stays silent.
func TestPromtoolTestRules(t *testing.T) {
	run(t, promtool(t), "test", "rules", filepath.Join("testdata", "alerts.test.yaml"))
}

// TestEveryAlertHasAUnitTest: testdata/alerts.test.yaml expects each alert to fire somewhere
// and checks each on the healthy node.
func TestEveryAlertHasAUnitTest(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("testdata", "alerts.test.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var tests struct {
		Tests []struct {
			Name       string `yaml:"name"`
			AlertTests []struct {
				Alert string `yaml:"alertname"`
				Exp   []any  `yaml:"exp_alerts"`
			} `yaml:"alert_rule_test"`
		} `yaml:"tests"`
	}
	if err := yaml.Unmarshal(b, &tests); err != nil {
		t.Fatal(err)
	}
	fires, silent := map[string]bool{}, map[string]bool{}
	for _, tc := range tests.Tests {
		for _, at := range tc.AlertTests {
			if len(at.Exp) > 0 {
				fires[at.Alert] = true
			} else if tc.Name == "A healthy node: no alert" {
				silent[at.Alert] = true
			}
		}
	}
	for _, a := range Default().Alerts() {
		if !fires[a.Name] || !silent[a.Name] {
			t.Errorf("%s: a test firing it %v, silent on the healthy node %v; want both", a.Name, fires[a.Name], silent[a.Name])
		}
	}
}
