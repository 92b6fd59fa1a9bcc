package resources

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podgate/podgate/cri/registry"
	"github.com/podgate/podgate/podresources/cgroup"
)

// writeCgroupFiles writes files of the cgroup v1 cgroup at path, in order: a file
// ("cpu/cpu.cfs_quota_us"), its content, the next file...
func writeCgroupFiles(t *testing.T, path string, files ...string) {
	t.Helper()
	for i := 0; i+1 < len(files); i += 2 {
		sub, name, _ := strings.Cut(files[i], "/")
		if err := os.WriteFile(filepath.Join("/sys/fs/cgroup", sub, path, name), []byte(files[i+1]), 0o644); err != nil {
			t.Fatalf("%s: %v", files[i], err)
		}
	}
}

// TestPodResizeUnlimitedPodCgroup: an in-place resize of a pod whose cgroup has no CPU quota or
// no memory limit, as the kubelet sends it (1.37 and 1.38 alike: the pod cgroup's values read
// back, the overhead taken out), is verified ok against a real cgroup v1 pod cgroup that has
// none; a pod cgroup that holds a limit the kubelet did not ask is still a mismatch.
func TestPodResizeUnlimitedPodCgroup(t *testing.T) {
	const mi = int64(1) << 20
	overhead := &runtimeapi.LinuxContainerResources{CpuShares: 256, CpuQuota: 25000, CpuPeriod: 100000, MemoryLimitInBytes: 128 * mi}
	for _, tc := range []struct {
		name          string
		cgroup        []string // the pod cgroup as the kubelet left it: file, content, ...
		res, overhead *runtimeapi.LinuxContainerResources
		want          []string // mismatches
	}{{
		name:   "no limits",
		cgroup: []string{"cpu/cpu.shares", "512", "cpu/cpu.cfs_quota_us", "-1", "memory/memory.limit_in_bytes", "-1"},
		res:    &runtimeapi.LinuxContainerResources{CpuShares: 512, CpuQuota: -1, CpuPeriod: 100000, MemoryLimitInBytes: v1Unlimited},
	}, {
		name:     "no limits, overhead taken out",
		cgroup:   []string{"cpu/cpu.shares", "768", "cpu/cpu.cfs_quota_us", "-1", "memory/memory.limit_in_bytes", "-1"},
		res:      &runtimeapi.LinuxContainerResources{CpuShares: 512, CpuQuota: -1 - 25000, CpuPeriod: 100000, MemoryLimitInBytes: v1Unlimited - 128*mi},
		overhead: overhead,
	}, {
		name:   "exclusive CPUs",
		cgroup: []string{"cpu/cpu.shares", "2048", "cpu/cpu.cfs_quota_us", "-1", "memory/memory.limit_in_bytes", fmt.Sprint(1024 * mi)},
		res:    &runtimeapi.LinuxContainerResources{CpuShares: 2048, CpuQuota: -1, CpuPeriod: 100000, MemoryLimitInBytes: 1024 * mi},
	}, {
		name:   "exclusive CPUs, a quota held and no memory limit",
		cgroup: []string{"cpu/cpu.shares", "2048", "cpu/cpu.cfs_quota_us", "200000", "memory/memory.limit_in_bytes", "-1"},
		res:    &runtimeapi.LinuxContainerResources{CpuShares: 2048, CpuQuota: -1, CpuPeriod: 100000, MemoryLimitInBytes: 1024 * mi},
		want: []string{
			"cpu.cfs_quota_us: asked -1 (no quota), cgroup holds 200000",
			"memory.limit_in_bytes: asked 1073741824, cgroup holds 9223372036854771712",
		},
	}, {
		name:   "no limits, a memory limit held",
		cgroup: []string{"cpu/cpu.shares", "512", "cpu/cpu.cfs_quota_us", "-1", "memory/memory.limit_in_bytes", fmt.Sprint(64 * mi)},
		res:    &runtimeapi.LinuxContainerResources{CpuShares: 512, CpuQuota: -1, CpuPeriod: 100000, MemoryLimitInBytes: v1Unlimited},
		want:   []string{"memory.limit_in_bytes: asked unlimited, cgroup holds 67108864"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			parent := podCgroup(t)
			writeCgroupFiles(t, parent, tc.cgroup...)
			reg := registry.NewRegistry(nil, registry.CheckpointData{})
			if err := reg.Add(registry.SandboxRecord{ID: "sb", Pod: registry.PodRef{UID: "uid-sb", Name: "p", Namespace: "ns"}, CgroupParent: parent, Origin: registry.OriginStarted}); err != nil {
				t.Fatal(err)
			}
			s := New(Config{MemoryThrottlingFactor: 0.9}, cgroup.Detect(), reg, nil, prometheus.NewRegistry())
			startSandbox(t, s, "sb", parent, &runtimeapi.LinuxContainerResources{CpuShares: 512, CpuPeriod: 100000})
			if _, err := s.UpdatePodSandboxResources(t.Context(), &runtimeapi.UpdatePodSandboxResourcesRequest{PodSandboxId: "sb", Resources: tc.res, Overhead: tc.overhead},
				func(context.Context, *runtimeapi.UpdatePodSandboxResourcesRequest) (*runtimeapi.UpdatePodSandboxResourcesResponse, error) {
					return &runtimeapi.UpdatePodSandboxResourcesResponse{}, nil
				}); err != nil {
				t.Fatal(err)
			}
			if err := s.Wait(t.Context()); err != nil {
				t.Fatal(err)
			}
			got := s.describePod("sb")
			want := ResultOK
			if len(tc.want) > 0 {
				want = ResultMismatch
			}
			if got.GetVerification() != want || !slices.Equal(got.GetMismatches(), tc.want) {
				t.Errorf("verification %q, mismatches %q (error %q); want %q, %q", got.GetVerification(), got.GetMismatches(), got.GetError(), want, tc.want)
			}
		})
	}
}
