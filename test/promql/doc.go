// Package promql checks podgate's monitoring files (deploy/monitoring) with Prometheus' own
// PromQL parser: every query of the alerting and recording rules and of the dashboard parses,
// and names only series docs/metrics.md lists. It is a module of its own so that Prometheus'
// dependencies stay out of podgate's go.mod; run it with `cd test/promql && go test ./...`
// (make test does).
package promql
