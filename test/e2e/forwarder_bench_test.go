package e2e

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/podgate/podgate/test/rig"
	"github.com/podgate/podgate/test/testfs"
)

// BenchmarkForwarderBaseline puts podgate beside the smallest honest gRPC passthrough
// (test/forwarder: raw bytes, an UnknownServiceHandler, ~100 lines) in front of the same real
// containerd, each its own process, and compares them in one run: the small call (Version)
// p50 and p99 through each path, alternating, then 64 concurrent clients' calls per second,
// then both processes' RSS.
//
//	go test -run '^$' -bench ForwarderBaseline -benchtime 3000x -count 3 ./test/e2e
func BenchmarkForwarderBaseline(b *testing.B) {
	n := startNode(b)
	dir := testfs.ShortDir(b)
	bin := goBuild(b, dir, "github.com/podgate/podgate/test/forwarder", "forwarder")
	fwdSock := filepath.Join(dir, "fwd.sock")
	fwd := exec.Command(bin, "-listen", fwdSock, "-backend", strings.TrimPrefix(n.rig.Endpoint, "unix://"))
	out, err := fwd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := fwd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = fwd.Process.Kill(); _ = fwd.Wait() })
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || strings.TrimSpace(line) != "ready" {
		b.Fatalf("forwarder did not start: %q %v", line, err)
	}
	clients := map[string]*rig.Client{"direct": n.direct, "forwarder": rig.Connect(b, "unix://"+fwdSock), "podgate": n.through}
	paths := []string{"direct", "forwarder", "podgate"}

	lat := map[string][]time.Duration{}
	for iter := 0; b.Loop(); iter++ {
		for k := range paths {
			path := paths[(iter+k)%len(paths)] // rotate the order: no path always goes first
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

	// 64 clients, each on its own connection, for two seconds per path.
	for _, path := range paths {
		endpoint := map[string]string{"direct": n.rig.Endpoint, "forwarder": "unix://" + fwdSock, "podgate": n.podgate.Endpoint}[path]
		b.ReportMetric(throughput(b, endpoint, 64, 2*time.Second), path+"-64c-calls/s")
	}
	b.ReportMetric(rssMiB(b, n.podgate.PID()), "podgate-rss-MiB")
	b.ReportMetric(rssMiB(b, fwd.Process.Pid), "forwarder-rss-MiB")
}

// throughput is the Version calls per second that clients concurrent clients get through.
func throughput(b *testing.B, endpoint string, clients int, d time.Duration) float64 {
	b.Helper()
	conns := make([]*rig.Client, clients)
	for i := range conns {
		conns[i] = rig.Connect(b, endpoint)
	}
	ctx, cancel := context.WithTimeout(b.Context(), d)
	defer cancel()
	var calls atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for _, c := range conns {
		wg.Go(func() {
			for ctx.Err() == nil {
				if _, err := c.Runtime.Version(ctx, "v1"); err == nil {
					calls.Add(1)
				}
			}
		})
	}
	wg.Wait()
	return float64(calls.Load()) / time.Since(start).Seconds()
}

// rssMiB reads a process's resident set size.
func rssMiB(b *testing.B, pid int) float64 {
	b.Helper()
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		b.Fatal(err)
	}
	for line := range strings.Lines(string(data)) {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kib, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			if err != nil {
				b.Fatal(err)
			}
			return kib / 1024
		}
	}
	b.Fatal("no VmRSS")
	return 0
}
