package e2e

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podgate/podgate/test/procstat"
	"github.com/podgate/podgate/test/rig"
)

// rssPods is the kubelet's default maxPods: issue 10's target is podgate's RSS on a full node.
const rssPods = 110

// BenchmarkRSS110Pods measures podgate's memory on a node running 110 pods. Each iteration
// starts 110 pods through podgate as the kubelet does (RunPodSandbox, CreateContainer,
// StartContainer, with the kubelet's labels and annotations), eight at a time; waits until
// podgate's background check of every container is done; then does what the kubelet's PLEG
// and stats loops do on such a node (list sandboxes and containers, each pod's and
// container's status, the container stats) and reads podgate's memory: VmRSS, RssAnon and
// RssFile from /proc/PID/status, and the Go runtime's view from podgate's /metrics (heap in
// use, idle and released heap, stacks, everything the runtime took from the OS, goroutines).
// It removes the pods afterwards. It also reports podgate's RSS before the first pod, and the
// CPU time and GC cycles podgate spent over the whole run (the price of a smaller heap).
//
// The podgate binary is dropped from the page cache first, as on a node after a reboot: the
// kernel maps the file pages around each one touched that are already cached (fault-around),
// so a binary the linker has just written, cached whole, shows ≈ 5–6 MiB more RssFile.
//
//	go test -run '^$' -bench RSS110Pods -benchtime 1x -count 3 ./test/e2e
func BenchmarkRSS110Pods(b *testing.B) {
	if podgateBin != "" { // empty when the package's tests skip: not root, no rig
		dropFromPageCache(b, podgateBin)
	}
	n := startNode(b)
	ctx := b.Context()
	idle := procMemory(b, n.podgate.PID())
	var mem map[string]float64
	var own map[string]float64
	for iter := 0; b.Loop(); iter++ {
		pods := startRSSPods(b, n, iter)
		kubeletSteadyState(b, n.through, pods)
		b.StopTimer()
		mem = procMemory(b, n.podgate.PID())
		own = goMemory(b, n)
		// The stop and removal, as the kubelet does them; the rig would also remove what is
		// left, but then podgate would not see the removals.
		removeRSSPods(b, n.through, pods)
		b.StartTimer()
	}
	b.StopTimer()
	for _, k := range []string{"VmRSS", "RssAnon", "RssFile"} {
		b.ReportMetric(idle[k], "idle-"+strings.ToLower(k)+"-MiB")
	}
	for _, k := range []string{"VmRSS", "RssAnon", "RssFile"} {
		b.ReportMetric(mem[k], strings.ToLower(k)+"-MiB")
	}
	for k, v := range own {
		b.ReportMetric(v, k)
	}
	left, err := n.direct.Runtime.ListPodSandbox(ctx, nil)
	if err != nil {
		b.Fatal(err)
	}
	if len(left) != 0 {
		b.Errorf("%d sandboxes left after the removal", len(left))
	}
}

// BenchmarkRSSUnderLoad is the other side of podgate's memory settings: 64 clients, each on
// its own connection, call ListContainers without pause for 10 s per iteration, and it reports
// podgate's CPU time per call and GC cycles over those seconds (from /metrics), and its RSS
// after them. Run it with GOGC=100 and without to see what podgate's GOGC=50 costs.
//
//	go test -run '^$' -bench RSSUnderLoad -benchtime 1x -count 2 ./test/e2e
//	GOGC=100 go test -run '^$' -bench RSSUnderLoad -benchtime 1x -count 2 ./test/e2e
func BenchmarkRSSUnderLoad(b *testing.B) {
	if podgateBin != "" {
		dropFromPageCache(b, podgateBin)
	}
	n := startNode(b)
	conns := make([]*rig.Client, 64)
	for i := range conns {
		conns[i] = rig.Connect(b, n.podgate.Endpoint)
	}
	for b.Loop() {
		before := goMemory(b, n)
		var calls, failed atomic.Int64
		var wg sync.WaitGroup
		start := time.Now()
		// No call is cut off at the end: each client makes no new call after 10 s.
		end := start.Add(10 * time.Second)
		for _, c := range conns {
			wg.Go(func() {
				for time.Now().Before(end) {
					if _, err := c.Runtime.ListContainers(b.Context(), nil); err != nil {
						failed.Add(1)
						continue
					}
					calls.Add(1)
				}
			})
		}
		wg.Wait()
		took := time.Since(start)
		b.StopTimer()
		if failed.Load() > 0 {
			b.Fatalf("%d ListContainers calls failed", failed.Load())
		}
		after := goMemory(b, n)
		mem := procMemory(b, n.podgate.PID())
		b.ReportMetric(float64(calls.Load())/took.Seconds(), "calls/s")
		b.ReportMetric((after["cpu-s"]-before["cpu-s"])*1e6/float64(calls.Load()), "cpu-µs/call")
		b.ReportMetric(after["gc-cycles"]-before["gc-cycles"], "gc-cycles")
		b.ReportMetric(mem["VmRSS"], "vmrss-MiB")
		b.ReportMetric(mem["RssAnon"], "rssanon-MiB")
		b.StartTimer()
	}
}

