package monitoring

import (
	"bytes"
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/model"
	"go.yaml.in/yaml/v3"

	"github.com/podgate/podgate/test/testfs"
)

// TestShippedFilesAreGenerated: the rule files and the dashboard in deploy/monitoring are
// what the generator makes of the defaults (`go run ./deploy/monitoring/gen` after a change).
func TestShippedFilesAreGenerated(t *testing.T) {
	files, err := Default().Files()
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range slices.Sorted(maps.Keys(files)) {
		got, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, files[name]) {
			t.Errorf("%s differs from what the generator makes: run go run ./deploy/monitoring/gen and commit it", name)
		}
	}
}

// TestAlertsAreComplete: every alert has a known severity, a summary and a description naming
// the node, and a runbook_url whose fragment is a heading of docs/runbook.md; names are unique.
func TestAlertsAreComplete(t *testing.T) {
	anchors := testfs.MarkdownAnchors(t, filepath.Join("..", "..", "docs", "runbook.md"))
	cfg := Default()
	seen := map[string]bool{}
	for _, r := range cfg.AlertRules().Groups[0].Rules {
		t.Run(r.Alert, func(t *testing.T) {
			if seen[r.Alert] {
				t.Errorf("alert %s twice", r.Alert)
			}
			seen[r.Alert] = true
			if s := r.Labels["severity"]; !slices.Contains([]string{SeverityCritical, SeverityWarning, SeverityInfo}, s) {
				t.Errorf("severity %q", s)
			}
			for _, a := range []string{"summary", "description"} {
				if !strings.Contains(r.Annotations[a], "{{ $labels.instance }}") {
					t.Errorf("%s %q does not name the node ({{ $labels.instance }})", a, r.Annotations[a])
				}
			}
			url := r.Annotations["runbook_url"]
			base, anchor, ok := strings.Cut(url, "#")
			if !ok || base != cfg.RunbookURL || !anchors[anchor] {
				t.Errorf("runbook_url %s: want %s#<a heading of docs/runbook.md>", url, cfg.RunbookURL)
			}
		})
	}
	if len(seen) < 12 {
		t.Errorf("%d alerts, want the 14 of docs/runbook.md's Alerts", len(seen))
	}
}

// TestConfig: a config file changes what it names and keeps the defaults of the rest; unknown
// keys and unusable values are refused; the rules and dashboard follow the parameters.
func TestConfig(t *testing.T) {
	for _, tt := range []struct {
		name, file string
		want       func(Config) Config
		wantErr    string
	}{
		{name: "empty", file: "", want: func(c Config) Config { return c }},
		{name: "thresholds", file: "eventWindow: 30s\nbackendDownFor: 2s\nnodeLabel: node\nrestarts: 5\n", want: func(c Config) Config {
			c.EventWindow, c.BackendDownFor, c.NodeLabel, c.Restarts = model.Duration(30*time.Second), model.Duration(2*time.Second), "node", 5
			return c
		}},
		{name: "unknown key", file: "eventwindow: 30s\n", wantErr: "field eventwindow not found"},
		{name: "bad label", file: "nodeLabel: node-name\n", wantErr: `nodeLabel "node-name" is not a label name`},
		{name: "bad duration", file: "eventWindow: ten\n", wantErr: "not a valid duration"},
		{name: "bad ratio", file: "criErrorRatio: 2\n", wantErr: "criErrorRatio 2"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "m.yaml")
			if err := os.WriteFile(path, []byte(tt.file), 0o644); err != nil {
				t.Fatal(err)
			}
			got, err := LoadConfig(path)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("LoadConfig: %v, want an error with %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if want := tt.want(Default()); got != want {
				t.Errorf("LoadConfig = %+v, want %+v", got, want)
			}
		})
	}
}

// TestParametersReachTheRules: the node label and the windows of a Config are what the rules
// and the dashboard use.
func TestParametersReachTheRules(t *testing.T) {
	cfg := Default()
	cfg.NodeLabel, cfg.EventWindow, cfg.BackendDownFor = "node", model.Duration(30*time.Second), model.Duration(2*time.Second)
	cfg.Selector = `job="pg", cluster="c1"`
	files, err := cfg.Files()
	if err != nil {
		t.Fatal(err)
	}
	var alerts RuleFile
	if err := yaml.Unmarshal(files[AlertsFile], &alerts); err != nil {
		t.Fatal(err)
	}
	for _, r := range alerts.Groups[0].Rules {
		if strings.Contains(r.Expr, "instance") || strings.Contains(r.Annotations["summary"], "instance") {
			t.Errorf("%s still names instance: %s", r.Alert, r.Expr)
		}
		if !strings.Contains(r.Expr, `{job="pg", cluster="c1"`) {
			t.Errorf("%s does not select job=pg, cluster=c1: %s", r.Alert, r.Expr)
		}
		switch r.Alert {
		case "PodgateBackendDown":
			if r.For != "2s" {
				t.Errorf("PodgateBackendDown for %q, want 2s", r.For)
			}
		case "PodgateImagePullStalled":
			if !strings.Contains(r.Expr, "[30s]") || strings.Contains(r.Expr, "[10m]") {
				t.Errorf("PodgateImagePullStalled does not use the 30s window: %s", r.Expr)
			}
		}
	}
	var rules RuleFile
	if err := yaml.Unmarshal(files[RulesFile], &rules); err != nil {
		t.Fatal(err)
	}
	for _, r := range rules.Groups[0].Rules {
		if !strings.HasPrefix(r.Record, "node_") || !strings.Contains(r.Expr, "by (node, job, cluster,") {
			t.Errorf("recording rule %s: %s; want it by node, keeping job and cluster", r.Record, r.Expr)
		}
	}
	var dash struct {
		Templating struct {
			List []struct {
				Name  string `json:"name"`
				Query any    `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(files[DashboardFile], &dash); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, v := range dash.Templating.List {
		if v.Name == "node" {
			found = true
			if q, _ := json.Marshal(v.Query); !strings.Contains(string(q), `label_values(podgate_build_info{job=\"pg\", cluster=\"c1\"}, node)`) {
				t.Errorf("node selector query %s, want label_values of the node label", q)
			}
		}
	}
	if !found {
		t.Error("the dashboard has no node selector")
	}
}
