package monitoring

import (
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/prometheus/common/model"
)

// RuleFile is a Prometheus rule file.
type RuleFile struct {
	Groups []RuleGroup `yaml:"groups"`
}

// RuleGroup is a group of a rule file.
type RuleGroup struct {
	Name     string `yaml:"name"`
	Interval string `yaml:"interval,omitempty"`
	Rules    []Rule `yaml:"rules"`
}

// Rule is an alerting rule (Alert set) or a recording rule (Record set).
type Rule struct {
	Alert       string            `yaml:"alert,omitempty"`
	Record      string            `yaml:"record,omitempty"`
	Expr        string            `yaml:"expr"`
	For         string            `yaml:"for,omitempty"`
	Labels      map[string]string `yaml:"labels,omitempty"`
	Annotations map[string]string `yaml:"annotations,omitempty"`
}

// Severities of the alerts: critical wakes someone (the node cannot start pods), warning opens
// a ticket, info is for the node's owner to read.
const (
	SeverityCritical = "critical"
	SeverityWarning  = "warning"
	SeverityInfo     = "info"
)

// sel is podgate's selector with more matchers.
func (c Config) sel(matchers ...string) string {
	return "{" + strings.Join(append([]string{c.Selector}, matchers...), ", ") + "}"
}

// by is a "by (...)" clause of the node label and labels.
func (c Config) by(labels ...string) string {
	return "by (" + strings.Join(append([]string{c.NodeLabel}, labels...), ", ") + ")"
}

// node is the alert template naming the node.
func (c Config) node() string { return "{{ $labels." + c.NodeLabel + " }}" }

// newEvents is an expression with a sample per node (and labels) where the counter metric
// (with matchers) counted events within window. podgate creates a labelled series at its first
// event, and increase() sees nothing on a series whose first sample is already 1: a series
// that appeared within the window counts too, when Prometheus scraped podgate before the
// series' first sample (so a Prometheus that just started scraping a podgate whose counters
// already hold events raises nothing).
func (c Config) newEvents(metric, matchers string, window model.Duration, labels ...string) string {
	s := c.sel()
	if matchers != "" {
		s = c.sel(matchers)
	}
	w := window.String()
	series := metric + s
	return fmt.Sprintf(`sum %[1]s (increase(%[2]s[%[3]s])) > 0
or
sum %[1]s (
  (%[2]s unless %[2]s offset %[3]s)
  and
  (count_over_time(%[2]s[%[3]s]) < on (%[4]s) group_left () sum by (%[4]s) (count_over_time(podgate_build_info%[5]s[%[3]s])))
) > 0`, c.by(labels...), series, w, c.NodeLabel, c.sel())
}

// Alert is one alerting rule as the generator describes it.
type Alert struct {
	// Name is the alert's name, and the heading of its section in docs/runbook.md.
	Name string
	// Severity is SeverityCritical, SeverityWarning or SeverityInfo.
	Severity string
	// Expr is the PromQL expression; each of its samples is an alert.
	Expr string
	// For is how long Expr must hold before the alert fires; 0 fires at once.
	For model.Duration
	// Summary names the node; Description says what happens and what to look at first.
	Summary, Description string
}

