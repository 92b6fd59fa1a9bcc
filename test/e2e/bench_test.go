package e2e

import (
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podgate/podgate/test/harness"
	"github.com/podgate/podgate/test/scrape"
)

// BenchmarkRunPodSandbox measures what sysctl validation, defaults and verification add to
// RunPodSandbox on the real stack. Each iteration starts the same kind of pod (with
// net.ipv4.tcp_keepalive_time) directly on containerd and through podgate, so both see the
// same machine; only RunPodSandbox is timed. A sandbox costs about 100 ms of runc and CNI work
// with several ms of noise, so beside the two medians it reports podgate's own time per
// sandbox, by phase, from its podgate_sysctl_duration_seconds histogram: check (always on
// the call's path), verify (on it only with verify: fail; otherwise in the background).
//
//	go test -run '^$' -bench RunPodSandbox -benchtime 40x ./test/e2e
func BenchmarkRunPodSandbox(b *testing.B) {
	// repair (the default) verifies in the background; fail verifies inside RunPodSandbox.
	for _, policy := range []string{"repair", "fail"} {
		b.Run("verify="+policy, func(b *testing.B) {
			benchRunPodSandbox(b, "sysctls: {verify: "+policy+", podDefaults: {net.ipv4.tcp_fin_timeout: \"30\"}}\n")
		})
	}
}

func benchRunPodSandbox(b *testing.B, config string) {
	n := startNode(b, "--config", writeConfig(b, config))
	ctx := b.Context()
	lat := map[string][]time.Duration{}
	i := 0
	for b.Loop() {
		for _, path := range []string{"direct", "podgate"} {
			client := n.direct
			if path == "podgate" {
				client = n.through
			}
			i++
			name := fmt.Sprintf("bench-%d", i)
			sb := &runtimeapi.PodSandboxConfig{
				Metadata:     &runtimeapi.PodSandboxMetadata{Name: name, Namespace: "bench", Uid: name},
				LogDirectory: filepath.Join(n.rig.Dir, "pods", name),
				Linux:        &runtimeapi.LinuxPodSandboxConfig{Sysctls: map[string]string{"net.ipv4.tcp_keepalive_time": "600"}},
			}
			start := time.Now()
			id, err := client.Runtime.RunPodSandbox(ctx, sb, "")
			lat[path] = append(lat[path], time.Since(start))
			if err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			if err := client.Runtime.StopPodSandbox(ctx, id); err != nil {
				b.Fatal(err)
			}
			if err := client.Runtime.RemovePodSandbox(ctx, id); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
	}
	b.StopTimer()
	direct, proxied := ms(percentile(lat["direct"], 50)), ms(percentile(lat["podgate"], 50))
	b.ReportMetric(direct, "direct-p50-ms")
	b.ReportMetric(proxied, "podgate-p50-ms")
	b.ReportMetric(proxied/direct, "ratio-p50")

	families := metricFamilies(b, n.podgate)
	for _, m := range families["podgate_sysctl_duration_seconds"].GetMetric() {
		h := m.GetHistogram()
		// Per sandbox: the histogram's time over the sandboxes started through podgate.
		b.ReportMetric(h.GetSampleSum()*1000/float64(len(lat["podgate"])), "sysctl-"+m.GetLabel()[0].GetValue()+"-ms")
	}
	// The pipeline's own stages, per sandbox; forward is containerd's work and is left out.
	var own float64
	for _, m := range families["podgate_sandbox_stage_duration_seconds"].GetMetric() {
		if stage := m.GetLabel()[0].GetValue(); stage != "forward" {
			ms := m.GetHistogram().GetSampleSum() * 1000 / float64(len(lat["podgate"]))
			b.ReportMetric(ms, "stage-"+stage+"-ms")
			own += ms
		}
	}
	b.ReportMetric(own, "podgate-stages-ms")
}

// percentile returns the p-th percentile of d, which it sorts.
func percentile(d []time.Duration, p int) time.Duration {
	slices.Sort(d)
	return d[len(d)*p/100]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// metricFamilies reads and parses podgate's /metrics page.
func metricFamilies(b *testing.B, p *harness.Podgate) scrape.Metrics {
	b.Helper()
	m, err := p.Scrape(b.Context())
	if err != nil {
		b.Fatal(err)
	}
	return m
}
