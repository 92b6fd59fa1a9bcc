package registry

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podgate/podgate/cri"
	"github.com/podgate/podgate/test/crifixture"
	"github.com/podgate/podgate/test/testfs"
)

// listRuntime is a runtime holding many running pods and containers, as the kubelet made them,
// served over real gRPC on a unix socket with gRPC's default server limits. With streams it
// serves list streaming (KEP-5825) in pages; without, it is older than list streaming and
// answers Unimplemented to it.
type listRuntime struct {
	runtimeapi.UnimplementedRuntimeServiceServer
	*listFixture
	streams          bool
	streamed, listed atomic.Int64 // Stream* and List* calls
	// hang: the runtime answers no sandbox status (a hung runtime) until the call ends;
	// hanging counts the calls it holds.
	hang    atomic.Bool
	hanging atomic.Int64
}

// listFixture is what a listRuntime holds; tests share one per size, built once.
type listFixture struct {
	sandboxes  []*runtimeapi.PodSandbox
	containers []*runtimeapi.Container
	pod        map[string]int // a container's or sandbox's ID → its pod
}

// listPage is how many items the runtime sends in a page of a stream.
const listPage = 1000

func newListFixture(pods, perPod int) *listFixture {
	f := &listFixture{pod: make(map[string]int, pods*(perPod+1))}
	for i := range pods {
		f.sandboxes = append(f.sandboxes, crifixture.Sandbox(i))
		f.pod[crifixture.SandboxID(i)] = i
		for j := range perPod {
			f.containers = append(f.containers, crifixture.Container(i, j))
			f.pod[crifixture.ContainerID(i, j)] = i
		}
	}
	return f
}

// bigFixture is 30,000 containers: a unary ListContainers answer of more than 16 MiB.
var bigFixture = sync.OnceValue(func() *listFixture { return newListFixture(1000, 30) })

func startListRuntime(t *testing.T, f *listFixture, streams bool) (*listRuntime, runtimeapi.RuntimeServiceClient) {
	t.Helper()
	r := &listRuntime{listFixture: f, streams: streams}
	path := filepath.Join(testfs.ShortDir(t), "rt.sock")
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	runtimeapi.RegisterRuntimeServiceServer(srv, r)
	go srv.Serve(l) //nolint:errcheck // ends with Stop
	t.Cleanup(srv.Stop)
	// podgate's own connection to the runtime takes messages up to cri.MaxMessageSize.
	conn, err := grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(cri.MaxMessageSize)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return r, runtimeapi.NewRuntimeServiceClient(conn)
}

func (r *listRuntime) ListPodSandbox(context.Context, *runtimeapi.ListPodSandboxRequest) (*runtimeapi.ListPodSandboxResponse, error) {
	r.listed.Add(1)
	return &runtimeapi.ListPodSandboxResponse{Items: r.sandboxes}, nil
}

func (r *listRuntime) ListContainers(context.Context, *runtimeapi.ListContainersRequest) (*runtimeapi.ListContainersResponse, error) {
	r.listed.Add(1)
	return &runtimeapi.ListContainersResponse{Containers: r.containers}, nil
}

func (r *listRuntime) StreamPodSandboxes(req *runtimeapi.StreamPodSandboxesRequest, s runtimeapi.RuntimeService_StreamPodSandboxesServer) error {
	r.streamed.Add(1)
	if !r.streams {
		return r.UnimplementedRuntimeServiceServer.StreamPodSandboxes(req, s)
	}
	return sendPages(r.sandboxes, func(p []*runtimeapi.PodSandbox) error {
		return s.Send(&runtimeapi.StreamPodSandboxesResponse{PodSandboxes: p})
	})
}

func (r *listRuntime) StreamContainers(req *runtimeapi.StreamContainersRequest, s runtimeapi.RuntimeService_StreamContainersServer) error {
	r.streamed.Add(1)
	if !r.streams {
		return r.UnimplementedRuntimeServiceServer.StreamContainers(req, s)
	}
	return sendPages(r.containers, func(p []*runtimeapi.Container) error {
		return s.Send(&runtimeapi.StreamContainersResponse{Containers: p})
	})
}

func sendPages[T any](items []T, send func([]T) error) error {
	for i := 0; i < len(items); i += listPage {
		if err := send(items[i:min(i+listPage, len(items))]); err != nil {
			return err
		}
	}
	return nil
}

