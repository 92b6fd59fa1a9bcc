package cri

import (
	"context"
	"fmt"
	"path/filepath"
	"runtime"
	"slices"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	apitest "k8s.io/cri-api/pkg/apis/testing"
	"k8s.io/cri-client/pkg/fake"

	"github.com/podgate/podgate/test/testfs"
)

// The proxy's cost: the same backend (cri-client's fake runtime over real gRPC on a unix socket)
// called directly and through podgate, in one run. Compare the two paths with
//
//	go test -run '^$' -bench . -count 6 ./cri | tee bench.txt; benchstat -col /path bench.txt
//
// Results and targets are in BENCHMARKS.md.

func BenchmarkVersion(b *testing.B) {
	env := newBenchEnv(b, 0)
	for _, clients := range []int{1, 64} {
		for _, path := range []string{"direct", "podgate"} {
			b.Run(fmt.Sprintf("clients=%d/path=%s", clients, path), func(b *testing.B) {
				client := env.client(path)
				run(b, clients, func(ctx context.Context) error {
					_, err := client.Version(ctx, &runtimeapi.VersionRequest{Version: "v1"})
					return err
				})
			})
		}
	}
}

func BenchmarkListContainers(b *testing.B) {
	for _, n := range []int{0, 100, 1000} {
		env := newBenchEnv(b, n)
		for _, clients := range []int{1, 64} {
			for _, path := range []string{"direct", "podgate"} {
				b.Run(fmt.Sprintf("containers=%d/clients=%d/path=%s", n, clients, path), func(b *testing.B) {
					client := env.client(path)
					run(b, clients, func(ctx context.Context) error {
						resp, err := client.ListContainers(ctx, &runtimeapi.ListContainersRequest{})
						if err == nil && len(resp.Containers) != n {
							err = fmt.Errorf("got %d containers, want %d", len(resp.Containers), n)
						}
						return err
					})
				})
			}
		}
	}
}

type benchEnv struct {
	direct, podgate runtimeapi.RuntimeServiceClient
}

// newBenchEnv starts the fake runtime holding n containers shaped like the kubelet's (its
// labels and annotations), and podgate in front of it.
func newBenchEnv(b *testing.B, n int) *benchEnv {
	b.Helper()
	backend := filepath.Join(testfs.ShortDir(b), "fake.sock")
	f := fake.NewFakeRemoteRuntime()
	if err := f.Start("unix://" + backend); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(f.Stop)
	containers := make([]*apitest.FakeContainer, 0, n)
	for i := range n {
		containers = append(containers, kubeletContainer(i))
	}
	f.RuntimeService.SetFakeContainers(containers)
	_, proxy := proxyFor(b, backend, "", nil)
	return &benchEnv{
		direct:  runtimeapi.NewRuntimeServiceClient(dial(b, backend)),
		podgate: runtimeapi.NewRuntimeServiceClient(proxy),
	}
}

func (e *benchEnv) client(path string) runtimeapi.RuntimeServiceClient {
	if path == "direct" {
		return e.direct
	}
	return e.podgate
}

