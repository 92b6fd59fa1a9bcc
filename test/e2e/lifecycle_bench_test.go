package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podgate/podgate/test/harness"
	"github.com/podgate/podgate/test/rig"
)

// lifecycleCalls are the CRI calls of one pod's life as the kubelet makes them, in order: the
// status calls come right after the call that created what they ask about, as the kubelet's
// SyncPod and PLEG make them.
var lifecycleCalls = []string{
	"RunPodSandbox", "PodSandboxStatus", "CreateContainer", "StartContainer", "ContainerStatus",
	"StopContainer", "RemoveContainer", "StopPodSandbox", "RemovePodSandbox",
}

// lifecyclePaths are the ways to the rig's containerd the benchmark compares.
var lifecyclePaths = []string{"direct", "forwarder", "podgate", "podgate-all"}

// allStagesConfig turns on every stage that works without a Kubernetes API: a pod default
// sysctl (so that every sandbox has a sysctl to verify, in the background after
// RunPodSandbox, with CreateContainer waiting for it), and the resources verification (the
// cgroup check after StartContainer, in the background; verify: fail for
// UpdateContainerResources). Memory QoS and DRA need the API and stay off.
const allStagesConfig = `sysctls:
  podDefaults: {net.ipv4.tcp_keepalive_time: "600"}
  verify: repair
resources:
  verify: fail
`

// BenchmarkCRILifecycle times each CRI call of pod and container lifecycles as the kubelet
// drives them (RunPodSandbox, PodSandboxStatus, CreateContainer, StartContainer,
// ContainerStatus, StopContainer, RemoveContainer, StopPodSandbox, RemovePodSandbox) on the
// rig's real containerd, four ways in one run: directly, through test/forwarder (the minimal
// raw gRPC passthrough), through podgate with its default configuration, and through podgate
// with every stage on (allStagesConfig). Each iteration runs one whole lifecycle per path,
// one pod with one container at a time, the paths in each round's order (roundOrder); no
// pause between the calls, so that work a proxy leaves running after answering meets the
// caller's next call.
//
// It reports every call's p50 and p99 per path (CALL-PATH-p50-ms), their ratios to direct
// (CALL-PATH/direct-p50), each podgate's p50 difference to the forwarder
// (CALL-PATH-vs-forwarder-p50-ms), and, from each podgate's metrics, its own time in the
// intercepted calls and in the work it does in the background.
//
//	go test -run '^$' -bench CRILifecycle -benchtime 40x -count 2 ./test/e2e
func BenchmarkCRILifecycle(b *testing.B) {
	r := rig.Start(b) // skips unless root with the rig installed
	pg := startPodgate(b, r.Endpoint)
	pgAll := startPodgate(b, r.Endpoint, "--config", writeConfig(b, allStagesConfig))
	fwd := startForwarder(b, r.Endpoint, false)
	clients := map[string]*rig.Client{
		"direct": rig.Connect(b, r.Endpoint), "forwarder": rig.Connect(b, fwd.Endpoint),
		"podgate": rig.Connect(b, pg.Endpoint), "podgate-all": rig.Connect(b, pgAll.Endpoint),
	}
	lat := map[string]map[string][]time.Duration{}
	for _, call := range lifecycleCalls {
		lat[call] = map[string][]time.Duration{}
	}
	n := 0
	for iter := 0; b.Loop(); iter++ {
		for _, path := range roundOrder(iter, lifecyclePaths) {
			n++
			if err := lifecycle(b.Context(), r, clients[path], fmt.Sprintf("lc-%d", n), func(call string, d time.Duration) {
				lat[call][path] = append(lat[call][path], d)
			}); err != nil {
				b.Fatalf("%s: %v", path, err)
			}
		}
	}
	b.StopTimer()
	for _, call := range lifecycleCalls {
		reportLifecycleCall(b, call, lat[call])
	}
	for path, p := range map[string]*harness.Podgate{"podgate": pg, "podgate-all": pgAll} {
		reportPodgateOwnTime(b, path, p, len(lat["RunPodSandbox"][path]))
	}
}

