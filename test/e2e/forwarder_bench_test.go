package e2e

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/podgate/podgate/test/harness"
	"github.com/podgate/podgate/test/rig"
	"github.com/podgate/podgate/test/testfs"
)

// BenchmarkForwarderBaseline puts podgate beside the smallest honest gRPC passthrough
// (test/forwarder: raw bytes, an UnknownServiceHandler, ~100 lines) in front of the same real
// containerd, each its own process, and compares them in one run: the small call (Version)
// p50 and p99 through each path, alternating; ListContainers of 1,000 containers p50,
// alternating; 64 concurrent clients' Version calls per second, alternating in slices, with
// each proxy's CPU time per call; both proxies' RSS.
//
// With PODGATE_BENCH_PROFILE=DIR (podgate then runs with enableProfilingHandler) it then
// profiles both proxies at once for 10 s of the alternating 64-client Version load and writes
// their CPU and allocation profiles to DIR, for `go tool pprof`.
//
//	go test -run '^$' -bench ForwarderBaseline -benchtime 3000x -count 3 ./test/e2e
func BenchmarkForwarderBaseline(b *testing.B) {
	profileDir := os.Getenv("PODGATE_BENCH_PROFILE")
	var args []string
	if profileDir != "" {
		args = []string{"--config", writeConfig(b, "enableProfilingHandler: true\n")}
	}
	n := startNode(b, args...)
	fwd := startForwarder(b, n.rig.Endpoint, profileDir != "")
	clients := map[string]*rig.Client{"direct": n.direct, "forwarder": rig.Connect(b, fwd.Endpoint), "podgate": n.through}
	paths := []string{"direct", "forwarder", "podgate"}
	ctrs := createContainers(b, n, listPods, listPerPod)

	lat := map[string][]time.Duration{}
	for iter := 0; b.Loop(); iter++ {
		for _, path := range roundOrder(iter, paths) {
			start := time.Now()
			if _, err := clients[path].Runtime.Version(b.Context(), "v1"); err != nil {
				b.Fatal(err)
			}
			lat[path] = append(lat[path], time.Since(start))
		}
	}
	b.StopTimer()
	pct := func(d []time.Duration, p int) float64 { return float64(percentile(d, p).Microseconds()) }
	for _, path := range paths {
		b.ReportMetric(pct(lat[path], 50), path+"-p50-µs")
		b.ReportMetric(pct(lat[path], 99), path+"-p99-µs")
	}
	b.ReportMetric(pct(lat["podgate"], 50)-pct(lat["forwarder"], 50), "podgate-vs-forwarder-p50-µs")

	list := listLatency(b, clients, paths)
	for _, path := range paths {
		p50 := float64(percentile(list[path], 50)) / float64(time.Millisecond)
		b.ReportMetric(p50, path+"-list1000-p50-ms")
		if path != "direct" {
			b.ReportMetric(p50*float64(time.Millisecond)/float64(percentile(list["direct"], 50)), path+"-list1000-ratio")
		}
	}

	// 64 clients per path, each on its own connection, 2 s per path in slices of 0.5 s that
	// alternate between the paths in a rotated order, so that every path sees the machine's
	// moments alike; for the two proxies also the CPU time they spent per call.
	l := newLoad(b, map[string]string{"direct": n.rig.Endpoint, "forwarder": fwd.Endpoint, "podgate": n.podgate.Endpoint}, 64)
	pids := map[string]int{"forwarder": fwd.PID(), "podgate": n.podgate.PID()}
	for path, r := range l.run(b, paths, pids, loadSlice, 4) {
		b.ReportMetric(r.rate(), path+"-64c-calls/s")
		if _, proxy := pids[path]; proxy {
			b.ReportMetric(r.cpuPerCall(), path+"-cpu-µs/call")
		}
	}
	b.ReportMetric(procMemory(b, n.podgate.PID())["VmRSS"], "podgate-rss-MiB")
	b.ReportMetric(procMemory(b, fwd.PID())["VmRSS"], "forwarder-rss-MiB")

	if profileDir != "" {
		profileUnderLoad(b, profileDir, l, pids, map[string]string{"forwarder": fwd.PprofURL, "podgate": n.podgate.MetricsURL})
	}
	b.ReportMetric(ctrs.created.Seconds(), "create1000-s")
	b.ReportMetric(ctrs.remove(b).Seconds(), "remove1000-s")
}

// The 1,000 containers of the list comparison: 10 sandboxes of 100, and the alternated rounds.
const (
	listPods   = 10
	listPerPod = 100
	listRounds = 100
)

// listLatency times ListContainers through each path, alternating in each round's order as
// the Version loop does, and checks that each answer holds every container.
func listLatency(b *testing.B, clients map[string]*rig.Client, paths []string) map[string][]time.Duration {
	b.Helper()
	return alternate(b, paths, listRounds, func(_ int, path string) error {
		l, err := clients[path].Runtime.ListContainers(b.Context(), nil)
		if err == nil && len(l) != listPods*listPerPod {
			err = fmt.Errorf("%d containers, want %d", len(l), listPods*listPerPod)
		}
		if err != nil {
			return fmt.Errorf("ListContainers: %w", err)
		}
		return nil
	})
}

// startForwarder starts test/forwarder in front of the runtime at endpoint (unix://path); it
// stops at the benchmark's end.
func startForwarder(b *testing.B, endpoint string, pprof bool) *harness.Forwarder {
	b.Helper()
	f, err := harness.StartForwarder(b.Context(), testfs.ShortDir(b), endpoint, pprof)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(f.Stop)
	return f
}

// startByteRelay starts test/forwarder -bytes in front of the runtime at endpoint: a relay that
// copies bytes without looking at them; it stops at the benchmark's end.
func startByteRelay(b *testing.B, endpoint string) *harness.Forwarder {
	b.Helper()
	f, err := harness.StartByteRelay(b.Context(), testfs.ShortDir(b), endpoint)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(f.Stop)
	return f
}

// cpuTime is the user and system CPU time a process has used, all its threads together.
func cpuTime(b *testing.B, pid int) time.Duration {
	b.Helper()
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		b.Fatal(err)
	}
	// utime and stime are fields 14 and 15, counted after the command, which is in
	// parentheses and may hold spaces; /proc counts them in USER_HZ, 100 on Linux.
	fields := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+1:]))
	var ticks int64
	for _, f := range fields[11:13] {
		v, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			b.Fatalf("/proc/%d/stat: %v", pid, err)
		}
		ticks += v
	}
	return time.Duration(ticks) * 10 * time.Millisecond
}
