package promql

import (
	"encoding/json"
	"flag"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
	"go.yaml.in/yaml/v3"
)

var update = flag.Bool("update", false, "rewrite deploy/monitoring/testdata/metrics.txt")

var (
	root       = filepath.Join("..", "..")
	monitoring = filepath.Join(root, "deploy", "monitoring")
	// metricsList is the series the rules and the dashboard read, one a line: the end-to-end
	// test (test/e2e) finds each in a live scrape.
	metricsList = filepath.Join(monitoring, "testdata", "metrics.txt")
)

// query is one PromQL expression of the monitoring files, and where it is.
type query struct{ where, expr string }

// grafanaVars are the dashboard's variables and Grafana's own, with values that make the
// queries plain PromQL.
var grafanaVars = strings.NewReplacer("$__rate_interval", "5m", "$__range", "3h", "$node", ".*", "${node}", ".*")

func ruleQueries(t *testing.T, file string) (qs []query, recorded []string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(monitoring, file))
	if err != nil {
		t.Fatal(err)
	}
	var rf struct {
		Groups []struct {
			Rules []struct {
				Alert, Record, Expr string
			}
		}
	}
	if err := yaml.Unmarshal(b, &rf); err != nil {
		t.Fatal(err)
	}
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			qs = append(qs, query{file + " " + r.Alert + r.Record, r.Expr})
			if r.Record != "" {
				recorded = append(recorded, r.Record)
			}
		}
	}
	return qs, recorded
}

var labelValues = regexp.MustCompile(`^label_values\((.*), *[a-zA-Z_][a-zA-Z0-9_]*\)$`)

func dashboardQueries(t *testing.T) []query {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(monitoring, "podgate-dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Title   string `json:"title"`
			Type    string `json:"type"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Name  string          `json:"name"`
				Type  string          `json:"type"`
				Query json.RawMessage `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	var qs []query
	panels := 0
	for _, p := range d.Panels {
		if p.Type == "row" {
			continue
		}
		panels++
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			qs = append(qs, query{"dashboard panel " + p.Title, tg.Expr})
		}
	}
	if panels < 20 {
		t.Errorf("the dashboard has %d panels, want its 28", panels)
	}
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		var q string
		if err := json.Unmarshal(v.Query, &q); err != nil {
			t.Errorf("variable %s: query %s: %v", v.Name, v.Query, err)
			continue
		}
		m := labelValues.FindStringSubmatch(q)
		if m == nil {
			t.Errorf("variable %s: query %q is not label_values(SELECTOR, LABEL)", v.Name, q)
			continue
		}
		qs = append(qs, query{"dashboard variable " + v.Name, m[1]})
	}
	return qs
}

// names are the metric names a parsed expression selects.
func names(e parser.Expr) []string {
	var out []string
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		vs, ok := n.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		if vs.Name != "" {
			out = append(out, vs.Name)
		}
		for _, m := range vs.LabelMatchers {
			if m.Name == labels.MetricName && m.Type == labels.MatchEqual && vs.Name == "" {
				out = append(out, m.Value)
			}
		}
		return nil
	})
	return out
}

// documented are the series docs/metrics.md lists: the first column of its tables.
func documented(t *testing.T) map[string]bool {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "docs", "metrics.md"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, m := range regexp.MustCompile("(?m)^\\| `([a-zA-Z_:][a-zA-Z0-9_:]*)` \\|").FindAllStringSubmatch(string(b), -1) {
		out[m[1]] = true
	}
	if len(out) < 50 {
		t.Fatalf("found %d series in docs/metrics.md's tables, want its many: is the pattern still right?", len(out))
	}
	return out
}

// family is a histogram's name for its _bucket, _sum and _count series.
func family(name string, doc map[string]bool) string {
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, suffix); ok && doc[base] {
			return base
		}
	}
	return name
}

// TestQueriesParseAndNameDocumentedSeries: every query of the alerting and recording rules and
// of the dashboard (its panels and its node selector) parses with Prometheus' parser; each
// series it names is in docs/metrics.md or recorded by podgate-rules.yaml; and
// testdata/metrics.txt lists them (go test -update rewrites it), for the live check.
func TestQueriesParseAndNameDocumentedSeries(t *testing.T) {
	alerts, _ := ruleQueries(t, "podgate-alerts.yaml")
	rules, recorded := ruleQueries(t, "podgate-rules.yaml")
	qs := append(append(alerts, rules...), dashboardQueries(t)...)
	doc := documented(t)
	used := map[string]bool{}
	for _, q := range qs {
		e, err := parser.NewParser(parser.Options{}).ParseExpr(grafanaVars.Replace(q.expr))
		if err != nil {
			t.Errorf("%s: %v\n%s", q.where, err, q.expr)
			continue
		}
		if strings.Contains(q.where, "dashboard") && strings.Contains(q.expr, "[5m]") {
			t.Errorf("%s: a fixed 5m range; want $__rate_interval: %s", q.where, q.expr)
		}
		for _, n := range names(e) {
			switch {
			case slices.Contains(recorded, n):
			case doc[family(n, doc)]:
				used[n] = true
			default:
				t.Errorf("%s names %s, which docs/metrics.md does not list", q.where, n)
			}
		}
	}
	for _, r := range recorded {
		if !slices.ContainsFunc(qs, func(q query) bool {
			return !strings.HasPrefix(q.where, "podgate-rules.yaml") && strings.Contains(q.expr, r)
		}) {
			t.Errorf("recording rule %s: no alert or panel reads it", r)
		}
	}
	list := strings.Join(slices.Sorted(maps.Keys(used)), "\n") + "\n"
	if *update {
		if err := os.WriteFile(metricsList, []byte(list), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if b, err := os.ReadFile(metricsList); err != nil || string(b) != list {
		t.Errorf("%s is not the series the queries name (go test -update rewrites it); want:\n%s", metricsList, list)
	}
	t.Logf("%d queries, %d series", len(qs), len(used))
}