// Alerts are podgate's alerting rules for c, in the order of docs/runbook.md's "Alerts".
func (c Config) Alerts() []Alert {
	n := c.node()
	return []Alert{{
		Name: "PodgateDown", Severity: SeverityCritical, For: c.PodgateDownFor,
		Expr:        "up" + c.sel() + " == 0",
		Summary:     "podgate on " + n + " cannot be scraped",
		Description: "Prometheus could not scrape podgate's /metrics on " + n + " for " + c.PodgateDownFor.String() + ". If podgate is down, the kubelet cannot reach the runtime and no pod starts or stops.",
	}, {
		Name: "PodgateBackendDown", Severity: SeverityCritical, For: c.BackendDownFor,
		Expr:        "podgate_cri_backend_up" + c.sel() + " == 0",
		Summary:     "podgate on " + n + " cannot reach containerd ({{ $labels.backend }} {{ $labels.endpoint }})",
		Description: "podgate on " + n + " has not been connected to its " + "{{ $labels.backend }} backend {{ $labels.endpoint }} for " + c.BackendDownFor.String() + ": CRI calls fail with Unavailable and no pod starts.",
	}, {
		Name: "PodgateCRICallsFailing", Severity: SeverityWarning, For: c.CRIErrorsFor,
		Expr: fmt.Sprintf("sum %[1]s (%[2]s{%[4]s, code=~\"Unavailable|Internal|Unknown|DeadlineExceeded\"})\n  /\nsum %[1]s (%[2]s{%[4]s}) > %[3]v",
			c.by(), c.recordCRIRequests(), c.CRIErrorRatio, c.Selector),
		Summary:     "podgate on " + n + ": {{ $value | humanizePercentage }} of CRI calls fail",
		Description: "On " + n + ", more than " + fmt.Sprint(c.CRIErrorRatio*100) + "% of the CRI calls through podgate failed with Unavailable, Internal, Unknown or DeadlineExceeded for " + c.CRIErrorsFor.String() + ".",
	}, {
		Name: "PodgateImagePullsQueued", Severity: SeverityWarning, For: c.PullQueuedFor,
		Expr:        "podgate_image_pull_queue_length" + c.sel() + " > 0",
		Summary:     "podgate on " + n + ": image pulls queued for " + c.PullQueuedFor.String(),
		Description: "{{ $value }} pulls wait for a slot on " + n + " and the queue has not emptied for " + c.PullQueuedFor.String() + ": pods wait for their images.",
	}, {
		Name: "PodgateImagePullStalled", Severity: SeverityWarning,
		Expr:        c.newEvents("podgate_image_pull_stalls_total", "", c.EventWindow, "registry"),
		Summary:     "podgate on " + n + " cancelled stalled pulls from registry {{ $labels.registry }}",
		Description: "Within " + c.EventWindow.String() + ", podgate on " + n + " cancelled pulls from {{ $labels.registry }} that fetched less than imagePulls.stall.minBytesPerSecond; their pods got a PullStalled Event.",
	}, {
		Name: "PodgateRegistryPushingBack", Severity: SeverityWarning,
		Expr:        c.newEvents("podgate_image_pull_push_back_failures_total", "", c.EventWindow, "registry"),
		Summary:     "podgate on " + n + ": registry {{ $labels.registry }} refuses pulls for longer than podgate holds them",
		Description: "Within " + c.EventWindow.String() + ", podgate on " + n + " gave pulls from {{ $labels.registry }} the registry's refusal (429 Too Many Requests, or 503 with Retry-After) after holding and retrying them for imagePulls.coolDown.retryFor: the registry's limit outlasts the cool-down, and the pods go to ImagePullBackOff.",
	}, {
		Name: "PodgateSandboxesRefusedDRA", Severity: SeverityWarning,
		Expr:        c.newEvents("podgate_sandbox_stage_failures_total", `stage="dra-prepare"`, c.EventWindow),
		Summary:     "podgate on " + n + " refused pod sandboxes: DRA prepare failed",
		Description: "Within " + c.EventWindow.String() + ", podgate on " + n + " refused RunPodSandbox because a pod's DRA claims could not be prepared: a DRA driver is not registered, unreachable or failing. The kubelet retries; the pods do not start meanwhile.",
	}, {
		Name: "PodgateDRAPrepareFailing", Severity: SeverityWarning,
		Expr:        c.newEvents("podgate_dra_operations_total", `operation="prepare", result=~"error|timeout"`, c.EventWindow, "driver"),
		Summary:     "podgate on " + n + ": DRA driver {{ $labels.driver }} fails prepares",
		Description: "Within " + c.EventWindow.String() + ", NodePrepareResources calls of podgate on " + n + " to DRA driver {{ $labels.driver }} failed or timed out.",
	}, {
		Name: "PodgateSysctlDrift", Severity: SeverityWarning,
		Expr:        c.newEvents("podgate_sysctl_verifications_total", `result=~"repaired|mismatch|failed|error"`, c.EventWindow, "result"),
		Summary:     "podgate on " + n + ": pod sysctls did not hold ({{ $labels.result }})",
		Description: "Within " + c.EventWindow.String() + ", podgate on " + n + " read back pod sysctls that differed from what the pods asked (result {{ $labels.result }}): something on the node, often a CNI plugin, changes them.",
	}, {
		Name: "PodgateCgroupDrift", Severity: SeverityWarning,
		Expr:        c.newEvents("podgate_resources_verifications_total", `result=~"mismatch|error"`, c.EventWindow, "result"),
		Summary:     "podgate on " + n + ": container cgroups differ from what was asked ({{ $labels.result }})",
		Description: "Within " + c.EventWindow.String() + ", podgate on " + n + " read containers' cgroups that differ from what the kubelet asked, or could not read them (result {{ $labels.result }}).",
	}, {
		Name: "PodgatePodCgroupDrift", Severity: SeverityWarning,
		Expr:        c.newEvents("podgate_resources_pod_verifications_total", `result=~"mismatch|error"`, c.EventWindow, "result"),
		Summary:     "podgate on " + n + ": pod cgroups differ from what was asked ({{ $labels.result }})",
		Description: "Within " + c.EventWindow.String() + ", podgate on " + n + " read pod-level cgroups that differ from what the kubelet sent the runtime, or could not read them (result {{ $labels.result }}).",
	}, {
		Name: "PodgateCRIClientRefused", Severity: SeverityWarning,
		Expr:        c.newEvents("podgate_cri_connection_refusals_total", `reason!="idle_timeout"`, c.RefusalWindow, "reason"),
		Summary:     "podgate on " + n + " refused a misbehaving CRI client ({{ $labels.reason }})",
		Description: "Within " + c.RefusalWindow.String() + ", a local client of podgate's CRI socket on " + n + " went over a limit or broke HTTP/2 (reason {{ $labels.reason }}); podgate's log names its pid and uid.",
	}, {
		Name: "PodgatePodResourcesClientRefused", Severity: SeverityWarning,
		Expr:        c.newEvents("podgate_podresources_refusals_total", "", c.RefusalWindow, "reason"),
		Summary:     "podgate on " + n + " refused a PodResources client ({{ $labels.reason }})",
		Description: "Within " + c.RefusalWindow.String() + ", podgate on " + n + " refused calls or connections of a PodResources client over its limits (reason {{ $labels.reason }}); podgate's log names its pid and uid.",
	}, {
		Name: "PodgatePeerVersionUntested", Severity: SeverityInfo, For: c.PeerVersionFor,
		Expr:        "podgate_peer_version_info" + c.sel(`tested="false"`) + " == 1",
		Summary:     "podgate on " + n + " runs beside {{ $labels.component }} {{ $labels.version }}, outside its tested range",
		Description: "podgate on " + n + " found {{ $labels.component }} {{ $labels.name }} {{ $labels.version }}, a release podgate is not tested with.",
	}, {
		Name: "PodgateRestarting", Severity: SeverityWarning,
		Expr:        fmt.Sprintf("changes(process_start_time_seconds%s[%s]) + 1 >= %d", c.sel(), c.RestartWindow, c.Restarts),
		Summary:     "podgate on " + n + " restarts: {{ $value }} starts in " + c.RestartWindow.String(),
		Description: "podgate on " + n + " started {{ $value }} times within " + c.RestartWindow.String() + ": systemd restarts it after each exit. Its journal says why it stopped.",
	}}
}

