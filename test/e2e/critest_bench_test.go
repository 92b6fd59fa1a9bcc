package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/podgate/podgate/test/rig"
	"github.com/podgate/podgate/test/testfs"
)

// critestRounds is how many times BenchmarkCritest runs critest on each path, alternating the
// paths, so that a slow stretch of a noisy machine falls on all of them.
const critestRounds = 4

// critestPaths are the ways to the rig's containerd that BenchmarkCritest compares.
var critestPaths = []string{"direct", "forwarder", "podgate"}

// critestPodCalls are the operations of critest's pod lifecycle benchmark, in its order.
var critestPodCalls = []string{"CreatePod", "StatusPod", "StopPod", "RemovePod"}

// BenchmarkCritest runs cri-tools' own benchmark (critest -benchmark, the pod sandbox lifecycle:
// RunPodSandbox, PodSandboxStatus, StopPodSandbox, RemovePodSandbox of pods without
// containers) on the rig's containerd, directly, through test/forwarder and through podgate
// with its default configuration, in critestRounds alternating rounds of b.N pods per path (the
// issue's measurement: -benchtime 20x, 80 lifecycles per path). critest's benchmarks of
// containers and images pull from a public registry, which no test reaches: they are skipped.
//
// It reports each call's median per path (CALL-PATH-ms), the ratios to direct
// (CALL-PATH/direct), and podgate's median over the forwarder's (CALL-podgate/forwarder; the
// target is 1.05 or less).
//
//	go test -run '^$' -bench Critest -benchtime 20x ./test/e2e     # root, rig with critest
func BenchmarkCritest(b *testing.B) {
	critest := filepath.Join(rig.InstallDir(), "bin", "critest")
	if _, err := os.Stat(critest); err != nil {
		b.Skipf("critest is not installed (%v): run test/rig/install.sh tools", err)
	}
	r := rig.Start(b) // skips unless root with the rig installed
	pg := startPodgate(b, r.Endpoint)
	fwd := startForwarder(b, r.Endpoint, false)
	endpoints := map[string]string{"direct": r.Endpoint, "forwarder": fwd.Endpoint, "podgate": pg.Endpoint}
	dir := b.TempDir()
	params := filepath.Join(dir, "params.yaml")
	if err := os.WriteFile(params, fmt.Appendf(nil, "podsNumber: %d\npodsNumberParallel: 1\n", b.N), 0o644); err != nil {
		b.Fatal(err)
	}
	lat := map[string]map[string][]time.Duration{}
	for _, call := range critestPodCalls {
		lat[call] = map[string][]time.Duration{}
	}
	b.ResetTimer()
	for round := range critestRounds {
		for k := range critestPaths {
			path := critestPaths[(round+k)%len(critestPaths)]
			out := filepath.Join(dir, fmt.Sprintf("%s-%d", path, round))
			res := runCritest(b, critest, endpoints[path], params, out)
			for _, p := range res.Datapoints {
				for i, call := range res.OperationsNames {
					lat[call][path] = append(lat[call][path], time.Duration(p.OperationsDurationsNs[i]))
				}
			}
		}
	}
	b.StopTimer()
	for _, call := range critestPodCalls {
		med := map[string]time.Duration{}
		for _, path := range critestPaths {
			if got, want := len(lat[call][path]), critestRounds*b.N; got != want {
				b.Fatalf("%s through %s: %d samples, want %d", call, path, got, want)
			}
			med[path] = percentile(lat[call][path], 50)
			b.ReportMetric(ms(med[path]), call+"-"+path+"-ms")
		}
		for _, path := range critestPaths[1:] {
			b.ReportMetric(float64(med[path])/float64(med["direct"]), call+"-"+path+"/direct")
		}
		b.ReportMetric(float64(med["podgate"])/float64(med["forwarder"]), call+"-podgate/forwarder")
	}
}

// critestResults is critest's pod_benchmark_data.json (cri-tools pkg/benchmark
// LifecycleBenchmarksResultsSet).
type critestResults struct {
	OperationsNames []string `json:"operationsNames"`
	Datapoints      []struct {
		OperationsDurationsNs []int64 `json:"operationsDurationsNs"`
	} `json:"datapoints"`
}

// runCritest runs critest's benchmarks against endpoint with the params file, its results in
// out, and returns the pod lifecycle's. The benchmark that starts a container from scratch is
// skipped: it pulls from a public registry.
func runCritest(b *testing.B, critest, endpoint, params, out string) critestResults {
	b.Helper()
	if err := os.MkdirAll(out, 0o755); err != nil {
		b.Fatal(err)
	}
	cmd := exec.CommandContext(b.Context(), critest, "-benchmark",
		"-ginkgo.skip", "container from scratch", "-ginkgo.no-color",
		"-runtime-endpoint", endpoint, "-image-endpoint", endpoint,
		"-benchmarking-params-file", params, "-benchmarking-output-dir", out)
	cmd.Dir = testfs.ShortDir(b) // critest looks for crictl.yaml in its working directory
	if log, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("critest against %s: %v\n%s", endpoint, err, log)
	}
	data, err := os.ReadFile(filepath.Join(out, "pod_benchmark_data.json"))
	if err != nil {
		b.Fatal(err)
	}
	var res critestResults
	if err := json.Unmarshal(data, &res); err != nil {
		b.Fatalf("critest's results: %v", err)
	}
	if !slices.Equal(res.OperationsNames, critestPodCalls) {
		b.Fatalf("critest's pod operations %v, want %v", res.OperationsNames, critestPodCalls)
	}
	for _, p := range res.Datapoints {
		if len(p.OperationsDurationsNs) != len(critestPodCalls) {
			b.Fatalf("critest datapoint with %d durations, want %d", len(p.OperationsDurationsNs), len(critestPodCalls))
		}
	}
	return res
}
