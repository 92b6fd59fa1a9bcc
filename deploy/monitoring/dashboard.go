package monitoring

import (
	"encoding/json"
	"fmt"

	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/common"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
	"github.com/grafana/grafana-foundation-sdk/go/prometheus"
	"github.com/grafana/grafana-foundation-sdk/go/timeseries"
)

// DashboardUID is the dashboard's uid: links and provisioning name it.
const DashboardUID = "podgate-node"

// panel is one time-series panel: a title, what it shows, a unit and its queries (PromQL,
// legend).
type panel struct {
	title, description, unit string
	queries                  [][2]string
	stacked                  bool
}

// row is a row of panels.
type row struct {
	title  string
	panels []panel
}

// nodes is the matcher of the dashboard's node selector.
func (c Config) nodes() string { return c.NodeLabel + `=~"$node"` }

// dsel is podgate's selector with the node selector and more matchers, for the dashboard.
func (c Config) dsel(matchers ...string) string {
	return c.sel(append([]string{c.nodes()}, matchers...)...)
}

// csel is containerd's selector with the node selector and more matchers.
func (c Config) csel(matchers ...string) string {
	return "{" + c.ContainerdSelector + ", " + c.nodes() + joinMatchers(matchers) + "}"
}

func joinMatchers(m []string) string {
	s := ""
	for _, x := range m {
		s += ", " + x
	}
	return s
}

