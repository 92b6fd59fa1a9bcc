package resources

import (
	"maps"
	"testing"

	"github.com/google/go-cmp/cmp"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// v1Unlimited is cgroup v1's memory.limit_in_bytes without a limit, with 4 KiB pages: what the
// kubelet reads back from a pod cgroup without a memory limit and sends in
// UpdatePodSandboxResources (cm.readCgroupMemoryConfig).
const v1Unlimited = int64(9223372036854771712)

func ptr[T any](v T) *T { return &v }

// TestPodSpecKubelet138: the pod-level resources as the kubelets send them, with RunPodSandbox
// and with UpdatePodSandboxResources (kubelet 1.38.0-beta.0: kuberuntime_sandbox_linux.go
// calculateSandboxResources; kuberuntime_manager.go doPodResizeAction; helpers_linux.go
// subtractOverheadFromResourceConfig), become what the pod cgroup is to hold (podSpec, which
// the verification compares; cgroup.Compare's own tests cover how -1 and the kernel's
// unlimited compare) and the limits the PodResources extension shows: no limit asked is no
// limit shown, and a limit is shown as the pod's.
func TestPodSpecKubelet138(t *testing.T) {
	const mi = int64(1) << 20
	overhead := &runtimeapi.LinuxContainerResources{CpuShares: 256, CpuQuota: 25000, CpuPeriod: 100000, MemoryLimitInBytes: 128 * mi}
	for _, tc := range []struct {
		name               string
		res, overhead      *runtimeapi.LinuxContainerResources
		wantCPU            specs.LinuxCPU
		wantMemory         *int64 // nil: not compared
		wantLimits, wantRq map[string]string
	}{{
		// Two containers, one limited to 500m and 64Mi: the kubelet 1.37 sent the partial
		// sums; the pod cgroup has no limit (cm.ResourceConfigForPod). podgate does not check
		// the pod cgroup against RunPodSandbox's resources, only after a resize.
		name:    "1.37 RunPodSandbox, partial sums",
		res:     &runtimeapi.LinuxContainerResources{CpuShares: 204, CpuQuota: 50000, CpuPeriod: 100000, MemoryLimitInBytes: 64 * mi},
		wantCPU: specs.LinuxCPU{Shares: ptr(uint64(204)), Quota: ptr(int64(50000)), Period: ptr(uint64(100000))}, wantMemory: ptr(64 * mi),
		wantLimits: map[string]string{"cpu": "500m", "memory": "64Mi"}, wantRq: map[string]string{"cpu": "200m"},
	}, {
		// The same pod, kubelet 1.38 (kubernetes#141014): the limits left out.
		name:       "1.38 RunPodSandbox, limits left out",
		res:        &runtimeapi.LinuxContainerResources{CpuShares: 204, CpuPeriod: 100000},
		wantCPU:    specs.LinuxCPU{Shares: ptr(uint64(204)), Period: ptr(uint64(100000))},
		wantLimits: map[string]string{}, wantRq: map[string]string{"cpu": "200m"},
	}, {
		name:       "every container limited",
		res:        &runtimeapi.LinuxContainerResources{CpuShares: 204, CpuQuota: 50000, CpuPeriod: 100000, MemoryLimitInBytes: 64 * mi},
		overhead:   overhead,
		wantCPU:    specs.LinuxCPU{Quota: ptr(int64(75000)), Period: ptr(uint64(100000))},
		wantMemory: ptr(192 * mi), wantLimits: map[string]string{"cpu": "500m", "memory": "64Mi"}, wantRq: map[string]string{"cpu": "200m"},
	}, {
		// A resize of a pod without limits on cgroup v1: the quota and memory limit read back.
		name:       "resize, no limits, cgroup v1",
		res:        &runtimeapi.LinuxContainerResources{CpuShares: 512, CpuQuota: -1, CpuPeriod: 100000, MemoryLimitInBytes: v1Unlimited},
		wantCPU:    specs.LinuxCPU{Shares: ptr(uint64(512)), Quota: ptr(int64(-1)), Period: ptr(uint64(100000))},
		wantMemory: ptr(v1Unlimited), wantLimits: map[string]string{}, wantRq: map[string]string{"cpu": "500m"},
	}, {
		name:       "resize, no limits, cgroup v1, overhead taken out",
		res:        &runtimeapi.LinuxContainerResources{CpuShares: 256, CpuQuota: -1 - 25000, CpuPeriod: 100000, MemoryLimitInBytes: v1Unlimited - 128*mi},
		overhead:   overhead,
		wantCPU:    specs.LinuxCPU{Quota: ptr(int64(-1)), Period: ptr(uint64(100000))},
		wantMemory: ptr(v1Unlimited), wantLimits: map[string]string{}, wantRq: map[string]string{"cpu": "250m"},
	}, {
		// cgroup v2: "max" read back as math.MaxUint64, -1 as an int64.
		name:       "resize, no limits, cgroup v2",
		res:        &runtimeapi.LinuxContainerResources{CpuShares: 512, CpuQuota: -1, CpuPeriod: 100000, MemoryLimitInBytes: -1},
		wantCPU:    specs.LinuxCPU{Shares: ptr(uint64(512)), Quota: ptr(int64(-1)), Period: ptr(uint64(100000))},
		wantMemory: ptr(int64(-1)), wantLimits: map[string]string{}, wantRq: map[string]string{"cpu": "500m"},
	}, {
		name:       "resize, no limits, cgroup v2, overhead taken out",
		res:        &runtimeapi.LinuxContainerResources{CpuShares: 256, CpuQuota: -1 - 25000, CpuPeriod: 100000, MemoryLimitInBytes: -1 - 128*mi},
		overhead:   overhead,
		wantCPU:    specs.LinuxCPU{Quota: ptr(int64(-1)), Period: ptr(uint64(100000))},
		wantMemory: ptr(int64(-1)), wantLimits: map[string]string{}, wantRq: map[string]string{"cpu": "250m"},
	}, {
		// Exclusive CPUs (2, Guaranteed): CFS quota off for the pod, its memory limited.
		name:       "exclusive CPUs",
		res:        &runtimeapi.LinuxContainerResources{CpuShares: 2048, CpuQuota: -1, CpuPeriod: 100000, MemoryLimitInBytes: 1024 * mi},
		wantCPU:    specs.LinuxCPU{Shares: ptr(uint64(2048)), Quota: ptr(int64(-1)), Period: ptr(uint64(100000))},
		wantMemory: ptr(1024 * mi), wantLimits: map[string]string{"memory": "1Gi"}, wantRq: map[string]string{"cpu": "2"},
	}, {
		name:       "exclusive CPUs, overhead taken out",
		res:        &runtimeapi.LinuxContainerResources{CpuShares: 2048, CpuQuota: -1 - 25000, CpuPeriod: 100000, MemoryLimitInBytes: 1024 * mi},
		overhead:   overhead,
		wantCPU:    specs.LinuxCPU{Quota: ptr(int64(-1)), Period: ptr(uint64(100000))},
		wantMemory: ptr(1152 * mi), wantLimits: map[string]string{"memory": "1Gi"}, wantRq: map[string]string{"cpu": "2"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			over := tc.overhead
			if over == nil {
				over = &runtimeapi.LinuxContainerResources{}
			}
			got := podSpec(tc.res, over)
			if diff := cmp.Diff(&tc.wantCPU, got.CPU); diff != "" {
				t.Errorf("CPU the pod cgroup is to hold (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(&specs.LinuxMemory{Limit: tc.wantMemory}, got.Memory); diff != "" {
				t.Errorf("memory the pod cgroup is to hold (-want +got):\n%s", diff)
			}
			requests, limits := podQuantities(tc.res, over, 4096)
			if !maps.Equal(limits, tc.wantLimits) || !maps.Equal(requests, tc.wantRq) {
				t.Errorf("shown: requests %v, limits %v; want %v, %v", requests, limits, tc.wantRq, tc.wantLimits)
			}
		})
	}
}
