package agent

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"k8s.io/apimachinery/pkg/util/wait"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podgate/podgate/agent/config"
	"github.com/podgate/podgate/agent/kube/kubetest"
	"github.com/podgate/podgate/cri/imagepull"
	"github.com/podgate/podgate/cri/pipeline"
	"github.com/podgate/podgate/cri/registry"
	"github.com/podgate/podgate/podresources/cgroup"
	"github.com/podgate/podgate/podresources/resources"
	"github.com/podgate/podgate/sysctl"
	"github.com/podgate/podgate/test/protofill"
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

// TestReadOnlyHooksChangeNothing: a hook the tables mark readOnly is registered with
// cri.Observe, so a change it made to a message would silently not be sent. Each one runs here
// on a request with every field set and a runtime answer with every field set, and leaves both
// as they were, answering with the runtime's own response.
func TestReadOnlyHooksChangeNothing(t *testing.T) {
	cfg := config.DefaultConfiguration()
	cfg.Sysctls.PodDefaults = map[string]string{"net.ipv4.tcp_keepalive_time": "600"}
	policy, err := sysctlPolicy(&cfg.Sysctls, nil)
	if err != nil {
		t.Fatal(err)
	}
	reg := registry.NewRegistry(nil, registry.CheckpointData{})
	records, err := sysctl.NewRecords(reg)
	if err != nil {
		t.Fatal(err)
	}
	pulls, err := imagepull.NewFeature(t.Context(), imagepull.Limits{}, imagepull.SandboxPriority{}, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{
		pulls:   pulls,
		sysctls: sysctl.NewStages(policy, sysctl.VerifyMode(config.VerifyFail), records, prometheus.NewRegistry()),
		// Memory QoS off, podgate's default: the resources hooks only read then.
		resources: resources.New(resourcesConfig(config.Resources{MemoryThrottlingFactor: 0.9, Verify: config.ResourcesVerifyWarn, RecheckPeriod: &config.Duration{}}),
			v2Node, reg, noStatus{}, prometheus.NewRegistry()),
	}
	t.Cleanup(func() {
		for _, wait := range []func(context.Context) error{p.sysctls.Wait, p.resources.Wait} {
			if err := wait(context.Background()); err != nil {
				t.Error(err)
			}
		}
	})
	n := checkReadOnly(t, "CreateContainer", p.createContainerHooks()) +
		checkReadOnly(t, "StartContainer", p.startContainerHooks()) +
		checkReadOnly(t, "UpdateContainerResources", p.updateContainerResourcesHooks()) +
		checkReadOnly(t, "UpdatePodSandboxResources", p.updatePodSandboxResourcesHooks()) +
		checkReadOnly(t, "RemoveContainer", p.removeContainerHooks()) +
		checkReadOnly(t, "PullImage", p.pullImageHooks())
	if n < 6 {
		t.Errorf("%d read-only hooks checked; the tables mark at least 6 with memory QoS off", n)
	}
}

// checkReadOnly runs each of hooks marked readOnly and reports a change it made; it returns
// how many it ran.
func checkReadOnly[Req, Resp proto.Message](t *testing.T, method string, hooks []pipeline.Hook[Req, Resp]) int {
	t.Helper()
	n := 0
	for _, h := range hooks {
		if !h.ReadOnly {
			continue
		}
		n++
		var zeroReq Req
		var zeroResp Resp
		req := zeroReq.ProtoReflect().Type().New().Interface().(Req)
		resp := zeroResp.ProtoReflect().Type().New().Interface().(Resp)
		protofill.Fill(req.ProtoReflect())
		protofill.Fill(resp.ProtoReflect())
		wantReq, wantResp := proto.Clone(req), proto.Clone(resp)
		var sent Req
		got, err := h.Fn(t.Context(), req, func(_ context.Context, r Req) (Resp, error) {
			sent = r
			return resp, nil
		})
		if err != nil {
			t.Errorf("%s, %s hook: %v", method, h.Feature, err)
			continue
		}
		if proto.Message(sent) != proto.Message(req) || !proto.Equal(req, wantReq) {
			t.Errorf("%s, %s hook: forwarded a changed request:\n got %v\nwant %v", method, h.Feature, sent, wantReq)
		}
		if proto.Message(got) != proto.Message(resp) || !proto.Equal(resp, wantResp) {
			t.Errorf("%s, %s hook: answered a changed response:\n got %v\nwant %v", method, h.Feature, got, wantResp)
		}
	}
	return n
}

// TestHooksWired: the agent plugs its tables into the CRI server: CreateContainer waits while
// the sandbox's sysctls are verified in the background (sysctl's hook; the runtime gives the
// sandbox's status only when the test says so, once CreateContainer is in podgate) and records
// the container (resources'); RemoveContainer forgets it.
func TestHooksWired(t *testing.T) {
	rt := newHeldStatus()
	a, cfg, stop, sb, id := runSysctlPod(t, rt)
	defer func() {
		if err := stop(); err != nil {
			t.Error(err)
		}
	}()
	client := criClient(t, cfg.CRISocket)
	created := make(chan *runtimeapi.CreateContainerResponse, 1)
	go func() {
		resp, err := client.CreateContainer(t.Context(), &runtimeapi.CreateContainerRequest{PodSandboxId: id, SandboxConfig: sb,
			Config: &runtimeapi.ContainerConfig{Metadata: &runtimeapi.ContainerMetadata{Name: "app"}, Image: &runtimeapi.ImageSpec{Image: "busybox"}}})
		if err != nil {
			t.Error(err)
		}
		created <- resp
	}()
	err := wait.PollUntilContextTimeout(t.Context(), time.Millisecond, kubetest.Timeout, true, func(context.Context) (bool, error) {
		inFlight := findMetric(t, a.registry, "podgate_cri_requests_in_flight", "method", "CreateContainer").GetGauge().GetValue()
		return inFlight == 1 || len(created) == 1, nil // held in podgate, or (the hook missing) answered
	})
	if err != nil {
		t.Fatalf("CreateContainer neither held nor answered: %v", err)
	}
	close(rt.release)
	resp := <-created
	if rt.early.Load() {
		t.Error("CreateContainer reached the runtime before the sandbox's sysctls were verified")
	}
	if _, ok := proxyOf(t, a).state.Sandboxes.Container(resp.GetContainerId()); !ok {
		t.Errorf("container %s not recorded", resp.GetContainerId())
	}
	if _, err := client.RemoveContainer(t.Context(), &runtimeapi.RemoveContainerRequest{ContainerId: resp.GetContainerId()}); err != nil {
		t.Fatal(err)
	}
	if _, ok := proxyOf(t, a).state.Sandboxes.Container(resp.GetContainerId()); ok {
		t.Errorf("removed container %s still recorded", resp.GetContainerId())
	}
}