// rows are the dashboard's rows: the node (or nodes) chosen in the selector.
func (c Config) rows() []row {
	d := c.dsel
	rate := func(metric string, matchers ...string) string {
		return "rate(" + metric + d(matchers...) + "[$__rate_interval])"
	}
	q := func(expr, legend string) [2]string { return [2]string{expr, legend} }
	criService := `grpc_service=~"runtime.v1.(Runtime|Image)Service"`
	return []row{{
		title: "CRI: podgate and containerd",
		panels: []panel{
			{title: "CRI calls through podgate", unit: "reqps", description: "CRI calls podgate served, by method.",
				queries: [][2]string{q("sum by (method) ("+c.recordCRIRequests()+d()+")", "{{method}}")}},
			{title: "CRI calls containerd served", unit: "reqps", description: "containerd's own count of the CRI calls it served (its gRPC metrics, [metrics] address in containerd's config), by method.",
				queries: [][2]string{q("sum by (grpc_method) (rate(grpc_server_handled_total"+c.csel(criService)+"[$__rate_interval]))", "{{grpc_method}}")}},
			{title: "CRI latency through podgate, p99", unit: "s", description: "99th percentile of CRI call latency through podgate, by method (streams last while open).",
				queries: [][2]string{q("histogram_quantile(0.99, sum by (method, le) ("+c.recordCRILatencyBuckets()+d()+"))", "{{method}}")}},
			{title: "CRI latency in containerd, p99", unit: "s", description: "99th percentile of containerd's own handling time, by method (needs grpc_histogram = true in containerd's [metrics]).",
				queries: [][2]string{q("histogram_quantile(0.99, sum by (grpc_method, le) (rate(grpc_server_handling_seconds_bucket"+c.csel(criService)+"[$__rate_interval])))", "{{grpc_method}}")}},
			{title: "CRI calls failing", unit: "reqps", description: "CRI calls through podgate that did not end OK, by method and code.",
				queries: [][2]string{q("sum by (method, code) ("+c.recordCRIRequests()+d(`code!="OK"`)+")", "{{method}} {{code}}")}},
			{title: "Backend connected", unit: "short", description: "1 while podgate is connected to containerd (podgate_cri_backend_up); 0 means every CRI call fails.",
				queries: [][2]string{q("podgate_cri_backend_up"+d(), "{{"+c.NodeLabel+"}} {{backend}}")}},
		},
	}, {
		title: "Image pulls",
		panels: []panel{
			{title: "Pull queue and pulls in flight", unit: "short", description: "Backend pulls waiting for a slot, and PullImage calls in flight.",
				queries: [][2]string{q("sum (podgate_image_pull_queue_length"+d()+")", "queued"), q("sum (podgate_image_pull_in_flight"+d()+")", "in flight")}},
			{title: "Registry slots in use", unit: "short", stacked: true, description: "Pulls in flight by registry host (imagePulls.perRegistry hosts, other for the rest).",
				queries: [][2]string{q("sum by (registry) (podgate_image_pull_registry_in_flight"+d()+")", "{{registry}}")}},
			{title: "Wait for a pull slot, p90", unit: "s", description: "90th percentile of how long PullImage callers waited for their pull to start.",
				queries: [][2]string{q("histogram_quantile(0.9, sum by (le) ("+c.recordPullWaitBuckets()+d()+"))", "p90")}},
			{title: "Stalled pulls cancelled", unit: "short", description: "Pulls podgate cancelled as stalled, by registry.",
				queries: [][2]string{q("sum by (registry) (increase(podgate_image_pull_stalls_total"+d()+"[$__rate_interval]))", "{{registry}}")}},
			{title: "Registries pushing back", unit: "short", description: "Registries in a cool-down after they answered 429 (or 503 with Retry-After), and pulls they refused (per interval), by registry: their pulls wait in podgate's queue.",
				queries: [][2]string{q("sum by (registry) (podgate_image_pull_registry_cooling"+d()+")", "{{registry}} cooling"),
					q("sum by (registry) (increase(podgate_image_pull_push_backs_total"+d()+"[$__rate_interval]))", "{{registry}} refused")}},
			{title: "Pull throughput", unit: "Bps", stacked: true, description: "Bytes per second containerd fetches for running pulls, by registry.",
				queries: [][2]string{q("sum by (registry) (podgate_image_pull_throughput_bytes_per_second"+d()+")", "{{registry}}")}},
		},
	}, {
		title: "Pod sandboxes and DRA",
		panels: []panel{
			{title: "RunPodSandbox stages, p99", unit: "s", description: "99th percentile of each pipeline stage's duration; forward is containerd's own work (netns, CNI, pause).",
				queries: [][2]string{q("histogram_quantile(0.99, sum by (stage, le) ("+c.recordStageBuckets()+d()+"))", "{{stage}}")}},
			{title: "Sandboxes refused, by stage", unit: "short", description: "RunPodSandbox calls that failed, by the stage that failed (dra-prepare: a DRA driver down or failing).",
				queries: [][2]string{q("sum by (stage) (increase(podgate_sandbox_stage_failures_total"+d()+"[$__rate_interval]))", "{{stage}}")}},
			{title: "DRA prepares", unit: "reqps", description: "NodePrepareResources calls to DRA drivers, by driver and result.",
				queries: [][2]string{q("sum by (driver, result) ("+c.recordDRAOperations()+d(`operation="prepare"`)+")", "{{driver}} {{result}}")}},
			{title: "DRA drivers and prepared claims", unit: "short", description: "Drivers registered on the node, and claims podgate holds prepared.",
				queries: [][2]string{q("sum by (driver) (podgate_dra_drivers"+d()+")", "{{driver}}"), q("sum (podgate_dra_claims_prepared"+d()+")", "claims prepared")}},
		},
	}, {
		title: "PodResources",
		panels: []panel{
			{title: "PodResources calls", unit: "reqps", description: "Calls on podgate's PodResources socket, by method and code (ResourceExhausted: over the rate limit).",
				queries: [][2]string{q("sum by (method, code) ("+rate("podgate_podresources_requests_total")+")", "{{method}} {{code}}")}},
			{title: "PodResources refusals and watches", unit: "short", description: "Clients refused, by reason, and watches running.",
				queries: [][2]string{q("sum by (reason) (increase(podgate_podresources_refusals_total"+d()+"[$__rate_interval]))", "refused: {{reason}}"), q("sum (podgate_podresources_watchers"+d()+")", "watches")}},
		},
	}, {
		title: "Verification",
		panels: []panel{
			{title: "Pod sysctl verifications", unit: "short", description: "Sandboxes whose sysctls podgate read back, by result (anything but ok is drift).",
				queries: [][2]string{q("sum by (result) (increase(podgate_sysctl_verifications_total"+d()+"[$__rate_interval]))", "{{result}}")}},
			{title: "Cgroup verifications", unit: "short", description: "Containers' and pods' cgroups read back, by result (mismatch, error: drift).",
				queries: [][2]string{
					q("sum by (result) (increase(podgate_resources_verifications_total"+d()+"[$__rate_interval]))", "containers {{result}}"),
					q("sum by (result) (increase(podgate_resources_pod_verifications_total"+d()+"[$__rate_interval]))", "pods {{result}}"),
				}},
		},
	}, {
		title: "podgate itself",
		panels: []panel{
			{title: "Memory", unit: "bytes", description: "podgate's resident memory (RSS) and the Go heap in use.",
				queries: [][2]string{q("process_resident_memory_bytes"+d(), "RSS {{"+c.NodeLabel+"}}"), q("go_memstats_heap_inuse_bytes"+d(), "heap {{"+c.NodeLabel+"}}")}},
			{title: "CRI socket memory budget", unit: "percentunit", description: "Bytes podgate holds for CRI clients, as a share of criSocketLimits.totalBytes.",
				queries: [][2]string{q("podgate_cri_budget_held_bytes"+d()+" / podgate_cri_budget_limit_bytes"+d(), "{{"+c.NodeLabel+"}}")}},
			{title: "CRI socket refusals", unit: "short", description: "Calls refused and connections closed on the CRI socket, by reason (idle_timeout is no misbehaviour).",
				queries: [][2]string{q("sum by (reason) (increase(podgate_cri_connection_refusals_total"+d()+"[$__rate_interval]))", "{{reason}}")}},
			{title: "Restarts", unit: "short", description: "podgate's starts within the range shown.",
				queries: [][2]string{q("changes(process_start_time_seconds"+d()+"[$__range]) + 1", "{{"+c.NodeLabel+"}}")}},
			{title: "Versions outside the tested range", unit: "short", description: "1 per kubelet or runtime podgate found outside the releases it is tested with.",
				queries: [][2]string{q("podgate_peer_version_info"+d(`tested="false"`), "{{"+c.NodeLabel+"}} {{component}} {{version}}")}},
		},
	}}
}

