// Package monitoring generates what an operator watches podgate with: Prometheus alerting rules
// (each with a severity, a summary naming the node and a runbook_url into docs/runbook.md),
// recording rules that the alerts and the dashboard share, and one Grafana dashboard for a node
// and for the fleet, built with grafana-foundation-sdk.
//
// The files shipped in deploy/monitoring (and by the packages in /usr/share/podgate/monitoring)
// are this package's output for [Default]; `go run ./deploy/monitoring/gen` writes them again, and
// with -config FILE for an operator's thresholds, selectors and labels ([Config]), as a
// monitoring mixin takes its parameters.
package monitoring