// reportLifecycleCall reports one call's p50 and p99 per path, their ratios to direct, and
// each podgate's p50 difference to the forwarder's.
func reportLifecycleCall(b *testing.B, call string, byPath map[string][]time.Duration) {
	b.Helper()
	p := map[string][2]time.Duration{}
	for _, path := range lifecyclePaths {
		p[path] = [2]time.Duration{percentile(byPath[path], 50), percentile(byPath[path], 99)}
		b.ReportMetric(ms(p[path][0]), call+"-"+path+"-p50-ms")
		b.ReportMetric(ms(p[path][1]), call+"-"+path+"-p99-ms")
	}
	for _, path := range lifecyclePaths[1:] {
		b.ReportMetric(float64(p[path][0])/float64(p["direct"][0]), call+"-"+path+"/direct-p50")
		b.ReportMetric(float64(p[path][1])/float64(p["direct"][1]), call+"-"+path+"/direct-p99")
	}
	for _, path := range []string{"podgate", "podgate-all"} {
		b.ReportMetric(ms(p[path][0]-p["forwarder"][0]), call+"-"+path+"-vs-forwarder-p50-ms")
	}
}

// reportPodgateOwnTime reports, per sandbox, what podgate's metrics say it spent of its own:
// the sandbox pipeline's stages (forward, containerd's part, left out), the sysctl
// verification and CreateContainer's wait for it, its own part of CreateContainer, and the
// cgroup check after StartContainer (in the background).
func reportPodgateOwnTime(b *testing.B, path string, p *harness.Podgate, sandboxes int) {
	b.Helper()
	families := metricFamilies(b, p)
	perSandbox := func(h *dto.Histogram) float64 { return h.GetSampleSum() * 1000 / float64(sandboxes) }
	var stages float64
	for _, m := range families["podgate_sandbox_stage_duration_seconds"].GetMetric() {
		if label(m, "stage") != "forward" {
			stages += perSandbox(m.GetHistogram())
		}
	}
	b.ReportMetric(stages, path+"-own-sandbox-stages-ms")
	for _, m := range families["podgate_sysctl_duration_seconds"].GetMetric() {
		b.ReportMetric(perSandbox(m.GetHistogram()), path+"-own-sysctl-"+label(m, "phase")+"-ms")
	}
	for _, m := range families["podgate_resources_stage_duration_seconds"].GetMetric() {
		if label(m, "method") == "CreateContainer" {
			b.ReportMetric(perSandbox(m.GetHistogram()), path+"-own-CreateContainer-ms")
		}
	}
	for _, m := range families["podgate_resources_verification_duration_seconds"].GetMetric() {
		b.ReportMetric(perSandbox(m.GetHistogram()), path+"-background-cgroup-check-ms")
	}
}

// label is the value of m's label name.
func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// lifecycle runs one pod's life through c as the kubelet does, calling took with each call's
// time: the sandbox and its status, a container created, started, its status, stopped
// gracefully (it exits on SIGTERM, as a well-behaved app does) and removed, then the sandbox
// stopped and removed. The pod and container carry the kubelet's labels, annotations and
// limits.
func lifecycle(ctx context.Context, r *rig.Rig, c *rig.Client, name string, took func(call string, d time.Duration)) error {
	timed := func(call string, fn func() error) error {
		start := time.Now()
		err := fn()
		took(call, time.Since(start))
		if err != nil {
			return fmt.Errorf("%s %s: %w", call, name, err)
		}
		return nil
	}
	sb := lifecycleSandbox(r, name)
	var id, ctrID string
	steps := []struct {
		call string
		fn   func() error
	}{
		{"RunPodSandbox", func() (err error) { id, err = c.Runtime.RunPodSandbox(ctx, sb, ""); return err }},
		{"PodSandboxStatus", func() error { _, err := c.Runtime.PodSandboxStatus(ctx, id, false); return err }},
		{"CreateContainer", func() (err error) {
			ctrID, err = c.Runtime.CreateContainer(ctx, id, lifecycleContainer(sb), sb)
			return err
		}},
		{"StartContainer", func() error { return c.Runtime.StartContainer(ctx, ctrID) }},
		{"ContainerStatus", func() error { _, err := c.Runtime.ContainerStatus(ctx, ctrID, false); return err }},
		{"StopContainer", func() error { return c.Runtime.StopContainer(ctx, ctrID, 30) }},
		{"RemoveContainer", func() error { return c.Runtime.RemoveContainer(ctx, ctrID) }},
		{"StopPodSandbox", func() error { return c.Runtime.StopPodSandbox(ctx, id) }},
		{"RemovePodSandbox", func() error { return c.Runtime.RemovePodSandbox(ctx, id) }},
	}
	for _, s := range steps {
		if err := timed(s.call, s.fn); err != nil {
			return err
		}
	}
	return nil
}