// Dashboard is the Grafana dashboard: one node, several, or the fleet, chosen in its node
// selector. It is the classic dashboard JSON (schema v1), which every Grafana release in use
// imports; the SDK's dashboardv2 needs Grafana 12's v2 dashboard API.
func (c Config) Dashboard() (dashboard.Dashboard, error) { //nolint:staticcheck // schema v1 on purpose, as above
	ds := common.DataSourceRef{Type: cog.ToPtr("prometheus"), Uid: cog.ToPtr("${datasource}")}
	//nolint:staticcheck // schema v1 on purpose, see the doc comment
	b := dashboard.NewDashboardBuilder("podgate").
		Uid(DashboardUID).
		Description("podgate, the CRI proxy between the kubelet and containerd: CRI calls beside containerd's, image pulls, pod sandboxes and DRA, PodResources, verification, memory. Generated by deploy/monitoring.").
		Tags([]string{"podgate", "kubernetes", "cri"}).
		Refresh("30s").
		Time("now-3h", "now").
		Timezone(common.TimeZoneUtc).
		Tooltip(dashboard.DashboardCursorSyncCrosshair).
		WithVariable(dashboard.NewDatasourceVariableBuilder("datasource").Label("Data source").Type("prometheus")).
		WithVariable(dashboard.NewQueryVariableBuilder("node").Label("Node").
			Datasource(ds).
			Query(dashboard.StringOrMap{String: cog.ToPtr("label_values(podgate_build_info{" + c.Selector + "}, " + c.NodeLabel + ")")}).
			Refresh(dashboard.VariableRefreshOnTimeRangeChanged).
			Sort(dashboard.VariableSortAlphabeticalAsc).
			Multi(true).IncludeAll(true).AllValue(".*"))
	for _, r := range c.rows() {
		b = b.WithRow(dashboard.NewRowBuilder(r.title))
		for _, p := range r.panels {
			b = b.WithPanel(c.timeseries(ds, p))
		}
	}
	return b.Build()
}

func (c Config) timeseries(ds common.DataSourceRef, p panel) *timeseries.PanelBuilder {
	tp := timeseries.NewPanelBuilder().
		Title(p.title).Description(p.description).Unit(p.unit).
		Datasource(ds).
		Height(8).Span(8).
		Min(0).
		FillOpacity(10).
		Legend(common.NewVizLegendOptionsBuilder().ShowLegend(true).DisplayMode(common.LegendDisplayModeList).Placement(common.LegendPlacementBottom))
	if p.stacked {
		tp = tp.Stacking(common.NewStackingConfigBuilder().Mode(common.StackingModeNormal))
	}
	for i, q := range p.queries {
		tp = tp.WithTarget(prometheus.NewDataqueryBuilder().
			Expr(q[0]).LegendFormat(q[1]).RefId(string(rune('A' + i))).Datasource(ds))
	}
	return tp
}

// DashboardJSON is the dashboard as Grafana imports it.
func (c Config) DashboardJSON() ([]byte, error) {
	d, err := c.Dashboard()
	if err != nil {
		return nil, fmt.Errorf("dashboard: %w", err)
	}
	b, err := json.MarshalIndent(d, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}
