package e2e

import (
	"os"
	"testing"
	"time"

	"github.com/podgate/podgate/test/otlpfake"
	"github.com/podgate/podgate/test/rig"
)

// BenchmarkTracingCost is what tracing costs a call that podgate passes through (Version), in
// front of the fake runtime (test/e2e/fakeruntime): direct, test/forwarder, podgate with
// tracing off (the default) and podgate with tracing on at 100 % sampling
// (samplingRatePerMillion 1000000, every call a root span exported to an OTLP collector of the
// benchmark's, test/otlpfake), interleaved as BenchmarkForwarderFakeRuntime does:
//
//   - Version, b.N rounds: p50 and p99 per path, and each proxy's addition over direct at p50;
//   - 64 clients per path calling Version, in 0.5 s slices, 2 s per path: calls per second, and
//     each proxy's CPU time per call;
//   - the spans the collector received from the traced podgate.
//
// With tracing off, podgate builds its gRPC server and backend connections exactly as before
// (no stats handler), so its figures stay those of podgate against the forwarder.
//
//	go test -run '^$' -bench TracingCost -benchtime 3000x -count 3 ./test/e2e
func BenchmarkTracingCost(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root: podgate runs as root (state directory, cgroups, node sysctls)")
	}
	fake := startFakeRuntime(b, 10, 10)
	collector := otlpfake.Start(b)
	plain := startPodgate(b, fake.endpoint)
	traced := startPodgate(b, fake.endpoint, "--config",
		writeConfig(b, "tracing:\n  endpoint: "+collector.Endpoint+"\n  samplingRatePerMillion: 1000000\n"))
	fwd := startForwarder(b, fake.endpoint, false)
	paths := []string{"direct", "forwarder", "podgate", "podgate-traced"}
	endpoints := map[string]string{"direct": fake.endpoint, "forwarder": fwd.Endpoint, "podgate": plain.Endpoint, "podgate-traced": traced.Endpoint}
	clients := map[string]*rig.Client{}
	for path, e := range endpoints {
		clients[path] = rig.Connect(b, e)
	}
	waitRebuilt(b, plain)
	waitRebuilt(b, traced)
	ctx := b.Context()

	lat := map[string][]time.Duration{}
	for iter := 0; b.Loop(); iter++ {
		for _, path := range roundOrder(iter, paths) {
			start := time.Now()
			if _, err := clients[path].Runtime.Version(ctx, "v1"); err != nil {
				b.Fatal(err)
			}
			lat[path] = append(lat[path], time.Since(start))
		}
	}
	b.StopTimer()
	for _, path := range paths {
		b.ReportMetric(micros(percentile(lat[path], 50)), path+"-p50-µs")
		b.ReportMetric(micros(percentile(lat[path], 99)), path+"-p99-µs")
		if path != "direct" {
			b.ReportMetric(micros(percentile(lat[path], 50)-percentile(lat["direct"], 50)), path+"-added-p50-µs")
		}
	}
	b.ReportMetric(micros(percentile(lat["podgate-traced"], 50)-percentile(lat["podgate"], 50)), "tracing-added-p50-µs")

	pids := map[string]int{"forwarder": fwd.PID(), "podgate": plain.PID(), "podgate-traced": traced.PID()}
	results := newLoad(b, endpoints, 64).run(b, paths, pids, loadSlice, 4)
	for path, r := range results {
		b.ReportMetric(r.rate(), path+"-64c-calls/s")
		if path != "direct" {
			b.ReportMetric(r.cpuPerCall(), path+"-cpu-µs/call")
		}
	}
	b.ReportMetric(procMemory(b, plain.PID())["VmRSS"], "podgate-rss-MiB")
	b.ReportMetric(procMemory(b, traced.PID())["VmRSS"], "podgate-traced-rss-MiB")
	// Spans are exported in batches: what reached the collector by now.
	b.ReportMetric(float64(len(collector.Spans())), "spans-received")
}

// micros is d in microseconds, for ReportMetric.
func micros(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
