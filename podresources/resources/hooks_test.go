package resources

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	kubeletconfig "k8s.io/kubelet/config/v1beta1"

	"github.com/containerd/errdefs"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podgate/podgate/cri/registry"
	"github.com/podgate/podgate/podresources/cgroup"
)

// noStatus is a runtime that knows no container: the cgroup check finds nothing to read.
type noStatus struct {
	runtimeapi.RuntimeServiceClient
}

func (noStatus) ContainerStatus(context.Context, *runtimeapi.ContainerStatusRequest, ...grpc.CallOption) (*runtimeapi.ContainerStatusResponse, error) {
	return nil, status.Error(codes.NotFound, "no such container")
}

// v2Node is a cgroup v2 node with the memory controller: memory QoS applies.
var v2Node = cgroup.Node{Mode: cgroup.ModeUnified, V2Controllers: []string{"cpu", "memory"}, MemoryQoS: true}

func createRequest(uid, container string, res *runtimeapi.LinuxContainerResources) *runtimeapi.CreateContainerRequest {
	return &runtimeapi.CreateContainerRequest{
		PodSandboxId:  "sandbox-1",
		Config:        &runtimeapi.ContainerConfig{Metadata: &runtimeapi.ContainerMetadata{Name: container}, Linux: &runtimeapi.LinuxContainerConfig{Resources: res}},
		SandboxConfig: &runtimeapi.PodSandboxConfig{Metadata: &runtimeapi.PodSandboxMetadata{Uid: uid}},
	}
}

// fakePods is the node's pods as agent's Kubernetes adapter shows them: by UID, a pod changed
// by set from the next Get on, as the informer delivers an update.
type fakePods struct {
	mu   sync.Mutex
	pods map[types.UID]*corev1.Pod
}

var _ Pods = (*fakePods)(nil)

func newFakePods(pods ...*corev1.Pod) *fakePods {
	f := &fakePods{pods: map[types.UID]*corev1.Pod{}}
	for _, p := range pods {
		f.set(p)
	}
	return f
}

// Get implements Pods.
func (f *fakePods) Get(uid types.UID) (*corev1.Pod, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	p, ok := f.pods[uid]
	return p, ok
}

// set adds or replaces a pod.
func (f *fakePods) set(p *corev1.Pod) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.pods[p.UID] = p.DeepCopy()
}

// memoryPod is pod "pod-"+uid (UID "uid-"+uid) of the given QoS class whose containers ask
// for memory: app (256Mi, limit 1Gi), nolimit (256Mi, no limit).
func memoryPod(uid string, qos corev1.PodQOSClass) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "pod-" + uid, UID: types.UID("uid-" + uid)},
		Spec:       corev1.PodSpec{NodeName: "node-a"},
	}
	mem := func(q string) corev1.ResourceList {
		return corev1.ResourceList{corev1.ResourceMemory: resource.MustParse(q)}
	}
	p.Spec.Containers = []corev1.Container{
		{Name: "app", Resources: corev1.ResourceRequirements{Requests: mem("256Mi"), Limits: mem("1Gi")}},
		{Name: "nolimit", Resources: corev1.ResourceRequirements{Requests: mem("256Mi")}},
	}
	p.Status.QOSClass = qos
	return p
}

// newMemoryQoSStages are the resource stages with memory QoS on, on a cgroup v2 node with 4 KiB
// pages and 4 GiB of allocatable memory.
func newMemoryQoSStages(t *testing.T, policy kubeletconfig.MemoryReservationPolicy, pods ...*corev1.Pod) *Hooks {
	t.Helper()
	s := New(Config{MemoryQoS: true, MemoryThrottlingFactor: 0.9, MemoryReservationPolicy: policy},
		v2Node, registry.NewRegistry(nil, registry.CheckpointData{}), noStatus{}, prometheus.NewRegistry(), WithPods(newFakePods(pods...)), withPageSize(4096))
	s.allocatable.Store(4 << 30)
	return s
}

