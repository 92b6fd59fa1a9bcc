package agent

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podgate/podgate/agent/config"
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

func podWithMemoryRequest(uid, container, request string) *corev1.Pod {
	p := testPod(uid, "")
	p.Spec.Containers = []corev1.Container{{Name: container, Resources: corev1.ResourceRequirements{
		Requests: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse(request)},
	}}}
	return p
}

func createRequest(uid, container string, res *runtimeapi.LinuxContainerResources) *runtimeapi.CreateContainerRequest {
	return &runtimeapi.CreateContainerRequest{
		PodSandboxId:  "sandbox-1",
		Config:        &runtimeapi.ContainerConfig{Metadata: &runtimeapi.ContainerMetadata{Name: container}, Linux: &runtimeapi.LinuxContainerConfig{Resources: res}},
		SandboxConfig: &runtimeapi.PodSandboxConfig{Metadata: &runtimeapi.PodSandboxMetadata{Uid: uid}},
	}
}

// TestMemoryQoS: on a cgroup v2 node, CreateContainer and UpdateContainerResources reach the
// runtime with memory.min = the request and memory.high by the kubelet's formula; a container
// without a limit takes the node's memory; a key the kubelet set stays.
func TestMemoryQoS(t *testing.T) {
	pod := podWithMemoryRequest("qos", "app", "256Mi")
	_, pods := startLookup(t, pod)
	s := newResourceStages(config.Resources{MemoryQoS: true, MemoryThrottlingFactor: 0.9, Verify: config.ResourcesVerifyWarn, RecheckPeriod: &config.Duration{}},
		v2Node, pods, noStatus{}, prometheus.NewRegistry())
	s.pageSize = 4096
	s.allocatable = func(context.Context) int64 { return 4 << 30 }
	const request = 256 << 20
	high := func(limit int64) string {
		return strconv.FormatInt((request+int64(0.9*float64(limit-request)))/4096*4096, 10)
	}

	for _, tt := range []struct {
		name     string
		res      *runtimeapi.LinuxContainerResources
		wantHigh string
		wantMin  string
	}{
		{"limit 1Gi", &runtimeapi.LinuxContainerResources{MemoryLimitInBytes: 1 << 30}, high(1 << 30), strconv.Itoa(request)},
		{"no limit: the node's memory", &runtimeapi.LinuxContainerResources{}, high(4 << 30), strconv.Itoa(request)},
		{"memory.high set by the kubelet", &runtimeapi.LinuxContainerResources{MemoryLimitInBytes: 1 << 30, Unified: map[string]string{"memory.high": "max"}}, "max", strconv.Itoa(request)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var sent *runtimeapi.CreateContainerRequest
			next := func(_ context.Context, req *runtimeapi.CreateContainerRequest) (*runtimeapi.CreateContainerResponse, error) {
				sent = req
				return &runtimeapi.CreateContainerResponse{ContainerId: "ctr-" + tt.name}, nil
			}
			if _, err := s.createContainer(t.Context(), createRequest(string(pod.UID), "app", tt.res), next); err != nil {
				t.Fatal(err)
			}
			u := sent.GetConfig().GetLinux().GetResources().GetUnified()
			if u["memory.min"] != tt.wantMin || u["memory.high"] != tt.wantHigh {
				t.Errorf("unified sent to the runtime = %v; want memory.min %s, memory.high %s", u, tt.wantMin, tt.wantHigh)
			}
		})
	}

	// An in-place resize recomputes memory.high for the new limit.
	var sent *runtimeapi.UpdateContainerResourcesRequest
	next := func(_ context.Context, req *runtimeapi.UpdateContainerResourcesRequest) (*runtimeapi.UpdateContainerResourcesResponse, error) {
		sent = req
		return &runtimeapi.UpdateContainerResourcesResponse{}, nil
	}
	if _, err := s.updateContainerResources(t.Context(), &runtimeapi.UpdateContainerResourcesRequest{
		ContainerId: "ctr-limit 1Gi", Linux: &runtimeapi.LinuxContainerResources{MemoryLimitInBytes: 2 << 30},
	}, next); err != nil {
		t.Fatal(err)
	}
	if got := sent.GetLinux().GetUnified()["memory.high"]; got != high(2<<30) {
		t.Errorf("memory.high after the resize = %s, want %s", got, high(2<<30))
	}
	if err := s.wait(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// TestMemoryQoSNotApplicable: asked for on a node without the cgroup v2 memory controller,
// memory QoS changes nothing and says why.
func TestMemoryQoSNotApplicable(t *testing.T) {
	pod := podWithMemoryRequest("hybrid", "app", "256Mi")
	_, pods := startLookup(t, pod)
	node := cgroup.Node{Mode: cgroup.ModeHybrid, V2Controllers: []string{"hugetlb"}, MemoryQoSReason: "hybrid hierarchy: the memory controller is on cgroup v1"}
	s := newResourceStages(config.Resources{MemoryQoS: true, MemoryThrottlingFactor: 0.9, Verify: config.ResourcesVerifyWarn, RecheckPeriod: &config.Duration{}},
		node, pods, nil, prometheus.NewRegistry())
	req := createRequest(string(pod.UID), "app", &runtimeapi.LinuxContainerResources{MemoryLimitInBytes: 1 << 30})
	orig := proto.Clone(req)
	var sent *runtimeapi.CreateContainerRequest
	if _, err := s.createContainer(t.Context(), req, func(_ context.Context, r *runtimeapi.CreateContainerRequest) (*runtimeapi.CreateContainerResponse, error) {
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
	s := newResourceStages(config.Resources{MemoryThrottlingFactor: 0.9, Verify: config.ResourcesVerifyFail, RecheckPeriod: &config.Duration{}},
		cgroup.Detect(), nil, nil, prometheus.NewRegistry())
	s.containers["ctr"] = &containerRecord{ID: "ctr", CgroupsPath: name, Verification: cgroupOK}
	ok := func(context.Context, *runtimeapi.UpdateContainerResourcesRequest) (*runtimeapi.UpdateContainerResourcesResponse, error) {
		return &runtimeapi.UpdateContainerResourcesResponse{}, nil
	}
	update := func(quota int64) error {
		_, err := s.updateContainerResources(t.Context(), &runtimeapi.UpdateContainerResourcesRequest{
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
