package e2e

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podgate/podgate/test/harness"
	"github.com/podgate/podgate/test/rig"
	"github.com/podgate/podgate/test/testfs"
)

// fakeItems is how many containers and sandboxes the fake runtime holds: a node's worth of
// containers, and as many sandboxes, so that both lists are ≈ 0.5–0.7 MB answers.
const fakeItems = 1000

// fakeListRounds is how many times each list is called per path, alternating.
const fakeListRounds = 200

// fakeUpdateRounds is how many UpdateContainerResources calls (a method podgate intercepts) are
// made per path, alternating.
const fakeUpdateRounds = 1000

// BenchmarkForwarderFakeRuntime compares direct, test/forwarder -bytes (a relay that copies
// bytes without looking at them: the floor of any relay), test/forwarder and podgate (default
// configuration) in front of a fake runtime (test/e2e/fakeruntime, cri-api's fake in a process
// of its own, holding 1,000 containers and 1,000 sandboxes shaped like a kubelet's): the
// runtime's own work per call is small, so what each proxy adds shows. Every phase alternates
// the paths, in an order drawn afresh for each round (roundOrder):
//
//   - Version, b.N rounds: p50 and p99 per path; each proxy's addition over direct at p50;
//   - ListContainers and ListPodSandbox of the 1,000, 200 rounds each: p50 per path, its
//     ratio to direct (the cost of carrying a large answer across one more hop), and podgate's
//     to the byte relay's (podgate/bytes: what podgate costs over the floor);
//   - UpdateContainerResources, which podgate intercepts, 1,000 rounds: p50 per path and
//     podgate's difference to the forwarder's; the same for CreateContainer with a
//     kubelet-shaped request;
//   - 64 clients per path calling Version, in 0.5 s slices, 2 s per path: calls per second,
//     their ratio to direct, and each proxy's CPU time per call;
//   - both proxies' RSS;
//   - StreamContainers of 30,000 containers in pages of 1,000 (a second fake runtime, with
//     podgate and the byte relay in front of it too), 20 rounds per path: p50 per path, its
//     ratio to direct, and podgate's to the byte relay's;
//   - the CPU time each proxy spent per list call (containers, sandboxes, streamed).
//
// With PODGATE_BENCH_BEFORE=BIN it runs BIN, an earlier podgate, beside today's as a fourth
// path ("before") in every phase: before and after in one run, on the same backends.
//
// With PODGATE_BENCH_PROFILE=DIR it then profiles both proxies for 10 s under 4 clients each
// calling ListContainers, alternating in slices (DIR/list/{podgate,forwarder}-{cpu,allocs}.pprof),
// and the same with the kubelet-shaped CreateContainer (DIR/create/…).
// It needs root (podgate runs as root) but not the rig.
//
//	go test -run '^$' -bench ForwarderFakeRuntime -benchtime 3000x -count 3 ./test/e2e
func BenchmarkForwarderFakeRuntime(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root: podgate runs as root (state directory, cgroups, node sysctls)")
	}
	profileDir := os.Getenv("PODGATE_BENCH_PROFILE")
	fake := startFakeRuntime(b, fakeItems, fakeItems)
	var args []string
	if profileDir != "" {
		args = []string{"--config", writeConfig(b, "enableProfilingHandler: true\n")}
	}
	pg := startPodgate(b, fake.endpoint, args...)
	fwd := startForwarder(b, fake.endpoint, profileDir != "")
	byteRelay := startByteRelay(b, fake.endpoint)
	paths := []string{"direct", "bytes", "forwarder", "podgate"}
	endpoints := map[string]string{"direct": fake.endpoint, "bytes": byteRelay.Endpoint, "forwarder": fwd.Endpoint, "podgate": pg.Endpoint}
	pids := map[string]int{"bytes": byteRelay.PID(), "forwarder": fwd.PID(), "podgate": pg.PID()}
	beforeBin := os.Getenv("PODGATE_BENCH_BEFORE")
	var before *harness.Podgate
	if beforeBin != "" {
		before = startPodgateBin(b, beforeBin, fake.endpoint, args...)
		paths = append(paths, "before")
		endpoints["before"], pids["before"] = before.Endpoint, before.PID()
	}
	clients := map[string]*rig.Client{}
	for path, e := range endpoints {
		clients[path] = rig.Connect(b, e)
	}
	// podgate's start-up rebuild reads every sandbox's status once: let it end first.
	waitRebuilt(b, pg)
	if before != nil {
		waitRebuilt(b, before)
	}
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
	us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
	for _, path := range paths {
		b.ReportMetric(us(percentile(lat[path], 50)), path+"-p50-µs")
		b.ReportMetric(us(percentile(lat[path], 99)), path+"-p99-µs")
	}
	for _, proxy := range paths[1:] {
		b.ReportMetric(us(percentile(lat[proxy], 50)-percentile(lat["direct"], 50)), proxy+"-added-p50-µs")
	}
	b.ReportMetric(float64(percentile(lat["podgate"], 99))/float64(percentile(lat["forwarder"], 99)), "podgate/forwarder-p99")

	lists := map[string]func(c *rig.Client) (proto.Message, error){
		"containers": func(c *rig.Client) (proto.Message, error) {
			l, err := c.Runtime.ListContainers(ctx, nil)
			if err == nil && len(l) != fakeItems {
				err = fmt.Errorf("%d containers, want %d", len(l), fakeItems)
			}
			return &runtimeapi.ListContainersResponse{Containers: l}, err
		},
		"sandboxes": func(c *rig.Client) (proto.Message, error) {
			l, err := c.Runtime.ListPodSandbox(ctx, nil)
			if err == nil && len(l) != fakeItems {
				err = fmt.Errorf("%d sandboxes, want %d", len(l), fakeItems)
			}
			return &runtimeapi.ListPodSandboxResponse{Items: l}, err
		},
	}
	for _, what := range []string{"containers", "sandboxes"} {
		var size int
		cpu := cpuTimes(b, pids)
		list := alternate(b, paths, fakeListRounds, func(_ int, path string) error {
			resp, err := lists[what](clients[path])
			size = proto.Size(resp)
			if err != nil {
				return fmt.Errorf("list %s: %w", what, err)
			}
			return nil
		})
		reportRatios(b, list, "list-"+what)
		b.ReportMetric(float64(size)/1000, "list-"+what+"-kB")
		reportCPUPerCall(b, pids, cpu, fakeListRounds, "list-"+what)
	}
	streamContainers(b, paths, args, beforeBin)

	// An intercepted call: podgate decodes UpdateContainerResources, runs its resources hook
	// and compares the answer; the runtime's own work is small.
	linux := &runtimeapi.LinuxContainerResources{CpuPeriod: 100000, CpuQuota: 20000, CpuShares: 256, MemoryLimitInBytes: 128 << 20}
	reportIntercepted(b, "update", alternate(b, paths, fakeUpdateRounds, func(iter int, path string) error {
		if err := clients[path].Runtime.UpdateContainerResources(ctx, fmt.Sprintf("c0%060x", iter%fakeItems), &runtimeapi.ContainerResources{Linux: linux}); err != nil {
			return fmt.Errorf("UpdateContainerResources: %w", err)
		}
		return nil
	}))

	// An intercepted call with a kubelet-shaped request: CreateContainer carries the sandbox's
	// config (labels, annotations) and the container's (20 environment variables), so what
	// podgate does with the message (decode, and the copy and comparison that tell whether an
	// interceptor changed it) shows beside the hop. The fake runtime keeps one container for
	// all of them (same name and attempt).
	sandbox, container := kubeletShapedCreate()
	reportIntercepted(b, "create", alternate(b, paths, fakeUpdateRounds, func(_ int, path string) error {
		if _, err := clients[path].Runtime.CreateContainer(ctx, fakeSandboxID, container, sandbox); err != nil {
			return fmt.Errorf("CreateContainer: %w", err)
		}
		return nil
	}))

	l := newLoad(b, endpoints, 64)
	results := l.run(b, paths, pids, loadSlice, 4)
	for path, r := range results {
		b.ReportMetric(r.rate(), path+"-64c-calls/s")
		if path != "direct" {
			b.ReportMetric(r.rate()/results["direct"].rate(), path+"-64c-ratio")
			b.ReportMetric(r.cpuPerCall(), path+"-cpu-µs/call")
		}
	}
	for proxy, pid := range pids {
		b.ReportMetric(procMemory(b, pid)["VmRSS"], proxy+"-rss-MiB")
	}

	if profileDir != "" {
		profiled := map[string]string{"forwarder": fwd.Endpoint, "podgate": pg.Endpoint}
		urls := map[string]string{"forwarder": fwd.PprofURL, "podgate": pg.MetricsURL}
		pids := map[string]int{"forwarder": fwd.PID(), "podgate": pg.PID()}
		if before != nil {
			profiled["before"], urls["before"], pids["before"] = before.Endpoint, before.MetricsURL, before.PID()
		}
		pl := newLoad(b, profiled, 4)
		pl.call = func(ctx context.Context, c *rig.Client) error {
			_, err := c.Runtime.ListContainers(ctx, nil)
			return err
		}
		profileUnderLoad(b, filepath.Join(profileDir, "list"), pl, pids, urls)
		pl.call = func(ctx context.Context, c *rig.Client) error {
			_, err := c.Runtime.CreateContainer(ctx, fakeSandboxID, container, sandbox)
			return err
		}
		profileUnderLoad(b, filepath.Join(profileDir, "create"), pl, pids, urls)
	}
}