// rssPod is one pod the benchmark started.
type rssPod struct {
	sandbox   *runtimeapi.PodSandboxConfig
	id, ctrID string
}

// startRSSPods starts rssPods pods through podgate, eight at a time (the kubelet starts pods in
// parallel; two cores bound what helps), and waits for podgate's background cgroup check of
// each container.
func startRSSPods(b *testing.B, n *node, iter int) []rssPod {
	b.Helper()
	pods := make([]rssPod, rssPods)
	err := eightAtATime(len(pods), func(i int) error {
		var err error
		pods[i], err = startRSSPod(b.Context(), n, fmt.Sprintf("rss-%d-%d", iter, i))
		return err
	})
	if err != nil {
		// Remove the pods that did start, through podgate; the rig removes what is left.
		removeRSSPods(b, n.through, pods)
		b.Fatal(err)
	}
	waitChecks(b, n, "start", rssPods*(iter+1))
	return pods
}

// startRSSPod starts one pod with one running container, with the labels and annotations the
// kubelet (1.36, cgroupfs driver) gives them.
func startRSSPod(ctx context.Context, n *node, name string) (rssPod, error) {
	uid := "uid-" + name
	sb := &runtimeapi.PodSandboxConfig{
		Metadata:     &runtimeapi.PodSandboxMetadata{Name: name, Namespace: "rss", Uid: uid},
		Hostname:     name,
		LogDirectory: filepath.Join(n.rig.Dir, "pods", "rss_"+name+"_"+uid),
		DnsConfig:    &runtimeapi.DNSConfig{Searches: []string{"rss.svc.cluster.local", "svc.cluster.local", "cluster.local"}, Options: []string{"ndots:5"}},
		Labels: map[string]string{
			"app":                         "rss",
			"io.kubernetes.pod.name":      name,
			"io.kubernetes.pod.namespace": "rss",
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
	id, err := n.through.Runtime.RunPodSandbox(ctx, sb, "")
	if err != nil {
		return rssPod{}, fmt.Errorf("RunPodSandbox %s: %w", name, err)
	}
	p := rssPod{sandbox: sb, id: id}
	ctrID, err := n.through.Runtime.CreateContainer(ctx, id, &runtimeapi.ContainerConfig{
		Metadata: &runtimeapi.ContainerMetadata{Name: "app"},
		Image:    &runtimeapi.ImageSpec{Image: rig.BusyboxImage},
		Command:  []string{"sleep", "3600"},
		Envs:     []*runtimeapi.KeyValue{{Key: "KUBERNETES_SERVICE_HOST", Value: []byte("10.96.0.1")}, {Key: "KUBERNETES_SERVICE_PORT", Value: []byte("443")}},
		Labels: map[string]string{
			"io.kubernetes.container.name": "app",
			"io.kubernetes.pod.name":       name,
			"io.kubernetes.pod.namespace":  "rss",
			"io.kubernetes.pod.uid":        uid,
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
	}, sb)
	if err != nil {
		return p, fmt.Errorf("CreateContainer %s: %w", name, err)
	}
	p.ctrID = ctrID
	if err := n.through.Runtime.StartContainer(ctx, ctrID); err != nil {
		return p, fmt.Errorf("StartContainer %s: %w", name, err)
	}
	return p, nil
}

// kubeletSteadyState does a few rounds of what the kubelet does on a full node: the PLEG's
// relist (ListPodSandbox, ListContainers, then each pod's sandbox and container status) and the
// container stats list of the summary API (ListPodSandboxStats needs the pod cgroups the kubelet
// would make, which the benchmark leaves out so as to leave nothing behind). The calls are made one after another, not paced at the
// kubelet's 1 s: what matters here is what passing them leaves in podgate, not their rate.
func kubeletSteadyState(b *testing.B, c *rig.Client, pods []rssPod) {
	b.Helper()
	ctx := b.Context()
	for range 5 {
		sandboxes, err := c.Runtime.ListPodSandbox(ctx, nil)
		if err != nil {
			b.Fatal(err)
		}
		containers, err := c.Runtime.ListContainers(ctx, nil)
		if err != nil {
			b.Fatal(err)
		}
		if len(sandboxes) < len(pods) || len(containers) < len(pods) {
			b.Fatalf("lists hold %d sandboxes and %d containers, want %d each", len(sandboxes), len(containers), len(pods))
		}
		for _, p := range pods {
			if _, err := c.Runtime.PodSandboxStatus(ctx, p.id, false); err != nil {
				b.Fatal(err)
			}
			if _, err := c.Runtime.ContainerStatus(ctx, p.ctrID, false); err != nil {
				b.Fatal(err)
			}
		}
		if _, err := c.Runtime.ListContainerStats(ctx, nil); err != nil {
			b.Fatal(err)
		}
	}
}

// removeRSSPods stops and removes pods through podgate as the kubelet does, eight at a time.
func removeRSSPods(b *testing.B, c *rig.Client, pods []rssPod) {
	b.Helper()
	// The benchmark's context may be over when a cleanup runs.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(b.Context()), 5*time.Minute)
	defer cancel()
	err := eightAtATime(len(pods), func(i int) error {
		p := pods[i]
		if p.id == "" {
			return nil
		}
		if p.ctrID != "" {
			if err := c.Runtime.StopContainer(ctx, p.ctrID, 0); err != nil {
				return err
			}
			if err := c.Runtime.RemoveContainer(ctx, p.ctrID); err != nil {
				return err
			}
		}
		if err := c.Runtime.StopPodSandbox(ctx, p.id); err != nil {
			return err
		}
		return c.Runtime.RemovePodSandbox(ctx, p.id)
	})
	if err != nil {
		b.Errorf("remove pods: %v", err)
	}
}

// eightAtATime calls do(i) for each i below n, eight at a time, and returns the errors joined.
func eightAtATime(n int, do func(i int) error) error {
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
		sem  = make(chan struct{}, 8)
	)
	for i := range n {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			if err := do(i); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// dropFromPageCache asks the kernel to drop a file's cached pages (procstat.DropFromPageCache).
func dropFromPageCache(b *testing.B, path string) {
	b.Helper()
	if err := procstat.DropFromPageCache(path); err != nil {
		b.Fatal(err)
	}
}

// procMemory reads VmRSS, RssAnon and RssFile (and RssShmem) of a process, in MiB.
func procMemory(b *testing.B, pid int) map[string]float64 {
	b.Helper()
	mem, err := procstat.Memory(pid)
	if err != nil {
		b.Fatal(err)
	}
	return mem
}

// goMemory is the Go runtime's view of podgate's memory, from its /metrics page, in MiB, its
// goroutines, and the CPU time and GC cycles it has spent so far.
func goMemory(b *testing.B, n *node) map[string]float64 {
	b.Helper()
	families := metricFamilies(b, n.podgate)
	value := func(name string) float64 {
		f, ok := families[name]
		if !ok || len(f.GetMetric()) == 0 {
			b.Fatalf("podgate's /metrics lacks %s", name)
		}
		m := f.GetMetric()[0]
		switch {
		case m.GetGauge() != nil:
			return m.GetGauge().GetValue()
		case m.GetCounter() != nil:
			return m.GetCounter().GetValue()
		}
		return m.GetUntyped().GetValue()
	}
	mem := map[string]float64{
		"goroutines": value("go_goroutines"),
		"cpu-s":      value("process_cpu_seconds_total"),
		"gc-cycles":  float64(families["go_gc_duration_seconds"].GetMetric()[0].GetSummary().GetSampleCount()),
	}
	for metric, unit := range map[string]string{
		"go_memstats_heap_inuse_bytes":    "heap-inuse-MiB",
		"go_memstats_heap_idle_bytes":     "heap-idle-MiB",
		"go_memstats_heap_released_bytes": "heap-released-MiB",
		"go_memstats_stack_inuse_bytes":   "stack-inuse-MiB",
		"go_memstats_sys_bytes":           "go-sys-MiB",
	} {
		mem[unit] = value(metric) / (1 << 20)
	}
	return mem
}