// lifecycleSandbox is pod name's sandbox as the kubelet (1.36, cgroupfs driver) asks for it.
func lifecycleSandbox(r *rig.Rig, name string) *runtimeapi.PodSandboxConfig {
	uid := "uid-" + name
	return &runtimeapi.PodSandboxConfig{
		Metadata:     &runtimeapi.PodSandboxMetadata{Name: name, Namespace: "bench", Uid: uid},
		Hostname:     name,
		LogDirectory: filepath.Join(r.Dir, "pods", "bench_"+name+"_"+uid),
		DnsConfig:    &runtimeapi.DNSConfig{Searches: []string{"bench.svc.cluster.local", "svc.cluster.local", "cluster.local"}, Options: []string{"ndots:5"}},
		Labels: map[string]string{
			"app":                         "bench",
			"io.kubernetes.pod.name":      name,
			"io.kubernetes.pod.namespace": "bench",
			"io.kubernetes.pod.uid":       uid,
			"pod-template-hash":           "5d4b9c7f8d",
		},
		Annotations: map[string]string{
			"kubernetes.io/config.seen":   time.Now().Format(time.RFC3339Nano),
			"kubernetes.io/config.source": "api",
		},
		Linux: &runtimeapi.LinuxPodSandboxConfig{
			SecurityContext: &runtimeapi.LinuxSandboxSecurityContext{
				NamespaceOptions: &runtimeapi.NamespaceOption{Pid: runtimeapi.NamespaceMode_CONTAINER},
			},
			Resources: &runtimeapi.LinuxContainerResources{CpuPeriod: 100000, CpuQuota: 10000, CpuShares: 102, MemoryLimitInBytes: 32 << 20},
		},
	}
}

// lifecycleContainer is the pod's one container, as the kubelet asks for it: a process that
// exits on SIGTERM, so that StopContainer's grace period is not waited out.
func lifecycleContainer(sb *runtimeapi.PodSandboxConfig) *runtimeapi.ContainerConfig {
	md := sb.GetMetadata()
	return &runtimeapi.ContainerConfig{
		Metadata: &runtimeapi.ContainerMetadata{Name: "app"},
		Image:    &runtimeapi.ImageSpec{Image: rig.BusyboxImage},
		Command:  []string{"/bin/sh", "-c", "trap 'exit 0' TERM; sleep 3600 & wait"},
		Envs:     []*runtimeapi.KeyValue{{Key: "KUBERNETES_SERVICE_HOST", Value: []byte("10.96.0.1")}, {Key: "KUBERNETES_SERVICE_PORT", Value: []byte("443")}},
		Labels: map[string]string{
			"io.kubernetes.container.name": "app",
			"io.kubernetes.pod.name":       md.GetName(),
			"io.kubernetes.pod.namespace":  md.GetNamespace(),
			"io.kubernetes.pod.uid":        md.GetUid(),
		},
		Annotations: map[string]string{
			"io.kubernetes.container.hash":                     "3c4d5e6f",
			"io.kubernetes.container.restartCount":             "0",
			"io.kubernetes.container.terminationMessagePath":   "/dev/termination-log",
			"io.kubernetes.container.terminationMessagePolicy": "File",
			"io.kubernetes.pod.terminationGracePeriod":         "30",
		},
		LogPath: "app/0.log",
		Linux: &runtimeapi.LinuxContainerConfig{Resources: &runtimeapi.LinuxContainerResources{
			CpuPeriod: 100000, CpuQuota: 10000, CpuShares: 102, MemoryLimitInBytes: 32 << 20, OomScoreAdj: 999,
		}},
	}
}