// streamItems is how many containers the streamed list carries, and streamPage how many each of
// its messages: a large node's list as containerd 2.4 streams it.
const (
	streamItems  = 30000
	streamPage   = 1000
	streamRounds = 20
)

// streamContainers is the benchmark's StreamContainers phase: a fake runtime holding
// streamItems containers, streamed streamPage to a message, with podgate (and the earlier one,
// with beforeBin) in front of it; streamRounds rounds per path, alternating.
func streamContainers(b *testing.B, allPaths, args []string, beforeBin string) {
	b.Helper()
	fake := startFakeRuntime(b, streamItems, 1, "-stream-page", strconv.Itoa(streamPage))
	endpoints := map[string]string{"direct": fake.endpoint}
	pids := map[string]int{}
	paths := []string{"direct"}
	for _, path := range allPaths {
		var p *harness.Podgate
		switch path {
		case "bytes":
			r := startByteRelay(b, fake.endpoint)
			paths = append(paths, path)
			endpoints[path], pids[path] = r.Endpoint, r.PID()
			continue
		case "podgate":
			p = startPodgate(b, fake.endpoint, args...)
		case "before":
			p = startPodgateBin(b, beforeBin, fake.endpoint, args...)
		default:
			continue
		}
		waitRebuilt(b, p)
		paths = append(paths, path)
		endpoints[path], pids[path] = p.Endpoint, p.PID()
	}
	clients := map[string]runtimeapi.RuntimeServiceClient{}
	for path, e := range endpoints {
		conn, err := grpc.NewClient(e, grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(16<<20)))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { conn.Close() })
		clients[path] = runtimeapi.NewRuntimeServiceClient(conn)
	}
	var size int
	cpu := cpuTimes(b, pids)
	lat := alternate(b, paths, streamRounds, func(_ int, path string) error {
		st, err := clients[path].StreamContainers(b.Context(), &runtimeapi.StreamContainersRequest{})
		if err != nil {
			return err
		}
		n, bytes := 0, 0
		for {
			page, err := st.Recv()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return err
			}
			n += len(page.Containers)
			bytes += proto.Size(page)
		}
		if n != streamItems {
			return fmt.Errorf("StreamContainers: %d containers, want %d", n, streamItems)
		}
		size = bytes
		return nil
	})
	reportRatios(b, lat, "stream-containers")
	b.ReportMetric(float64(size)/1000, "stream-containers-kB")
	reportCPUPerCall(b, pids, cpu, streamRounds, "stream-containers")
}

