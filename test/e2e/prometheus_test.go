package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/common/model"

	"github.com/podgate/podgate/deploy/monitoring"
	"github.com/podgate/podgate/test/harness"
)

// promServer is Debian's Prometheus server on loopback, scraping the test's podgate (and
// containerd) every second and evaluating deploy/monitoring's rules every second.
type promServer struct {
	url string
	log *harness.SyncBuffer
}

// promNode is the value of the node label the test's Prometheus gives podgate's and
// containerd's series (both jobs carry it, as docs/monitoring.md asks of a real setup).
const promNode = "rig"

// promConfig is deploy/monitoring's configuration with the test's windows: seconds where a node
// has minutes, so that each alert fires and resolves within the test.
func promConfig() monitoring.Config {
	cfg := monitoring.Default()
	sec := func(n int) model.Duration { return model.Duration(time.Duration(n) * time.Second) }
	cfg.NodeLabel = "node"
	cfg.EvaluationInterval = sec(1)
	cfg.BackendDownFor, cfg.PodgateDownFor, cfg.PullQueuedFor, cfg.PeerVersionFor = sec(3), sec(5), sec(3), sec(3)
	cfg.EventWindow, cfg.RefusalWindow, cfg.RestartWindow, cfg.RateWindow = sec(20), sec(20), sec(60), sec(20)
	cfg.CRIErrorsFor = sec(10)
	return cfg
}