// TestMemoryQoS: on a cgroup v2 node, CreateContainer and UpdateContainerResources reach the
// runtime with what the kubelet 1.36 writes (cgroup.MemoryQoS has the table of the formula
// itself; this checks the wiring): the request, limit and QoS class taken from the pod, the
// node's allocatable memory for a container without a limit, a request the kubelet already
// gave memory QoS left alone.
func TestMemoryQoS(t *testing.T) {
	const (
		request = 256 << 20
		// floor(256Mi + 0.9 × (1Gi − 256Mi)) rounded down to 4 KiB: 268435456 + 724775731 =
		// 993211187 → 993210368.
		highOf1Gi = "993210368"
		// ceiling 4Gi: 268435456 + 0.9 × 4026531840 = 3892314112, a whole number of pages.
		highOf4Gi = "3892314112"
	)
	burstable := memoryPod("burst", corev1.PodQOSBurstable)
	tests := []struct {
		name      string
		policy    kubeletconfig.MemoryReservationPolicy
		pod       *corev1.Pod
		container string
		unified   map[string]string
		want      map[string]string
	}{
		{"None: protection 0, memory.high below the limit", kubeletconfig.NoneMemoryReservationPolicy, burstable, "app", nil,
			map[string]string{"memory.min": "0", "memory.low": "0", "memory.high": highOf1Gi}},
		{"no limit: the node's allocatable memory", kubeletconfig.NoneMemoryReservationPolicy, burstable, "nolimit", nil,
			map[string]string{"memory.min": "0", "memory.low": "0", "memory.high": highOf4Gi}},
		{"TieredReservation, Burstable: memory.low", kubeletconfig.TieredReservationMemoryReservationPolicy, burstable, "app", nil,
			map[string]string{"memory.low": strconv.Itoa(request), "memory.high": highOf1Gi}},
		{"TieredReservation, Guaranteed: memory.min", kubeletconfig.TieredReservationMemoryReservationPolicy, memoryPod("guaranteed", corev1.PodQOSGuaranteed), "app", nil,
			map[string]string{"memory.min": strconv.Itoa(request), "memory.high": highOf1Gi}},
		{"the kubelet's own memory QoS stays", kubeletconfig.NoneMemoryReservationPolicy, burstable, "app", map[string]string{"memory.min": "0", "memory.low": "0"},
			map[string]string{"memory.min": "0", "memory.low": "0"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newMemoryQoSStages(t, tt.policy, tt.pod)
			var sent *runtimeapi.CreateContainerRequest
			next := func(_ context.Context, req *runtimeapi.CreateContainerRequest) (*runtimeapi.CreateContainerResponse, error) {
				sent = req
				return &runtimeapi.CreateContainerResponse{ContainerId: "ctr"}, nil
			}
			// The CRI carries a limit of its own: memory QoS reads the container's in the pod.
			res := &runtimeapi.LinuxContainerResources{MemoryLimitInBytes: 3 << 30, Unified: tt.unified}
			if _, err := s.CreateContainer(t.Context(), createRequest(string(tt.pod.UID), tt.container, res), next); err != nil {
				t.Fatal(err)
			}
			if got := sent.GetConfig().GetLinux().GetResources().GetUnified(); !maps.Equal(got, tt.want) {
				t.Errorf("unified sent to the runtime = %v, want %v", got, tt.want)
			}
		})
	}
}

