package agent

import (
	"context"
	"fmt"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podgate/podgate/agent/config"
	"github.com/podgate/podgate/cri/imagepull"
	"github.com/podgate/podgate/cri/pipeline"
	"github.com/podgate/podgate/cri/registry"
	"github.com/podgate/podgate/podresources/cgroup"
	"github.com/podgate/podgate/podresources/resources"
	"github.com/podgate/podgate/sysctl"
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
		fillAll(req.ProtoReflect(), 0)
		fillAll(resp.ProtoReflect(), 0)
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

// fillAll sets every field of m, nested messages, lists and maps included (to depth 6), each to
// a value of its own.
func fillAll(m protoreflect.Message, depth int) {
	fields := m.Descriptor().Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		switch {
		case fd.IsMap():
			mp := m.Mutable(fd).Map()
			v := mp.NewValue()
			if fd.MapValue().Kind() == protoreflect.MessageKind {
				if depth < 6 {
					fillAll(v.Message(), depth+1)
				}
			} else {
				v = scalar(fd.MapValue(), i)
			}
			mp.Set(scalar(fd.MapKey(), i).MapKey(), v)
		case fd.IsList():
			l := m.Mutable(fd).List()
			if fd.Kind() == protoreflect.MessageKind || fd.Kind() == protoreflect.GroupKind {
				if depth < 6 {
					v := l.NewElement()
					fillAll(v.Message(), depth+1)
					l.Append(v)
				}
				continue
			}
			l.Append(scalar(fd, i))
		case fd.Kind() == protoreflect.MessageKind || fd.Kind() == protoreflect.GroupKind:
			if depth < 6 {
				fillAll(m.Mutable(fd).Message(), depth+1)
			}
		default:
			m.Set(fd, scalar(fd, i))
		}
	}
}

// scalar is a non-zero value of fd's kind, told apart by i.
func scalar(fd protoreflect.FieldDescriptor, i int) protoreflect.Value {
	switch fd.Kind() {
	case protoreflect.BoolKind:
		return protoreflect.ValueOfBool(true)
	case protoreflect.EnumKind:
		vals := fd.Enum().Values()
		return protoreflect.ValueOfEnum(vals.Get(vals.Len() - 1).Number())
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind:
		return protoreflect.ValueOfInt32(int32(i + 1))
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		return protoreflect.ValueOfInt64(int64(i + 1))
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
		return protoreflect.ValueOfUint32(uint32(i + 1))
	case protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		return protoreflect.ValueOfUint64(uint64(i + 1))
	case protoreflect.FloatKind:
		return protoreflect.ValueOfFloat32(float32(i) + 0.5)
	case protoreflect.DoubleKind:
		return protoreflect.ValueOfFloat64(float64(i) + 0.5)
	case protoreflect.BytesKind:
		return protoreflect.ValueOfBytes([]byte{byte(i + 1)})
	}
	return protoreflect.ValueOfString(fmt.Sprintf("%s-%d", fd.Name(), i))
}
