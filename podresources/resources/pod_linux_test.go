package resources

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podgate/podgate/cri/pipeline"
	"github.com/podgate/podgate/cri/registry"
	"github.com/podgate/podgate/podresources/cgroup"
)

// podCgroup makes a cgroup v1 pod cgroup (cpu, cpuset, memory) for the test, as the kubelet's
// cgroupfs driver names one, and returns its cgroup parent.
func podCgroup(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: makes a cgroup under /sys/fs/cgroup")
	}
	if cgroup.Detect().Mode == cgroup.ModeUnified {
		t.Skip("writes cgroup v1 files; this node is cgroup v2")
	}
	name := fmt.Sprintf("/podgate-test-pod-%d-%s", os.Getpid(), strings.ReplaceAll(t.Name(), "/", "-"))
	for _, sub := range []string{"cpu", "cpuset", "memory"} {
		dir := filepath.Join("/sys/fs/cgroup", sub, name)
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Skipf("cannot make cgroup %s: %v", dir, err)
		}
		t.Cleanup(func() { _ = os.Remove(dir) })
	}
	return name
}

// writePodCgroup sets the pod cgroup as the kubelet does after a resize.
func writePodCgroup(t *testing.T, parent string, shares, quota, memory int64) {
	t.Helper()
	for file, v := range map[string]int64{"cpu/cpu.shares": shares, "cpu/cpu.cfs_quota_us": quota, "memory/memory.limit_in_bytes": memory} {
		sub, name, _ := strings.Cut(file, "/")
		if err := os.WriteFile(filepath.Join("/sys/fs/cgroup", sub, parent, name), []byte(fmt.Sprint(v)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// startSandbox runs the pod-resources stage for a RunPodSandbox with these pod-level resources.
func startSandbox(t *testing.T, s *Hooks, id, parent string, res *runtimeapi.LinuxContainerResources) {
	t.Helper()
	req := &runtimeapi.RunPodSandboxRequest{Config: &runtimeapi.PodSandboxConfig{
		Metadata: &runtimeapi.PodSandboxMetadata{Name: "p", Namespace: "ns", Uid: "uid-" + id},
		Linux:    &runtimeapi.LinuxPodSandboxConfig{CgroupParent: parent, Resources: res},
	}}
	sb := pipeline.NewSandbox(t.Context(), req, nil)
	sb.Rec.ID = id
	if err := s.PodStage().Run(t.Context(), sb); err != nil {
		t.Fatal(err)
	}
}

// TestPodLevelResources: the pod-level resources the kubelet sends with RunPodSandbox are what
// the PodResources extension shows, as requests and limits; an UpdatePodSandboxResources goes
// to the runtime as the kubelet sent it and answers as the runtime did, replaces them, and
// the pod cgroup read afterwards is verified against them: ok where it holds them, a mismatch
// naming the file where it does not. It reads a real cgroup v1 pod cgroup the test makes.
func TestPodLevelResources(t *testing.T) {
	parent := podCgroup(t)
	reg := registry.NewRegistry(nil, registry.CheckpointData{})
	if err := reg.Add(registry.SandboxRecord{ID: "sb1", Pod: registry.PodRef{UID: "uid-sb1", Name: "p", Namespace: "ns"}, CgroupParent: parent, Origin: registry.OriginStarted}); err != nil {
		t.Fatal(err)
	}
	s := New(Config{MemoryThrottlingFactor: 0.9}, cgroup.Detect(), reg, nil, prometheus.NewRegistry())
	started := &runtimeapi.LinuxContainerResources{CpuShares: 204, CpuQuota: 50000, CpuPeriod: 100000, MemoryLimitInBytes: 128 << 20}
	startSandbox(t, s, "sb1", parent, started)
	got := s.describePod("sb1")
	if want := map[string]string{"cpu": "200m"}; !maps.Equal(got.GetRequests(), want) {
		t.Errorf("requests %v, want %v", got.GetRequests(), want)
	}
	if want := map[string]string{"cpu": "500m", "memory": "128Mi"}; !maps.Equal(got.GetLimits(), want) {
		t.Errorf("limits %v, want %v", got.GetLimits(), want)
	}
	if got.GetVerification() != ResultUnverified || got.GetCgroupParent() != parent || got.GetResizes() != 0 {
		t.Errorf("after start: verification %q, parent %q, resizes %d; want unverified, %q, 0", got.GetVerification(), got.GetCgroupParent(), got.GetResizes(), parent)
	}

	resized := &runtimeapi.LinuxContainerResources{CpuShares: 512, CpuQuota: 100000, CpuPeriod: 100000, MemoryLimitInBytes: 256 << 20}
	update := func() {
		t.Helper()
		req := &runtimeapi.UpdatePodSandboxResourcesRequest{PodSandboxId: "sb1", Overhead: &runtimeapi.LinuxContainerResources{}, Resources: resized}
		want := proto.Clone(req)
		answer := &runtimeapi.UpdatePodSandboxResourcesResponse{}
		var sent *runtimeapi.UpdatePodSandboxResourcesRequest
		resp, err := s.UpdatePodSandboxResources(t.Context(), req, func(_ context.Context, r *runtimeapi.UpdatePodSandboxResourcesRequest) (*runtimeapi.UpdatePodSandboxResourcesResponse, error) {
			sent = r
			return answer, nil
		})
		if err != nil || resp != answer || sent != req || !proto.Equal(req, want) {
			t.Fatalf("UpdatePodSandboxResources: %v, %v; sent %v; want the request as sent and the runtime's answer", resp, err, sent)
		}
		if err := s.Wait(t.Context()); err != nil {
			t.Fatal(err)
		}
	}

	// The kubelet wrote the pod cgroup as asked.
	writePodCgroup(t, parent, 512, 100000, 256<<20)
	update()
	got = s.describePod("sb1")
	if got.GetVerification() != ResultOK || len(got.GetMismatches()) != 0 || got.GetResizes() != 1 {
		t.Errorf("cgroup as asked: verification %q, mismatches %v, resizes %d; want ok, none, 1 (error %q)", got.GetVerification(), got.GetMismatches(), got.GetResizes(), got.GetError())
	}
	if want := map[string]string{"cpu": "1", "memory": "256Mi"}; !maps.Equal(got.GetLimits(), want) {
		t.Errorf("limits after the resize %v, want %v", got.GetLimits(), want)
	}
	if got.GetHeld().GetMemoryMax() != 256<<20 || got.GetHeld().GetCpuQuota() != 100000 {
		t.Errorf("held %v, want the cgroup's memory limit and quota", got.GetHeld())
	}
	if n := testutil.ToFloat64(s.podVerifications.WithLabelValues("update", ResultOK)); n != 1 {
		t.Errorf("pod_verifications_total{update,ok} = %v, want 1", n)
	}

	// The pod cgroup drifted from what the kubelet sent the runtime.
	writePodCgroup(t, parent, 512, 100000, 64<<20)
	update()
	got = s.describePod("sb1")
	if got.GetVerification() != ResultMismatch || len(got.GetMismatches()) != 1 || !strings.HasPrefix(got.GetMismatches()[0], "memory.limit_in_bytes") {
		t.Errorf("drifted cgroup: verification %q, mismatches %v; want one mismatch of memory.limit_in_bytes", got.GetVerification(), got.GetMismatches())
	}
	if n := testutil.ToFloat64(s.podVerifications.WithLabelValues("update", ResultMismatch)); n != 1 {
		t.Errorf("pod_verifications_total{update,mismatch} = %v, want 1", n)
	}
	// A recheck reads it again.
	writePodCgroup(t, parent, 512, 100000, 256<<20)
	s.recheckPods(t.Context())
	if got := s.describePod("sb1").GetVerification(); got != ResultOK {
		t.Errorf("after the recheck: verification %q, want ok", got)
	}

	// The sandbox removed: nothing shown.
	if err := s.PodStage().Removed(t.Context(), "sb1"); err != nil {
		t.Fatal(err)
	}
	if got := s.describePod("sb1"); got != nil {
		t.Errorf("removed sandbox: %v, want nothing", got)
	}

	// A sandbox gone from the registry without podgate seeing it removed is forgotten at the
	// next recheck, not read again every period.
	startSandbox(t, s, "sb2", parent, started)
	update2 := func() {
		t.Helper()
		if _, err := s.UpdatePodSandboxResources(t.Context(), &runtimeapi.UpdatePodSandboxResourcesRequest{PodSandboxId: "sb2", Resources: resized},
			func(context.Context, *runtimeapi.UpdatePodSandboxResourcesRequest) (*runtimeapi.UpdatePodSandboxResourcesResponse, error) {
				return &runtimeapi.UpdatePodSandboxResourcesResponse{}, nil
			}); err != nil {
			t.Fatal(err)
		}
		if err := s.Wait(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	update2()
	if got := s.describePod("sb2").GetVerification(); got != ResultOK {
		t.Fatalf("sb2 after its resize: verification %q, want ok", got)
	}
	s.recheckPods(t.Context())
	if got := s.describePod("sb2"); got != nil {
		t.Errorf("sandbox unknown to the registry after a recheck: %v, want it forgotten", got)
	}
}

// TestPodResizeRuntimeAnswers: a runtime that refuses the resize fails it (the kubelet rejects
// it) and nothing is recorded; a runtime without the call (Unimplemented, and containerd 2.2's
// Unknown "not implemented yet") is answered as it answered, and the resize recorded, since the
// kubelet resizes the pod cgroup all the same. A sandbox podgate did not see start takes its
// cgroup parent from the pod registry.
func TestPodResizeRuntimeAnswers(t *testing.T) {
	reg := registry.NewRegistry(nil, registry.CheckpointData{})
	s := New(Config{MemoryThrottlingFactor: 0.9}, cgroup.Node{}, reg, nil, prometheus.NewRegistry())
	call := func(id string, answer error) error {
		_, err := s.UpdatePodSandboxResources(t.Context(), &runtimeapi.UpdatePodSandboxResourcesRequest{
			PodSandboxId: id, Resources: &runtimeapi.LinuxContainerResources{MemoryLimitInBytes: 1 << 30},
		}, func(context.Context, *runtimeapi.UpdatePodSandboxResourcesRequest) (*runtimeapi.UpdatePodSandboxResourcesResponse, error) {
			return nil, answer
		})
		if werr := s.Wait(t.Context()); werr != nil {
			t.Fatal(werr)
		}
		return err
	}
	refused := status.Error(codes.InvalidArgument, "no")
	if err := call("refused", refused); status.Code(err) != codes.InvalidArgument {
		t.Errorf("refused: %v, want the runtime's InvalidArgument", err)
	}
	if got := s.describePod("refused"); got != nil {
		t.Errorf("refused resize recorded: %v", got)
	}
	for _, answer := range []error{status.Error(codes.Unimplemented, "no"), status.Error(codes.Unknown, "not implemented yet")} {
		if err := call("old-runtime", answer); status.Code(err) != status.Code(answer) {
			t.Errorf("%v: answered %v, want the runtime's answer", answer, err)
		}
	}
	got := s.describePod("old-runtime")
	if got.GetResizes() != 2 || got.GetLimits()["memory"] != "1Gi" {
		t.Errorf("runtime without the call: %v; want 2 resizes recorded, memory limit 1Gi", got)
	}
	// Unknown to the registry too: no cgroup parent, an error, not a guess.
	if got.GetVerification() != ResultError || !strings.Contains(got.GetError(), "cgroup parent") {
		t.Errorf("no cgroup parent: verification %q, error %q; want error, saying why", got.GetVerification(), got.GetError())
	}
	// Known to the registry (podgate restarted since the sandbox started): its parent.
	if err := reg.Add(registry.SandboxRecord{ID: "adopted", Pod: registry.PodRef{UID: "uid-a", Name: "a", Namespace: "ns"}, CgroupParent: "/kubepods/burstable/poduid-a", Origin: registry.OriginAdopted}); err != nil {
		t.Fatal(err)
	}
	if err := call("adopted", nil); err != nil {
		t.Fatal(err)
	}
	if got := s.describePod("adopted"); got.GetCgroupParent() != "/kubepods/burstable/poduid-a" {
		t.Errorf("adopted sandbox: cgroup parent %q, want the registry's", got.GetCgroupParent())
	}
}