// Runbook is the runbook_url of the alert name.
func (c Config) Runbook(name string) string { return c.RunbookURL + "#" + strings.ToLower(name) }

// AlertRules is the rule file of the alerts.
func (c Config) AlertRules() RuleFile {
	g := RuleGroup{Name: "podgate.alerts", Interval: interval(c.EvaluationInterval)}
	for _, a := range c.Alerts() {
		r := Rule{
			Alert:  a.Name,
			Expr:   a.Expr,
			Labels: map[string]string{"severity": a.Severity},
			Annotations: map[string]string{
				"summary": a.Summary, "description": a.Description, "runbook_url": c.Runbook(a.Name),
			},
		}
		if a.For > 0 {
			r.For = a.For.String()
		}
		g.Rules = append(g.Rules, r)
	}
	return RuleFile{Groups: []RuleGroup{g}}
}

func interval(d model.Duration) string {
	if d <= 0 {
		return ""
	}
	return d.String()
}

// Recording rules: the level is the node label, as in kube-prometheus' rule names.

func (c Config) recordCRIRequests() string {
	return c.NodeLabel + "_method_code:podgate_cri_requests:rate" + c.RateWindow.String()
}

func (c Config) recordCRILatencyBuckets() string {
	return c.NodeLabel + "_method_le:podgate_cri_request_duration_seconds_bucket:rate" + c.RateWindow.String()
}

func (c Config) recordStageBuckets() string {
	return c.NodeLabel + "_stage_le:podgate_sandbox_stage_duration_seconds_bucket:rate" + c.RateWindow.String()
}

func (c Config) recordPullWaitBuckets() string {
	return c.NodeLabel + "_le:podgate_image_pull_wait_seconds_bucket:rate" + c.RateWindow.String()
}

func (c Config) recordDRAOperations() string {
	return c.NodeLabel + "_driver_operation_result:podgate_dra_operations:rate" + c.RateWindow.String()
}

// Recording are the recording rules: the rates the alerts and the dashboard share. Each keeps
// the selector's labels (job) beside the node label, so the selector still applies to them.
func (c Config) Recording() RuleFile {
	w := c.RateWindow.String()
	keep := c.selectorLabels()
	by := func(labels ...string) string { return c.by(append(keep, labels...)...) }
	rate := func(metric string) string { return "rate(" + metric + c.sel() + "[" + w + "])" }
	return RuleFile{Groups: []RuleGroup{{
		Name: "podgate.rules", Interval: interval(c.EvaluationInterval),
		Rules: []Rule{
			{Record: c.recordCRIRequests(), Expr: "sum " + by("method", "code") + " (" + rate("podgate_cri_requests_total") + ")"},
			{Record: c.recordCRILatencyBuckets(), Expr: "sum " + by("method", "le") + " (" + rate("podgate_cri_request_duration_seconds_bucket") + ")"},
			{Record: c.recordStageBuckets(), Expr: "sum " + by("stage", "le") + " (" + rate("podgate_sandbox_stage_duration_seconds_bucket") + ")"},
			{Record: c.recordPullWaitBuckets(), Expr: "sum " + by("le") + " (" + rate("podgate_image_pull_wait_seconds_bucket") + ")"},
			{Record: c.recordDRAOperations(), Expr: "sum " + by("driver", "operation", "result") + " (" + rate("podgate_dra_operations_total") + ")"},
		},
	}}}
}

var matcherLabel = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)`)

// selectorLabels are the label names of the selector's equality matchers, but the node label:
// the labels a recording rule keeps.
func (c Config) selectorLabels() []string {
	var out []string
	for _, m := range matcherLabel.FindAllStringSubmatch(c.Selector, -1) {
		if m[1] != c.NodeLabel && !slices.Contains(out, m[1]) {
			out = append(out, m[1])
		}
	}
	return out
}
