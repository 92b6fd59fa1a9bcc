package resources

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	"github.com/prometheus/client_golang/prometheus"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podgate/podgate/cri/registry"
	"github.com/podgate/podgate/podresources/cgroup"
)

// TestUpdateKeepsWhatZeroLeaves: an UpdateContainerResources that leaves a value 0 keeps the
// one the container had, at the runtime (containerd lays the request over the runtime spec)
// and in podgate's verification: the CPU quota asked at creation is still checked after a
// memory resize that sends none, and a change of it behind the runtime's back is a mismatch.
func TestUpdateKeepsWhatZeroLeaves(t *testing.T) {
	parent := podCgroup(t) // a container's cgroup, as the pod's is
	writeCgroupFiles(t, parent, "cpu/cpu.shares", "102", "cpu/cpu.cfs_quota_us", "50000",
		"memory/memory.limit_in_bytes", fmt.Sprint(64<<20), "memory/memory.memsw.limit_in_bytes", fmt.Sprint(64<<20))
	reg := registry.NewRegistry(nil, registry.CheckpointData{})
	s := New(Config{MemoryThrottlingFactor: 0.9, VerifyFail: true}, cgroup.Detect(), reg, nil, prometheus.NewRegistry())
	reg.AddContainer(registry.ContainerRecord{ID: "ctr", CgroupsPath: parent})
	created := &runtimeapi.LinuxContainerResources{CpuShares: 102, CpuQuota: 50000, CpuPeriod: 100000, MemoryLimitInBytes: 64 << 20}
	s.records.set("ctr", container{asked: cgroup.SpecResources(created), verification: ResultOK})

	// The memory resize: the runtime writes the new memory limit (and memory+swap, where the
	// node accounts swap) and keeps the quota.
	writeCgroupFiles(t, parent, "memory/memory.memsw.limit_in_bytes", fmt.Sprint(128<<20), "memory/memory.limit_in_bytes", fmt.Sprint(128<<20))
	if _, err := s.UpdateContainerResources(t.Context(), &runtimeapi.UpdateContainerResourcesRequest{
		ContainerId: "ctr", Linux: &runtimeapi.LinuxContainerResources{CpuShares: 102, CpuPeriod: 100000, MemoryLimitInBytes: 128 << 20},
	}, func(context.Context, *runtimeapi.UpdateContainerResourcesRequest) (*runtimeapi.UpdateContainerResourcesResponse, error) {
		return &runtimeapi.UpdateContainerResourcesResponse{}, nil
	}); err != nil {
		t.Fatalf("UpdateContainerResources of a cgroup as asked: %v", err)
	}
	if e, _ := s.records.get("ctr"); e.asked.CPU.Quota == nil || *e.asked.CPU.Quota != 50000 {
		t.Errorf("after the update podgate asks quota %v, want the 50000 the container keeps", e.asked.CPU.Quota)
	}
	writeCgroupFiles(t, parent, "cpu/cpu.cfs_quota_us", "30000")
	if err := s.verifyContainer(t.Context(), "ctr", "recheck"); !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "cpu.cfs_quota_us: asked 50000, cgroup holds 30000") {
		t.Errorf("recheck of a quota changed behind the runtime's back: %v; want a mismatch of cpu.cfs_quota_us", err)
	}
}
