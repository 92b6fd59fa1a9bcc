package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podgate/podgate/test/rig"
)

// BenchmarkContainerResources measures what podgate adds to CreateContainer and
// UpdateContainerResources on the real stack (the resources stages: recording what was asked,
// memory QoS where it applies, starting the cgroup check). Each iteration creates a container
// with a CPU quota and a memory limit in a sandbox of its path and resizes it, directly on
// containerd and through podgate, so both see the same machine. It reports the medians, their
// difference, and podgate's background check per container from its
// podgate_resources_verification_duration_seconds histogram.
//
//	go test -run '^$' -bench ContainerResources -benchtime 60x ./test/e2e
func BenchmarkContainerResources(b *testing.B) {
	n := startNode(b)
	ctx := b.Context()
	sandboxes := map[string]*runtimeapi.PodSandboxConfig{}
	ids := map[string]string{}
	clients := map[string]*rig.Client{"direct": n.direct, "podgate": n.through}
	for path, c := range clients {
		sb := &runtimeapi.PodSandboxConfig{
			Metadata: &runtimeapi.PodSandboxMetadata{Name: "bench-" + path, Namespace: "bench", Uid: "uid-bench-" + path},
			Linux:    &runtimeapi.LinuxPodSandboxConfig{},
		}
		id, err := c.Runtime.RunPodSandbox(ctx, sb, "")
		if err != nil {
			b.Fatal(err)
		}
		sandboxes[path], ids[path] = sb, id
	}
	create, update := map[string][]time.Duration{}, map[string][]time.Duration{}
	i, checks := 0, 0
	for iter := 0; b.Loop(); iter++ {
		// Alternate which path goes first: each path's cleanup (shim exit, unmounts) loads
		// containerd while the other path's next calls run.
		order := []string{"direct", "podgate"}
		if iter%2 == 1 {
			order[0], order[1] = order[1], order[0]
		}
		for _, path := range order {
			c := clients[path]
			i++
			start := time.Now()
			ctr, err := c.Runtime.CreateContainer(ctx, ids[path], &runtimeapi.ContainerConfig{
				Metadata: &runtimeapi.ContainerMetadata{Name: fmt.Sprintf("c%d", i)},
				Image:    &runtimeapi.ImageSpec{Image: rig.BusyboxImage},
				Command:  []string{"sleep", "3600"},
				Linux: &runtimeapi.LinuxContainerConfig{Resources: &runtimeapi.LinuxContainerResources{
					CpuPeriod: 100000, CpuQuota: 50000, CpuShares: 512, MemoryLimitInBytes: 64 << 20,
				}},
			}, sandboxes[path])
			create[path] = append(create[path], time.Since(start))
			if err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			if err := c.Runtime.StartContainer(ctx, ctr); err != nil {
				b.Fatal(err)
			}
			// The background check must not load containerd during the next timed call. The
			// wait scrapes podgate's metrics; it is done on both paths, so that both timed calls
			// follow the same work.
			if path == "podgate" {
				checks++
			}
			waitChecks(b, n, "start", checks)
			b.StartTimer()
			start = time.Now()
			err = c.Runtime.UpdateContainerResources(ctx, ctr, &runtimeapi.ContainerResources{Linux: &runtimeapi.LinuxContainerResources{
				CpuPeriod: 100000, CpuQuota: 20000, CpuShares: 256, MemoryLimitInBytes: 128 << 20,
			}})
			update[path] = append(update[path], time.Since(start))
			if err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			waitChecks(b, n, "update", checks)
			if err := c.Runtime.StopContainer(ctx, ctr, 0); err != nil {
				b.Fatal(err)
			}
			if err := c.Runtime.RemoveContainer(ctx, ctr); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
	}
	b.StopTimer()
	for name, lat := range map[string]map[string][]time.Duration{"create": create, "update": update} {
		direct, proxied := ms(percentile(lat["direct"], 50)), ms(percentile(lat["podgate"], 50))
		b.ReportMetric(direct, name+"-direct-p50-ms")
		b.ReportMetric(proxied, name+"-podgate-p50-ms")
		b.ReportMetric(proxied-direct, name+"-added-ms")
	}
	families := metricFamilies(b, n.podgate)
	for _, m := range families["podgate_resources_verification_duration_seconds"].GetMetric() {
		h := m.GetHistogram()
		if h.GetSampleCount() > 0 {
			b.ReportMetric(h.GetSampleSum()*1000/float64(h.GetSampleCount()), "verify-ms/check")
		}
	}
	for _, m := range families["podgate_cri_request_duration_seconds"].GetMetric() {
		for _, l := range m.GetLabel() {
			if v := l.GetValue(); v == "CreateContainer" || v == "UpdateContainerResources" {
				h := m.GetHistogram()
				b.ReportMetric(h.GetSampleSum()*1000/float64(h.GetSampleCount()), v+"-server-mean-ms")
			}
		}
	}
	// podgate's own time per call, measured inside it: what it adds beyond the proxy hop.
	for _, m := range families["podgate_resources_stage_duration_seconds"].GetMetric() {
		h := m.GetHistogram()
		if h.GetSampleCount() > 0 {
			b.ReportMetric(h.GetSampleSum()*1e6/float64(h.GetSampleCount()), m.GetLabel()[0].GetValue()+"-own-µs")
		}
	}
}

// waitChecks waits until podgate has checked want containers' cgroups after the call named.
func waitChecks(b *testing.B, n *node, after string, want int) {
	b.Helper()
	waitWithin(b, time.Minute, fmt.Sprintf("%d cgroup checks after %s", want, after), func() bool {
		text, err := n.podgate.Metrics(b.Context())
		if err != nil {
			return false
		}
		var sum float64
		for line := range strings.Lines(text) {
			if strings.HasPrefix(line, `podgate_resources_verifications_total{after="`+after+`"`) {
				var v float64
				if _, err := fmt.Sscanf(line[strings.LastIndexByte(line, ' ')+1:], "%g", &v); err == nil {
					sum += v
				}
			}
		}
		return sum >= float64(want)
	})
}