// TestMemoryQoSOnResize: an in-place resize recomputes memory.high from the pod's new limit.
func TestMemoryQoSOnResize(t *testing.T) {
	pod := memoryPod("resize", corev1.PodQOSBurstable)
	pods := newFakePods(pod)
	s := New(Config{MemoryQoS: true, MemoryThrottlingFactor: 0.9},
		v2Node, registry.NewRegistry(nil, registry.CheckpointData{}), noStatus{}, prometheus.NewRegistry(), WithPods(pods), withPageSize(4096))
	ok := func(context.Context, *runtimeapi.CreateContainerRequest) (*runtimeapi.CreateContainerResponse, error) {
		return &runtimeapi.CreateContainerResponse{ContainerId: "ctr"}, nil
	}
	if _, err := s.CreateContainer(t.Context(), createRequest(string(pod.UID), "app", &runtimeapi.LinuxContainerResources{}), ok); err != nil {
		t.Fatal(err)
	}
	// The resize reaches the pods as the informer delivers it.
	resized := pod.DeepCopy()
	resized.Spec.Containers[0].Resources.Limits[corev1.ResourceMemory] = resource.MustParse("2Gi")
	pods.set(resized)
	var sent *runtimeapi.UpdateContainerResourcesRequest
	next := func(_ context.Context, req *runtimeapi.UpdateContainerResourcesRequest) (*runtimeapi.UpdateContainerResourcesResponse, error) {
		sent = req
		return &runtimeapi.UpdateContainerResourcesResponse{}, nil
	}
	if _, err := s.UpdateContainerResources(t.Context(), &runtimeapi.UpdateContainerResourcesRequest{
		ContainerId: "ctr", Linux: &runtimeapi.LinuxContainerResources{MemoryLimitInBytes: 2 << 30},
	}, next); err != nil {
		t.Fatal(err)
	}
	// floor(256Mi + 0.9 × (2Gi − 256Mi)) = floor(268435456 + 1691143372.8) = 1959578828,
	// rounded down to 4 KiB: 1959575552.
	if got := sent.GetLinux().GetUnified()["memory.high"]; got != "1959575552" {
		t.Errorf("memory.high after the resize = %s, want 1959575552", got)
	}
	if err := s.Wait(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// TestRecheckForgetsContainersGoneFromTheRuntime: a container removed behind podgate's back
// (straight at the runtime) is forgotten at its next check instead of being read every period.
func TestRecheckForgetsContainersGoneFromTheRuntime(t *testing.T) {
	reg := registry.NewRegistry(nil, registry.CheckpointData{})
	s := New(Config{MemoryThrottlingFactor: 0.9},
		cgroup.Detect(), reg, noStatus{}, prometheus.NewRegistry())
	reg.AddContainer(registry.ContainerRecord{ID: "gone", SandboxID: "s"})
	s.records.set("gone", container{verification: ResultOK})
	if err := s.verifyContainer(t.Context(), "gone", "recheck"); err != nil {
		t.Fatal(err)
	}
	if _, ok := reg.Container("gone"); ok {
		t.Error("a container the runtime no longer has is still in the registry")
	}
	if _, ok := s.records.get("gone"); ok || len(s.records.started()) != 0 {
		t.Error("a container the runtime no longer has is still recorded, and rechecked")
	}
}

// TestMemoryQoSNotApplicable: asked for on a node without the cgroup v2 memory controller,
// memory QoS changes nothing and says why.
func TestMemoryQoSNotApplicable(t *testing.T) {
	pod := memoryPod("hybrid", corev1.PodQOSBurstable)
	pods := newFakePods(pod)
	node := cgroup.Node{Mode: cgroup.ModeHybrid, V2Controllers: []string{"hugetlb"}, MemoryQoSReason: "hybrid hierarchy: the memory controller is on cgroup v1"}
	s := New(Config{MemoryQoS: true, MemoryThrottlingFactor: 0.9},
		node, registry.NewRegistry(nil, registry.CheckpointData{}), nil, prometheus.NewRegistry(), WithPods(pods))
	req := createRequest(string(pod.UID), "app", &runtimeapi.LinuxContainerResources{MemoryLimitInBytes: 1 << 30})
	orig := proto.Clone(req)
	var sent *runtimeapi.CreateContainerRequest
	if _, err := s.CreateContainer(t.Context(), req, func(_ context.Context, r *runtimeapi.CreateContainerRequest) (*runtimeapi.CreateContainerResponse, error) {
		sent = r
		return &runtimeapi.CreateContainerResponse{ContainerId: "c"}, nil
	}); err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(sent, orig) {
		t.Errorf("the request reached the runtime changed: %v, want %v", sent, orig)
	}
	if s.memoryQoS || !strings.Contains(s.qosOff, "memory controller") {
		t.Errorf("memory QoS on %v, reason %q; want off, saying why", s.memoryQoS, s.qosOff)
	}
}

// TestUpdateVerifyFail: with resources.verify: fail, an UpdateContainerResources whose values
// the container's cgroup does not hold fails with FailedPrecondition naming the field, so the
// kubelet retries; one it holds succeeds. It reads a real cgroup v1 directory the test makes.
func TestUpdateVerifyFail(t *testing.T) {
	cpu := "/sys/fs/cgroup/cpu"
	if os.Geteuid() != 0 {
		t.Skip("needs root: makes a cgroup under " + cpu)
	}
	if _, err := os.Stat(filepath.Join(cpu, "cpu.cfs_quota_us")); err != nil {
		t.Skipf("needs the cgroup v1 cpu hierarchy: %v", err)
	}
	name := fmt.Sprintf("/podgate-test-verify-%d", os.Getpid())
	for _, sub := range []string{"cpu", "cpuset", "memory"} {
		dir := filepath.Join("/sys/fs/cgroup", sub, name)
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Skipf("cannot make cgroup %s: %v", dir, err)
		}
		t.Cleanup(func() { _ = os.Remove(dir) })
	}
	if err := os.WriteFile(filepath.Join(cpu, name, "cpu.cfs_quota_us"), []byte("50000"), 0o644); err != nil {
		t.Fatal(err)
	}
	reg := registry.NewRegistry(nil, registry.CheckpointData{})
	s := New(Config{MemoryThrottlingFactor: 0.9, VerifyFail: true},
		cgroup.Detect(), reg, nil, prometheus.NewRegistry())
	reg.AddContainer(registry.ContainerRecord{ID: "ctr", CgroupsPath: name})
	s.records.set("ctr", container{verification: ResultOK})
	ok := func(context.Context, *runtimeapi.UpdateContainerResourcesRequest) (*runtimeapi.UpdateContainerResourcesResponse, error) {
		return &runtimeapi.UpdateContainerResourcesResponse{}, nil
	}
	update := func(quota int64) error {
		_, err := s.UpdateContainerResources(t.Context(), &runtimeapi.UpdateContainerResourcesRequest{
			ContainerId: "ctr", Linux: &runtimeapi.LinuxContainerResources{CpuPeriod: 100000, CpuQuota: quota},
		}, ok)
		return err
	}
	if err := update(20000); !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "cfs_quota") {
		t.Errorf("update to a quota the cgroup does not hold: %v; want FailedPrecondition naming the quota", err)
	}
	if err := update(50000); err != nil {
		t.Errorf("update to the quota the cgroup holds: %v", err)
	}
}