// run calls op b.N times from the given number of concurrent clients. With one client it also
// reports the median latency (p50-ns), the figure the foundation issue sets a target for.
func run(b *testing.B, clients int, op func(context.Context) error) {
	ctx := b.Context()
	if clients == 1 {
		lat := make([]time.Duration, 0, b.N)
		b.ResetTimer()
		for b.Loop() {
			start := time.Now()
			if err := op(ctx); err != nil {
				b.Fatal(err)
			}
			lat = append(lat, time.Since(start))
		}
		b.StopTimer()
		slices.Sort(lat)
		b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds()), "p50-ns")
		return
	}
	b.SetParallelism((clients + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := op(ctx); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

func kubeletContainer(i int) *apitest.FakeContainer {
	id := fmt.Sprintf("%064x", i)
	c := &apitest.FakeContainer{SandboxID: fmt.Sprintf("%064x", i/3)}
	c.Id = id
	c.Metadata = &runtimeapi.ContainerMetadata{Name: fmt.Sprintf("app-%d", i), Attempt: 1}
	c.Image = &runtimeapi.ImageSpec{Image: "sha256:" + id}
	c.ImageRef = "sha256:" + id
	c.State = runtimeapi.ContainerState_CONTAINER_RUNNING
	c.CreatedAt = time.Now().UnixNano()
	c.Labels = map[string]string{
		"io.kubernetes.container.name": fmt.Sprintf("app-%d", i),
		"io.kubernetes.pod.name":       fmt.Sprintf("web-%d-7d9c8b6f5-x2k4p", i/3),
		"io.kubernetes.pod.namespace":  "default",
		"io.kubernetes.pod.uid":        fmt.Sprintf("8f14e45f-ceea-467f-a0e6-%012d", i/3),
	}
	c.Annotations = map[string]string{
		"io.kubernetes.container.hash":                     "5c1e2d4f",
		"io.kubernetes.container.restartCount":             "0",
		"io.kubernetes.container.terminationMessagePath":   "/dev/termination-log",
		"io.kubernetes.container.terminationMessagePolicy": "File",
		"io.kubernetes.pod.terminationGracePeriod":         "30",
	}
	return c
}

// BenchmarkUnaryAddedLatency alternates a direct and a proxied Version call in each iteration,
// so both see the same machine noise, and reports the medians and their difference: the
// latency podgate adds to a small unary call.
func BenchmarkUnaryAddedLatency(b *testing.B) {
	env := newBenchEnv(b, 0)
	ctx := b.Context()
	var direct, proxied []time.Duration
	for b.Loop() {
		for _, path := range []string{"direct", "podgate"} {
			start := time.Now()
			if _, err := env.client(path).Version(ctx, &runtimeapi.VersionRequest{Version: "v1"}); err != nil {
				b.Fatal(err)
			}
			if path == "direct" {
				direct = append(direct, time.Since(start))
			} else {
				proxied = append(proxied, time.Since(start))
			}
		}
	}
	b.StopTimer()
	slices.Sort(direct)
	slices.Sort(proxied)
	d, p := direct[len(direct)/2], proxied[len(proxied)/2]
	b.ReportMetric(float64(d.Nanoseconds()), "direct-p50-ns")
	b.ReportMetric(float64(p.Nanoseconds()), "podgate-p50-ns")
	b.ReportMetric(float64((p - d).Nanoseconds()), "added-p50-ns")
	b.ReportMetric(float64(p)/float64(d), "ratio-p50")
}

// BenchmarkInterceptedAddedLatency is BenchmarkUnaryAddedLatency for a method podgate
// intercepts (UpdateContainerResources, with an interceptor that only forwards): the cost of
// the typed path — decode, forward, compare, re-encode — over the raw passthrough.
func BenchmarkInterceptedAddedLatency(b *testing.B) {
	backend := filepath.Join(testfs.ShortDir(b), "fake.sock")
	f := fake.NewFakeRemoteRuntime()
	if err := f.Start("unix://" + backend); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(f.Stop)
	f.RuntimeService.SetFakeContainers([]*apitest.FakeContainer{kubeletContainer(0)})
	_, proxy := proxyFor(b, backend, "", func(s *Server) {
		Intercept(s, UpdateContainerResources, func(ctx context.Context, req *runtimeapi.UpdateContainerResourcesRequest,
			next Forward[*runtimeapi.UpdateContainerResourcesRequest, *runtimeapi.UpdateContainerResourcesResponse],
		) (*runtimeapi.UpdateContainerResourcesResponse, error) {
			return next(ctx, req)
		})
	})
	clients := map[string]runtimeapi.RuntimeServiceClient{
		"direct": runtimeapi.NewRuntimeServiceClient(dial(b, backend)), "podgate": runtimeapi.NewRuntimeServiceClient(proxy),
	}
	req := &runtimeapi.UpdateContainerResourcesRequest{
		ContainerId: kubeletContainer(0).Id,
		Linux:       &runtimeapi.LinuxContainerResources{CpuPeriod: 100000, CpuQuota: 20000, CpuShares: 256, MemoryLimitInBytes: 128 << 20},
	}
	lat := map[string][]time.Duration{}
	for b.Loop() {
		for _, path := range []string{"direct", "podgate"} {
			start := time.Now()
			if _, err := clients[path].UpdateContainerResources(b.Context(), req); err != nil {
				b.Fatal(err)
			}
			lat[path] = append(lat[path], time.Since(start))
		}
	}
	b.StopTimer()
	d, p := lat["direct"], lat["podgate"]
	slices.Sort(d)
	slices.Sort(p)
	b.ReportMetric(float64(d[len(d)/2].Nanoseconds()), "direct-p50-ns")
	b.ReportMetric(float64(p[len(p)/2].Nanoseconds()), "podgate-p50-ns")
	b.ReportMetric(float64((p[len(p)/2] - d[len(d)/2]).Nanoseconds()), "added-p50-ns")
}
