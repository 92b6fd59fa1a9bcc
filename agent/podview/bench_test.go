package podview

import (
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/apimachinery/pkg/types"
	v1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/podgate/podgate/cri/registry"
	"github.com/podgate/podgate/dra/dratest/rig"
	"github.com/podgate/podgate/dra/manager"
	"github.com/podgate/podgate/podresources"
	"github.com/podgate/podgate/test/testfs"
)

// benchRegistry is a full node in the pod registry: 110 pods (the kubelet's default maximum)
// of 4 containers, each with a sandbox and one prepared pod-level network claim; the source
// PodResources reads it through.
func benchRegistry(b *testing.B) *Source {
	b.Helper()
	st := memoryStateOf(b, registry.CheckpointData{})
	r, claims := st.Sandboxes, st.Claims
	for i := range 110 {
		ref := registry.PodRef{UID: types.UID(fmt.Sprintf("uid-%03d", i)), Name: fmt.Sprintf("pod-%03d", i), Namespace: fmt.Sprintf("ns-%d", i%10)}
		rec := sampleRecord(fmt.Sprintf("sandbox-%03d", i))
		rec.Pod = ref
		if err := r.Add(rec); err != nil {
			b.Fatal(err)
		}
		pc := manager.PodClaims{
			Pod: ref,
			Claims: []manager.ClaimRecord{{
				UID: ref.UID + "-net", Namespace: ref.Namespace, Name: ref.Name + "-net", PodClaimName: "net", Drivers: []string{"net.example.com"},
				Prepared: true,
				Devices: []manager.DeviceRecord{{
					Driver: "net.example.com", Pool: "node-a", Device: fmt.Sprintf("vf-%d", i), Requests: []string{"nic"},
					CDIDeviceIDs: []string{fmt.Sprintf("net.example.com/vf=%d", i)},
					Network:      &manager.DeviceNetworkRecord{HostInterface: fmt.Sprintf("ens1f0v%d", i), InterfaceName: "net1", MTU: 9000},
				}},
			}},
			Containers: []manager.ContainerClaims{{Name: "istio-proxy"}, {Name: "app"}, {Name: "worker"}, {Name: "metrics"}},
		}
		rig.RecordPodClaims(b, claims, pc)
	}
	return &Source{Registry: r, Claims: claims}
}

// BenchmarkPodResourcesGet is the kubelet-compatible Get over a unix socket, served from the
// real pod registry of 110 pods, round-robin over them, with its latency percentiles. The rate
// limit is raised out of the way and no kubelet socket is asked.
func BenchmarkPodResourcesGet(b *testing.B) {
	src := benchRegistry(b)
	client := servePodResources(b, src)
	var reqs []*v1.GetPodResourcesRequest
	for _, rec := range src.Registry.Sandboxes() {
		reqs = append(reqs, &v1.GetPodResourcesRequest{PodName: rec.Pod.Name, PodNamespace: rec.Pod.Namespace})
	}
	took := make([]time.Duration, 0, b.N)
	for i := 0; b.Loop(); i++ {
		start := time.Now()
		resp, err := client.Get(b.Context(), reqs[i%len(reqs)])
		took = append(took, time.Since(start))
		if err != nil || len(resp.GetPodResources().GetContainers()[3].GetDynamicResources()) != 1 {
			b.Fatalf("Get = %v, %v; want 4 containers, each with the pod-level claim", resp, err)
		}
	}
	slices.Sort(took)
	b.ReportMetric(float64(took[len(took)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(took[len(took)*99/100].Microseconds()), "p99-µs")
}

// BenchmarkPodResourcesGetParallel is Get from as many clients as GOMAXPROCS, on one
// connection each: the rate podgate serves on the machine's cores.
func BenchmarkPodResourcesGetParallel(b *testing.B) {
	socket := servePodResourcesSocket(b, benchRegistry(b))
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		client := podResourcesClient(b, socket)
		req := &v1.GetPodResourcesRequest{PodName: "pod-042", PodNamespace: "ns-2"}
		for pb.Next() {
			if _, err := client.Get(b.Context(), req); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "gets/s")
}

// BenchmarkPodResourcesList is the kubelet-compatible List of the 110 pods.
func BenchmarkPodResourcesList(b *testing.B) {
	client := servePodResources(b, benchRegistry(b))
	for b.Loop() {
		resp, err := client.List(b.Context(), &v1.ListPodResourcesRequest{})
		if err != nil || len(resp.GetPodResources()) != 110 {
			b.Fatalf("List = %d pods, %v; want 110", len(resp.GetPodResources()), err)
		}
	}
}

func servePodResources(b *testing.B, src *Source) v1.PodResourcesListerClient {
	b.Helper()
	return podResourcesClient(b, servePodResourcesSocket(b, src))
}

func servePodResourcesSocket(b *testing.B, src *Source) string {
	b.Helper()
	s, err := podresources.NewServer(podresources.Options{Source: src, QPS: 1e9, Burst: 1e9})
	if err != nil {
		b.Fatal(err)
	}
	socket := filepath.Join(testfs.ShortDir(b), "pr.sock")
	l, err := net.Listen("unix", socket)
	if err != nil {
		b.Fatal(err)
	}
	go s.Serve(l) //nolint:errcheck // returns nil after Shutdown
	b.Cleanup(func() { s.Shutdown(b.Context()) })
	return socket
}

func podResourcesClient(b *testing.B, socket string) v1.PodResourcesListerClient {
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { conn.Close() })
	return v1.NewPodResourcesListerClient(conn)
}

// sampleRecord is a started sandbox record of pod "uid-"+id.
func sampleRecord(id string) registry.SandboxRecord {
	return registry.SandboxRecord{
		ID:        id,
		Pod:       registry.PodRef{UID: types.UID("uid-" + id), Name: id, Namespace: "ns"},
		Origin:    registry.OriginStarted,
		Ready:     true,
		CreatedAt: time.Date(2026, 11, 22, 3, 0, 0, 0, time.UTC),
		NetNS:     "/var/run/netns/cni-" + id,
		PID:       42,
		IPs:       []string{"10.88.0.7"},
	}
}