// reportRatios reports a phase's p50 per path (name-p50-ms), its ratio to direct's, and
// podgate's to the byte relay's (podgate/bytes-name).
func reportRatios(b *testing.B, lat map[string][]time.Duration, name string) {
	b.Helper()
	direct := percentile(lat["direct"], 50)
	for path, l := range lat {
		p50 := percentile(l, 50)
		b.ReportMetric(ms(p50), path+"-"+name+"-p50-ms")
		if path != "direct" {
			b.ReportMetric(float64(p50)/float64(direct), path+"-"+name+"-ratio")
		}
	}
	if l, ok := lat["bytes"]; ok {
		b.ReportMetric(float64(percentile(lat["podgate"], 50))/float64(percentile(l, 50)), "podgate/bytes-"+name)
	}
}

// cpuTimes is each process's CPU time now.
func cpuTimes(b *testing.B, pids map[string]int) map[string]time.Duration {
	b.Helper()
	t := map[string]time.Duration{}
	for path, pid := range pids {
		t[path] = cpuTime(b, pid)
	}
	return t
}

// reportCPUPerCall reports the CPU time each proxy spent since since per call of a phase of
// calls calls per path, alternating (the other paths' calls cost it nothing).
func reportCPUPerCall(b *testing.B, pids map[string]int, since map[string]time.Duration, calls int, name string) {
	b.Helper()
	for path, pid := range pids {
		per := (cpuTime(b, pid) - since[path]) / time.Duration(calls)
		b.ReportMetric(float64(per)/float64(time.Microsecond), path+"-"+name+"-cpu-µs/call")
	}
}