// PodSandboxStatus answers as containerd does, with the part of its verbose info podgate reads.
func (r *listRuntime) PodSandboxStatus(ctx context.Context, req *runtimeapi.PodSandboxStatusRequest) (*runtimeapi.PodSandboxStatusResponse, error) {
	if r.hang.Load() {
		r.hanging.Add(1)
		<-ctx.Done()
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	i, ok := r.pod[req.GetPodSandboxId()]
	if !ok {
		return nil, status.Error(codes.NotFound, "no such sandbox")
	}
	return &runtimeapi.PodSandboxStatusResponse{
		Status: &runtimeapi.PodSandboxStatus{Id: req.GetPodSandboxId(), State: runtimeapi.PodSandboxState_SANDBOX_READY},
		Info:   map[string]string{"info": `{"pid":` + strconv.Itoa(1000+i) + `,"runtimeHandler":"runc"}`},
	}, nil
}

// ContainerStatus answers with a verbose info whose runtime spec holds the container's cgroup.
func (r *listRuntime) ContainerStatus(ctx context.Context, req *runtimeapi.ContainerStatusRequest) (*runtimeapi.ContainerStatusResponse, error) {

	if _, ok := r.pod[req.GetContainerId()]; !ok {
		return nil, status.Error(codes.NotFound, "no such container")
	}
	return &runtimeapi.ContainerStatusResponse{
		Status: &runtimeapi.ContainerStatus{Id: req.GetContainerId(), State: runtimeapi.ContainerState_CONTAINER_RUNNING},
		Info:   map[string]string{"info": `{"runtimeSpec":{"linux":{"cgroupsPath":"` + cgroupOf(req.GetContainerId()) + `"}}}`},
	}, nil
}

func cgroupOf(containerID string) string { return "kubepods.slice:cri-containerd:" + containerID }

// TestRebuildStreams30000Containers: a runtime with 30,000 containers, whose unary
// ListContainers answer is more than podgate's connection takes, is listed with its streams:
// the rebuild records every sandbox and every container, with what its status says.
func TestRebuildStreams30000Containers(t *testing.T) {
	if testing.Short() {
		t.Skip("30,000 containers take tens of CPU-seconds: not in -short (make unit); make test runs it")
	}
	f := bigFixture()
	rt, client := startListRuntime(t, f, true)
	if _, err := client.ListContainers(t.Context(), &runtimeapi.ListContainersRequest{}); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("unary ListContainers of %d containers: %v, want ResourceExhausted (an answer over %d bytes)", len(f.containers), err, cri.MaxMessageSize)
	}
	rt.listed.Store(0)
	reg := NewRegistry(nil, CheckpointData{})
	w := &ctrWatcher{adopted: map[string]AdoptedContainer{}}
	reg.WatchContainers(w)
	known, added, dropped, err := reg.Rebuild(t.Context(), cri.StreamingLists(client))
	if err != nil {
		t.Fatal(err)
	}
	if known != len(f.sandboxes) || added != len(f.sandboxes) || dropped != 0 {
		t.Errorf("rebuild: %d known, %d added, %d dropped; want %d, %d, 0", known, added, dropped, len(f.sandboxes), len(f.sandboxes))
	}
	if n := reg.ContainerCount(); n != len(f.containers) {
		t.Errorf("the registry holds %d containers, want %d", n, len(f.containers))
	}
	for _, c := range []*runtimeapi.Container{f.containers[0], f.containers[len(f.containers)/2], f.containers[len(f.containers)-1]} {
		rec, ok := reg.Container(c.GetId())
		switch {
		case !ok:
			t.Errorf("container %s not recorded", c.GetId())
		case rec.SandboxID != c.GetPodSandboxId() || rec.PodUID != types.UID(c.GetLabels()["io.kubernetes.pod.uid"]) ||
			rec.CgroupsPath != cgroupOf(c.GetId()) || rec.Origin != OriginAdopted:
			t.Errorf("container %s recorded as %+v", c.GetId(), rec)
		case w.adopted[c.GetId()].Err != nil:
			t.Errorf("container %s adopted with %v", c.GetId(), w.adopted[c.GetId()].Err)
		}
	}
	if n := rt.listed.Load(); n != 0 {
		t.Errorf("the rebuild made %d unary List calls, want none", n)
	}
}

// TestRebuildFallsBackToList: against a runtime older than list streaming, the rebuild lists
// with the unary calls, and asks each stream once for the client's life.
func TestRebuildFallsBackToList(t *testing.T) {
	f := newListFixture(3, 4)
	rt, client := startListRuntime(t, f, false)
	lists := cri.StreamingLists(client)
	for attempt := 1; attempt <= 2; attempt++ {
		reg := NewRegistry(nil, CheckpointData{})
		known, _, _, err := reg.Rebuild(t.Context(), lists)
		if err != nil {
			t.Fatal(err)
		}
		if known != 3 || reg.ContainerCount() != 12 {
			t.Errorf("rebuild %d: %d sandboxes and %d containers, want 3 and 12", attempt, known, reg.ContainerCount())
		}
		if s, l := rt.streamed.Load(), rt.listed.Load(); s != 2 || l != int64(2*attempt) {
			t.Errorf("after rebuild %d the runtime got %d streams and %d lists, want 2 and %d", attempt, s, l, 2*attempt)
		}
	}
}

// An attempt that ends before every status was asked for (its time ran out, podgate stops)
// fails, and the registry keeps what it held: the sandboxes it did not get to read are not taken
// for gone.
func TestRebuildCutShortChangesNothing(t *testing.T) {
	f := newListFixture(2*statusWorkers, 1) // more sandboxes than status calls at once
	rt, client := startListRuntime(t, f, true)
	reg := NewRegistry(nil, CheckpointData{})
	if _, _, _, err := reg.Rebuild(t.Context(), client); err != nil {
		t.Fatal(err)
	}
	before := reg.Sandboxes()
	rt.hang.Store(true)
	ctx, cancel := context.WithCancel(t.Context())
	errc := make(chan error, 1)
	go func() { _, _, _, err := reg.Rebuild(ctx, client); errc <- err }()
	err := wait.PollUntilContextTimeout(t.Context(), 5*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		return rt.hanging.Load() == statusWorkers, nil
	})
	if err != nil {
		t.Fatalf("%d status calls reached the runtime, want %d at once: %v", rt.hanging.Load(), statusWorkers, err)
	}
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("rebuild cut short: %v, want context.Canceled", err)
	}
	if n := rt.hanging.Load(); n != statusWorkers {
		t.Errorf("%d status calls asked, want the %d in flight when it was cut short", n, statusWorkers)
	}
	if after := reg.Sandboxes(); len(after) != len(before) || len(before) != 2*statusWorkers {
		t.Errorf("after the rebuild cut short the registry holds %d sandboxes, want the %d it held", len(after), len(before))
	}
}
