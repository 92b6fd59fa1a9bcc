package podresources

import (
	"fmt"
	"runtime"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	v1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	pb "github.com/podgate/podgate/podresources/api/v1alpha1"
	"github.com/podgate/podgate/test/testfs"
)

// benchPods is a full node: 110 pods (the kubelet's default maximum).
const benchPods = 110

// benchSource is a node of n pods of 4 containers, each pod with one prepared pod-level
// network claim (one device, one CDI id, network data), sysctls and IPs.
func benchSource(n int) *fakeSource {
	src := &fakeSource{specs: map[string][]Container{}}
	pods := make([]*pb.Pod, 0, n)
	for i := range n {
		ns, name, uid := fmt.Sprintf("ns-%d", i%10), fmt.Sprintf("pod-%03d", i), fmt.Sprintf("uid-%03d", i)
		sb := sandbox(t0.Add(time.Duration(i) * time.Second))
		sb.Netns = "/var/run/netns/cni-" + uid
		sb.Ips = []string{fmt.Sprintf("10.244.1.%d", i+2), fmt.Sprintf("fd00:10:244:1::%x", i+2)}
		sb.Sysctls = &pb.Sysctls{
			Asked:        map[string]string{"net.ipv4.ip_forward": "1", "net.core.somaxconn": "4096"},
			Applied:      map[string]string{"net.ipv4.ip_forward": "1", "net.core.somaxconn": "4096", "net.ipv4.tcp_keepalive_time": "600"},
			Verification: "ok",
		}
		c := &pb.Claim{
			Namespace: ns, Name: name + "-net", Uid: uid + "-net", PodClaimName: "net", Prepared: true,
			Devices: []*pb.Device{{
				Driver: "net.example.com", Pool: "node-a", Device: fmt.Sprintf("vf-%d", i), Requests: []string{"nic"},
				CdiDeviceIds: []string{fmt.Sprintf("net.example.com/vf=%d", i)},
				Network: &pb.NetworkData{
					HostInterface: fmt.Sprintf("ens1f0v%d", i), InterfaceName: "net1", Ips: []string{fmt.Sprintf("192.0.2.%d/24", i+2)},
					HardwareAddress: fmt.Sprintf("02:00:00:00:00:%02x", i), Mtu: 9000, Attached: true,
				},
			}},
		}
		pods = append(pods, pod(ns, name, uid, sb, c))
		src.specs[uid] = []Container{{Name: "istio-proxy"}, {Name: "app"}, {Name: "worker"}, {Name: "metrics"}}
	}
	src.set(uint64(n), pods...)
	return src
}

// benchRig serves src with the rate limit out of the way and no kubelet.
func benchRig(b *testing.B, src *fakeSource) *rig {
	b.Helper()
	return newRig(b, Options{Source: src, QPS: 1e9, Burst: 1e9})
}

func getRequests(src *fakeSource) []*v1.GetPodResourcesRequest {
	pods, _ := src.Pods()
	reqs := make([]*v1.GetPodResourcesRequest, 0, len(pods))
	for _, p := range pods {
		reqs = append(reqs, &v1.GetPodResourcesRequest{PodNamespace: p.GetNamespace(), PodName: p.GetName()})
	}
	return reqs
}

// BenchmarkGet is v1 Get over the unix socket, round-robin over the pods, with its latency
// percentiles.
func BenchmarkGet(b *testing.B) {
	src := benchSource(benchPods)
	r := benchRig(b, src)
	client, reqs, ctx := r.v1(), getRequests(src), benchContext(b)
	var took []time.Duration
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		start := time.Now()
		resp, err := client.Get(ctx, reqs[i%len(reqs)])
		took = append(took, time.Since(start))
		if err != nil || len(resp.GetPodResources().GetContainers()) != 4 {
			b.Fatalf("Get: %v, %d containers", err, len(resp.GetPodResources().GetContainers()))
		}
	}
	reportPercentiles(b, took)
}

func reportPercentiles(b *testing.B, took []time.Duration) {
	if len(took) == 0 {
		return
	}
	slices.Sort(took)
	at := func(p int) float64 { return float64(took[(len(took)-1)*p/100]) / float64(time.Microsecond) }
	b.ReportMetric(at(50), "p50-µs")
	b.ReportMetric(at(99), "p99-µs")
}

// BenchmarkList is v1 List of the whole node.
func BenchmarkList(b *testing.B) {
	r := benchRig(b, benchSource(benchPods))
	client, ctx := r.v1(), benchContext(b)
	var took []time.Duration
	b.ReportAllocs()
	for b.Loop() {
		start := time.Now()
		resp, err := client.List(ctx, &v1.ListPodResourcesRequest{})
		took = append(took, time.Since(start))
		if err != nil || len(resp.GetPodResources()) != benchPods {
			b.Fatalf("List: %v, %d pods", err, len(resp.GetPodResources()))
		}
	}
	reportPercentiles(b, took)
}

// BenchmarkGetParallel is v1 Get from GOMAXPROCS clients at once on one connection; it reports
// the throughput.
func BenchmarkGetParallel(b *testing.B) {
	src := benchSource(benchPods)
	r := benchRig(b, src)
	client, reqs, ctx := r.v1(), getRequests(src), benchContext(b)
	var next atomic.Uint64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			i := next.Add(1)
			if _, err := client.Get(ctx, reqs[i%uint64(len(reqs))]); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	if s := b.Elapsed().Seconds(); s > 0 {
		b.ReportMetric(float64(b.N)/s, "gets/s")
	}
}

// BenchmarkMemory110Pods reports the heap a full node's state adds, held and served: the live
// heap, after GC, of a server of 110 pods that answered List and a Get of each pod, less that of
// a server of no pods that answered the same calls.
func BenchmarkMemory110Pods(b *testing.B) {
	ctx := benchContext(b)
	dir := testfs.ShortDir(b)
	// No cleanups per iteration: they would keep each iteration's server and source alive to
	// the end, in the heap measured by the next.
	measure := func(src *fakeSource) uint64 {
		r, err := openRig(dir, Options{Source: src, QPS: 1e9, Burst: 1e9})
		if err != nil {
			b.Fatal(err)
		}
		client := r.v1()
		if _, err := client.List(ctx, &v1.ListPodResourcesRequest{}); err != nil {
			b.Fatal(err)
		}
		for _, req := range getRequests(src) {
			if _, err := client.Get(ctx, req); err != nil {
				b.Fatal(err)
			}
		}
		inuse := heapInuse()
		r.shutdown(b)
		if err := r.conn.Close(); err != nil {
			b.Fatal(err)
		}
		runtime.KeepAlive(src)
		return inuse
	}
	var total float64
	n := 0
	for b.Loop() {
		empty := measure(&fakeSource{})
		full := measure(benchSource(benchPods))
		total += float64(int64(full) - int64(empty))
		n++
	}
	b.ReportMetric(total/float64(n)/(1<<20), "heap-MiB")
}

func heapInuse() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse
}