// startPodgateBin is startPodgate with the binary bin, an earlier podgate.
func startPodgateBin(t testing.TB, bin, endpoint string, args ...string) *harness.Podgate {
	t.Helper()
	p, err := harness.Start(t.Context(), bin, harness.Options{Dir: testfs.ShortDir(t), RuntimeEndpoint: endpoint, Args: args})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if code, err := p.Stop(30 * time.Second); err != nil || code != 0 {
			t.Errorf("podgate (%s) stop: exit %d, %v", bin, code, err)
		}
	})
	return p
}

// alternate makes rounds rounds of call through every path, each round in its own order
// (roundOrder), and returns each path's durations; a failed call ends the benchmark.
func alternate(b *testing.B, paths []string, rounds int, call func(iter int, path string) error) map[string][]time.Duration {
	b.Helper()
	lat := map[string][]time.Duration{}
	for iter := range rounds {
		for _, path := range roundOrder(iter, paths) {
			start := time.Now()
			err := call(iter, path)
			lat[path] = append(lat[path], time.Since(start))
			if err != nil {
				b.Fatalf("round %d through %s: %v", iter, path, err)
			}
		}
	}
	return lat
}

// reportIntercepted reports an intercepted call's p50 per path (name-p50-µs) and podgate's
// difference to the forwarder's.
func reportIntercepted(b *testing.B, name string, lat map[string][]time.Duration) {
	for path, l := range lat {
		b.ReportMetric(float64(percentile(l, 50))/float64(time.Microsecond), path+"-"+name+"-p50-µs")
	}
	added := percentile(lat["podgate"], 50) - percentile(lat["forwarder"], 50)
	b.ReportMetric(float64(added)/float64(time.Microsecond), "podgate-"+name+"-vs-forwarder-p50-µs")
}

// fakeSandboxID is the first of the fake runtime's sandboxes (test/e2e/fakeruntime's ids).
var fakeSandboxID = fmt.Sprintf("5b%060x", 0)