// startPrometheus starts Prometheus with cfg's rules, scraping targets (job → host:port); it
// stops at the test's end. It skips the test where Debian's prometheus package is missing.
func startPrometheus(t *testing.T, cfg monitoring.Config, targets map[string]string) *promServer {
	t.Helper()
	bin, err := exec.LookPath("prometheus")
	if err != nil {
		t.Skip("prometheus not found: install Debian's prometheus package (test/rig/install.sh tools installs it)")
	}
	dir := t.TempDir()
	files, err := cfg.Files()
	if err != nil {
		t.Fatal(err)
	}
	var ruleFiles []string
	for _, name := range []string{monitoring.RulesFile, monitoring.AlertsFile} {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, files[name], 0o644); err != nil {
			t.Fatal(err)
		}
		ruleFiles = append(ruleFiles, p)
	}
	conf := fmt.Sprintf("global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\nrule_files: [%q, %q]\nscrape_configs:\n", ruleFiles[0], ruleFiles[1])
	for job, target := range targets {
		conf += fmt.Sprintf("  - job_name: %s\n    static_configs:\n      - targets: [%q]\n        labels: {node: %s}\n", job, target, promNode)
		if job == "containerd" {
			conf += "    metrics_path: /v1/metrics\n" // containerd's
		}
	}
	confPath := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(confPath, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	p := &promServer{url: "http://" + addr, log: &harness.SyncBuffer{}}
	cmd := exec.Command(bin, "--config.file="+confPath, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr, "--storage.tsdb.retention.time=1h")
	cmd.Stdout, cmd.Stderr = p.log, p.log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }() // its exit shows in the log
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("prometheus log:\n%s", p.log)
		}
	})
	waitWithin(t, time.Minute, "prometheus ready", func() bool {
		resp, err := http.Get(p.url + "/-/ready")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	t.Logf("prometheus %s on %s, rules with %s windows", bin, addr, cfg.EventWindow)
	return p
}

// api GETs a Prometheus API path and decodes its data into out.
func (p *promServer) api(ctx context.Context, path string, out any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.url+path, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	var r struct {
		Status string          `json:"status"`
		Error  string          `json:"error"`
		Data   json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return fmt.Errorf("%s: %w: %s", path, err, b)
	}
	if r.Status != "success" {
		return fmt.Errorf("%s: %s", path, r.Error)
	}
	return json.Unmarshal(r.Data, out)
}

// promAlert is an alert as Prometheus' /api/v1/alerts shows it.
type promAlert struct {
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
	State       string            `json:"state"`
}

func (p *promServer) alerts(ctx context.Context) ([]promAlert, error) {
	var d struct {
		Alerts []promAlert `json:"alerts"`
	}
	err := p.api(ctx, "/api/v1/alerts", &d)
	return d.Alerts, err
}

// alert is the alert name whose labels include labels, and whether it is pending or firing.
func (p *promServer) alert(ctx context.Context, name string, labels map[string]string) (promAlert, bool) {
	as, err := p.alerts(ctx)
	if err != nil {
		return promAlert{}, false
	}
next:
	for _, a := range as {
		if a.Labels["alertname"] != name {
			continue
		}
		for k, v := range labels {
			if a.Labels[k] != v {
				continue next
			}
		}
		return a, true
	}
	return promAlert{}, false
}

// query runs an instant query and returns its vector's samples.
func (p *promServer) query(ctx context.Context, q string) ([]map[string]string, error) {
	var d struct {
		Result []struct {
			Metric map[string]string `json:"metric"`
		} `json:"result"`
	}
	if err := p.api(ctx, "/api/v1/query?query="+url.QueryEscape(q), &d); err != nil {
		return nil, err
	}
	out := make([]map[string]string, 0, len(d.Result))
	for _, r := range d.Result {
		out = append(out, r.Metric)
	}
	return out, nil
}

// waitScraped waits until Prometheus has scraped the job a few times.
func (p *promServer) waitScraped(t *testing.T, job string) {
	t.Helper()
	waitWithin(t, time.Minute, "prometheus scraping "+job, func() bool {
		r, err := p.query(t.Context(), fmt.Sprintf(`count_over_time(up{job=%q}[1m]) >= 3 and up{job=%q} == 1`, job, job))
		return err == nil && len(r) == 1
	})
}

// waitFiring waits until the alert fires (past its for:), and checks what it says: the node, a
// runbook_url into docs/runbook.md. It returns when it took.
func (p *promServer) waitFiring(t *testing.T, limit time.Duration, name string, labels map[string]string) time.Duration {
	t.Helper()
	start := time.Now()
	var a promAlert
	waitWithin(t, limit, name+" firing", func() bool {
		var ok bool
		a, ok = p.alert(t.Context(), name, labels)
		return ok && a.State == "firing"
	})
	took := time.Since(start)
	if a.Labels["node"] != promNode || !strings.Contains(a.Annotations["summary"], "podgate on "+promNode) ||
		!strings.HasSuffix(a.Annotations["runbook_url"], "docs/runbook.md#"+strings.ToLower(name)) {
		t.Errorf("%s: labels %v, annotations %v; want node %s named in the summary and its runbook section", name, a.Labels, a.Annotations, promNode)
	}
	t.Logf("%s firing %s after the cause: %s", name, took.Round(100*time.Millisecond), a.Annotations["summary"])
	return took
}

// waitResolved waits until the alert is neither pending nor firing.
func (p *promServer) waitResolved(t *testing.T, limit time.Duration, name string, labels map[string]string) {
	t.Helper()
	start := time.Now()
	waitWithin(t, limit, name+" resolved", func() bool {
		if _, err := p.alerts(t.Context()); err != nil {
			return false
		}
		_, active := p.alert(t.Context(), name, labels)
		return !active
	})
	t.Logf("%s resolved %s after the cause was gone", name, time.Since(start).Round(100*time.Millisecond))
}

// checkQuiet fails the test when the alert is pending or firing: before its cause.
func (p *promServer) checkQuiet(t *testing.T, name string) {
	t.Helper()
	if a, ok := p.alert(t.Context(), name, nil); ok {
		t.Errorf("%s is %s before its cause: %v", name, a.State, a.Labels)
	}
}

// hostPort is a harness URL's host:port.
func hostPort(rawURL string) string { return strings.TrimPrefix(rawURL, "http://") }

// freeAddr is a free loopback host:port, such as for containerd's metrics.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// checkNoAlerts fails the test when any alert is pending or firing: a healthy node.
func (p *promServer) checkNoAlerts(t *testing.T) {
	t.Helper()
	as, err := p.alerts(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range as {
		t.Errorf("on a healthy node, %s is %s: %v", a.Labels["alertname"], a.State, a.Annotations["summary"])
	}
}

// checkLiveSeries: every series deploy/monitoring's rules and dashboard read (its
// testdata/metrics.txt, which test/promql keeps equal to the queries) is in Prometheus, scraped
// from this node, but those absentHere names with the reason they cannot be here.
func (p *promServer) checkLiveSeries(t *testing.T, absentHere map[string]string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "deploy", "monitoring", "testdata", "metrics.txt"))
	if err != nil {
		t.Fatal(err)
	}
	// Every name Prometheus stored since it started, gauges that came and went included.
	var names []string
	if err := p.api(t.Context(), "/api/v1/label/__name__/values?match[]="+url.QueryEscape(`{job=~"podgate|containerd"}`), &names); err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{"up": true} // Prometheus' own, queried by waitScraped
	for _, n := range names {
		seen[n] = true
	}
	var found, absent []string
	for _, name := range strings.Fields(string(b)) {
		switch why, ok := absentHere[name]; {
		case seen[name]:
			found = append(found, name)
		case ok:
			absent = append(absent, name+" ("+why+")")
		default:
			t.Errorf("%s: the monitoring files read it, Prometheus did not scrape it from podgate or containerd", name)
		}
	}
	t.Logf("series of the rules and dashboard in the live scrape: %d; not here: %s", len(found), strings.Join(absent, "; "))
}

// checkDashboardQueries runs every panel query of the dashboard cfg makes against Prometheus
// (Grafana's variables replaced as Grafana would: the rate interval, All nodes): each must be
// a query Prometheus accepts, and it logs those that found series on this node.
func (p *promServer) checkDashboardQueries(t *testing.T, cfg monitoring.Config) {
	t.Helper()
	files, err := cfg.Files()
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(files[monitoring.DashboardFile], &d); err != nil {
		t.Fatal(err)
	}
	vars := strings.NewReplacer("$__rate_interval", "1m", "$__range", "10m", "$node", ".*")
	var shown []string
	for _, panel := range d.Panels {
		for _, tg := range panel.Targets {
			r, err := p.query(t.Context(), vars.Replace(tg.Expr))
			if err != nil {
				t.Errorf("panel %q: %v", panel.Title, err)
			} else if len(r) > 0 {
				shown = append(shown, panel.Title)
			}
		}
	}
	t.Logf("dashboard panels with data on this node: %s", strings.Join(shown, "; "))
}