// kubeletShapedCreate is a CreateContainer request's configs as a kubelet sends them for a
// Deployment's pod: the sandbox's labels and annotations, a container with 20 environment
// variables (a namespace's service links), labels, resources and a log path.
func kubeletShapedCreate() (*runtimeapi.PodSandboxConfig, *runtimeapi.ContainerConfig) {
	const uid = "8f14e45f-ceea-467f-a0e6-0123456789ab"
	sandbox := &runtimeapi.PodSandboxConfig{
		Metadata:     &runtimeapi.PodSandboxMetadata{Name: "web-0-7d9c8b6f5-x2k4p", Namespace: "default", Uid: uid},
		Hostname:     "web-0-7d9c8b6f5-x2k4p",
		LogDirectory: "/var/log/pods/default_web-0-7d9c8b6f5-x2k4p_" + uid,
		Labels: map[string]string{"app": "web", "pod-template-hash": "7d9c8b6f5", "io.kubernetes.pod.name": "web-0-7d9c8b6f5-x2k4p",
			"io.kubernetes.pod.namespace": "default", "io.kubernetes.pod.uid": uid},
		Annotations: map[string]string{"kubernetes.io/config.seen": "2026-11-26T10:00:00.000000000Z", "kubernetes.io/config.source": "api"},
		Linux:       &runtimeapi.LinuxPodSandboxConfig{CgroupParent: "/kubepods/burstable/pod" + uid},
	}
	envs := make([]*runtimeapi.KeyValue, 0, 20)
	for i := range 20 {
		envs = append(envs, &runtimeapi.KeyValue{Key: fmt.Sprintf("SERVICE_%d_PORT", i), Value: fmt.Appendf(nil, "tcp://10.96.0.%d:443", i+1)})
	}
	container := &runtimeapi.ContainerConfig{
		Metadata: &runtimeapi.ContainerMetadata{Name: "app"},
		Image:    &runtimeapi.ImageSpec{Image: "docker.io/library/busybox:1.36"},
		Command:  []string{"sleep", "3600"},
		Envs:     envs,
		Labels: map[string]string{"io.kubernetes.container.name": "app", "io.kubernetes.pod.name": "web-0-7d9c8b6f5-x2k4p",
			"io.kubernetes.pod.namespace": "default", "io.kubernetes.pod.uid": uid},
		Annotations: map[string]string{"io.kubernetes.container.hash": "5c1e2b3a", "io.kubernetes.container.restartCount": "0",
			"io.kubernetes.container.terminationMessagePath": "/dev/termination-log"},
		LogPath: "app/0.log",
		Linux: &runtimeapi.LinuxContainerConfig{Resources: &runtimeapi.LinuxContainerResources{
			CpuPeriod: 100000, CpuQuota: 20000, CpuShares: 256, MemoryLimitInBytes: 128 << 20}},
	}
	return sandbox, container
}

// fakeRuntime is test/e2e/fakeruntime, running.
type fakeRuntime struct {
	cmd      *exec.Cmd
	endpoint string
}

// startFakeRuntime builds and starts test/e2e/fakeruntime holding containers containers and
// sandboxes sandboxes; it stops at the benchmark's end.
func startFakeRuntime(b *testing.B, containers, sandboxes int, flags ...string) *fakeRuntime {
	b.Helper()
	dir := testfs.ShortDir(b)
	bin := harness.BuildProgram(b, "github.com/podgate/podgate/test/e2e/fakeruntime", dir, "fakeruntime")
	sock := filepath.Join(dir, "fake.sock")
	f := &fakeRuntime{
		cmd:      exec.Command(bin, append([]string{"-listen", sock, "-containers", fmt.Sprint(containers), "-sandboxes", fmt.Sprint(sandboxes)}, flags...)...),
		endpoint: "unix://" + sock,
	}
	out, err := f.cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	f.cmd.Stderr = os.Stderr
	if err := f.cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = f.cmd.Process.Kill(); _ = f.cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if strings.TrimSpace(line) != "ready" {
		b.Fatalf("fake runtime did not start: %q %v", line, err)
	}
	return f
}

// waitRebuilt waits until podgate has rebuilt its pod registry from the runtime.
func waitRebuilt(b *testing.B, p *harness.Podgate) {
	b.Helper()
	waitWithin(b, 2*time.Minute, "podgate's registry rebuild", func() bool {
		text, err := p.Metrics(b.Context())
		return err == nil && strings.Contains(text, `podgate_registry_rebuilds_total{result="ok"} 1`)
	})
}
