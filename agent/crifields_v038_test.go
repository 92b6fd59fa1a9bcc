package agent

import (
	"bytes"
	"context"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/client-go/kubernetes/fake"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podgate/podgate/agent/config"
	"github.com/podgate/podgate/agent/kube/kubetest"
	"github.com/podgate/podgate/podresources/cgroup"
	"github.com/podgate/podgate/test/testfs"
)

// The CRI methods podgate intercepts, in the order of a pod's life: the sandbox pipeline's
// (agent/pipeline.go) and the hook tables' (agent/methods.go).
var interceptedMethods = []string{
	"PullImage", "RunPodSandbox", "CreateContainer", "StartContainer", "UpdateContainerResources",
	"UpdatePodSandboxResources", "RemoveContainer", "StopPodSandbox", "RemovePodSandbox",
}

// The methods podgate passes through whose request or answer can hold a field of cri-api v0.38
// (found from the descriptors: the test fails when one is missing here).
var passedMethods = []string{"PodSandboxStatus", "Status", "ListPodSandboxMetrics", "RestorePod", "GetContainerEvents", "StreamPodSandboxMetrics"}

// memoryQoSKeys are the unified keys memory QoS writes.
var memoryQoSKeys = []string{cgroup.MemoryMinKey, cgroup.MemoryLowKey, cgroup.MemoryHighKey}

// TestCRIv038FieldsCarried: a kubelet 1.38 sends, and a runtime of cri-api v0.38 answers,
// fields that podgate's cri-api (v0.37) does not know (criV038Fields: every field v0.38.0-beta.0
// adds to a message of v0.37, and the OCI profile type). Through the whole agent, each
// intercepted method's request carries every one its type can hold, nested where v0.38 puts it
// (written with protowire at the beta's field numbers), and the runtime (cri-client's fake
// behind a recorder of bytes) answers with every one its answer can hold; a request or answer
// that can hold none carries a field of no cri-api yet. Two pods:
//
//   - "as sent": podgate changes nothing (the pod's sysctls hold the node's defaults, the
//     kubelet wrote memory QoS itself): the runtime gets the kubelet's bytes, the kubelet the
//     runtime's, every one the same;
//   - "changed": podgate adds the node's default sysctl to RunPodSandbox and memory QoS to
//     CreateContainer and UpdateContainerResources, so it encodes those requests anew: the
//     runtime gets the request as podgate changed it and otherwise as sent, the new fields
//     byte for byte in their messages.
//
// The methods podgate passes through whose request or answer can hold a v0.38 field (sandbox
// status, runtime status, metrics, container events, the pod restore) carry them byte for
// byte both ways.
func TestCRIv038FieldsCarried(t *testing.T) {
	checkFieldsUnknown(t)
	methods := criMethods(t)
	for name, m := range methods {
		if (reaches(m.Input()) || reaches(m.Output())) && !slices.Contains(interceptedMethods, name) && !slices.Contains(passedMethods, name) {
			t.Errorf("%s's request or answer can hold a field of cri-api v0.38: add it to passedMethods", name)
		}
	}
	detected := detectCgroups
	detectCgroups = func() cgroup.Node { return v2Node } // memory QoS applies
	t.Cleanup(func() { detectCgroups = detected })

	dir := testfs.ShortDir(t)
	asFake := map[string]bool{}
	for _, name := range interceptedMethods {
		asFake[fullName(methods[name])] = true
	}
	rt := serveWireRuntime(t, filepath.Join(dir, "rt.sock"), asFake, func(method string, fakes proto.Message) (proto.Message, error) {
		out := methods[method[strings.LastIndex(method, "/")+1:]].Output()
		var resp proto.Message
		if fakes != nil {
			resp = proto.Clone(fakes)
		} else {
			resp = newMessage(t, out)
		}
		withNewFields(resp)
		return resp, nil
	})
	plain, changed := qosPod("as-sent"), qosPod("changed")
	cfg := testConfig(dir, filepath.Join(dir, "rt.sock"))
	cfg.NodeName = "node-a"
	cfg.Sysctls.PodDefaults = map[string]string{"net.ipv4.tcp_keepalive_time": "600"}
	cfg.Sysctls.Verify = config.VerifyWarn
	cfg.Resources.MemoryQoS = true
	runAgentWithAPI(t, cfg, fake.NewClientset(plain, changed))
	w := newWireClient(t, cfg.CRISocket)

	for _, tc := range []struct {
		pod *corev1.Pod
		// changes undoes, in the request the runtime got, what podgate changed in it, after
		// checking it did; a method not in it must reach the runtime as sent.
		changes map[string]func(t *testing.T, got, sent proto.Message)
	}{
		{plain, nil},
		{changed, map[string]func(t *testing.T, got, sent proto.Message){
			"RunPodSandbox":            undoDefaultSysctl,
			"CreateContainer":          undoMemoryQoS,
			"UpdateContainerResources": undoMemoryQoS,
		}},
	} {
		t.Run(tc.pod.Name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), kubetest.Timeout)
			defer cancel()
			l := &podLife{pod: tc.pod, sysctls: tc.changes == nil, kubeletQoS: tc.changes == nil}
			for _, name := range interceptedMethods {
				m := methods[name]
				sent := wireRequest(t, m, l.request(t, name))
				got, err := w.unary(ctx, tc.pod.Name, m, sent)
				if err != nil {
					t.Fatalf("%s: %v", name, err)
				}
				l.learn(t, name, got)
				call := rt.call(tc.pod.Name, fullName(m))
				if call == nil {
					t.Fatalf("%s did not reach the runtime", name)
				}
				if !bytes.Equal(got, call.answers[0]) {
					t.Errorf("%s: the answer reached the client as %x, the runtime sent %x", name, got, call.answers[0])
				}
				undo, changes := tc.changes[name]
				if !changes {
					if !bytes.Equal(call.req, sent) {
						t.Errorf("%s: the runtime got %x, the client sent %x", name, call.req, sent)
					}
					continue
				}
				checkChanged(t, m, call.req, sent, undo)
			}
		})
	}

	t.Run("passed through", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(t.Context(), kubetest.Timeout)
		defer cancel()
		for _, name := range passedMethods {
			m := methods[name]
			sent := wireRequest(t, m, newMessage(t, m.Input()))
			var got [][]byte
			var err error
			if m.IsStreamingServer() {
				got, err = w.serverStream(ctx, "passed", m, sent)
			} else {
				var one []byte
				one, err = w.unary(ctx, "passed", m, sent)
				got = [][]byte{one}
			}
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			call := rt.call("passed", fullName(m))
			switch {
			case call == nil:
				t.Fatalf("%s did not reach the runtime", name)
			case !bytes.Equal(call.req, sent):
				t.Errorf("%s: the runtime got %x, the client sent %x", name, call.req, sent)
			case !slices.EqualFunc(got, call.answers, bytes.Equal):
				t.Errorf("%s: the answer reached the client as %x, the runtime sent %x", name, got, call.answers)
			}
			for _, b := range got { // the runtime did answer with the new fields
				resp := newMessage(t, m.Output())
				if err := proto.Unmarshal(b, resp); err != nil {
					t.Fatalf("%s: answer %x: %v", name, b, err)
				}
				for _, bad := range newFieldsIn(resp.ProtoReflect(), "") {
					t.Errorf("%s answer: %s", name, bad)
				}
			}
		}
	})
}

// withNewFields writes into m every field of criV038Fields its type can hold, or futureField
// when it can hold none, and says where.
func withNewFields(m proto.Message) []string {
	r := m.ProtoReflect()
	if reaches(r.Descriptor()) {
		return addNewFields(r, "")
	}
	r.SetUnknown(append(r.GetUnknown(), futureField...))
	return []string{"(a field of no cri-api yet)"}
}

// wireRequest is req with the new fields (withNewFields), encoded: what a kubelet of cri-api
// v0.38 sends.
func wireRequest(t *testing.T, m protoreflect.MethodDescriptor, req proto.Message) []byte {
	t.Helper()
	if req.ProtoReflect().Descriptor() != m.Input() {
		t.Fatalf("wireRequest: a %s for %s", req.ProtoReflect().Descriptor().FullName(), m.Name())
	}
	t.Logf("%s request: new fields at %q", m.Name(), withNewFields(req))
	b, err := proto.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// checkChanged checks a request podgate changed: decoded, it holds the new fields where they
// were sent, byte for byte, and once undo has taken podgate's change out of it, it is the
// request as sent, its unknown fields compared byte for byte (proto.Equal).
func checkChanged(t *testing.T, m protoreflect.MethodDescriptor, got, sent []byte, undo func(t *testing.T, got, sent proto.Message)) {
	t.Helper()
	g, s := newMessage(t, m.Input()), newMessage(t, m.Input())
	if err := proto.Unmarshal(got, g); err != nil {
		t.Fatalf("%s: the runtime got bytes it cannot decode: %v", m.Name(), err)
	}
	if err := proto.Unmarshal(sent, s); err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(got, sent) {
		t.Errorf("%s: the runtime got the request as sent; podgate should have changed it", m.Name())
	}
	for _, bad := range newFieldsIn(g.ProtoReflect(), "") {
		t.Errorf("%s: %s", m.Name(), bad)
	}
	undo(t, g, s)
	if !proto.Equal(g, s) {
		t.Errorf("%s: besides podgate's change the runtime got\n%v\nthe client sent\n%v", m.Name(), g, s)
	}
}

// undoDefaultSysctl takes out of a RunPodSandbox the node's default sysctl podgate added.
func undoDefaultSysctl(t *testing.T, got, sent proto.Message) {
	t.Helper()
	lx := got.(*runtimeapi.RunPodSandboxRequest).GetConfig().GetLinux()
	if v, ok := lx.GetSysctls()["net.ipv4.tcp_keepalive_time"]; !ok || v != "600" {
		t.Errorf("RunPodSandbox: sysctls %v, want the node's default net.ipv4.tcp_keepalive_time=600 added", lx.GetSysctls())
	}
	delete(lx.Sysctls, "net.ipv4.tcp_keepalive_time")
}

// undoMemoryQoS takes out of a CreateContainer or UpdateContainerResources the memory QoS
// podgate added to its unified map.
func undoMemoryQoS(t *testing.T, got, sent proto.Message) {
	t.Helper()
	res := func(m proto.Message) *runtimeapi.LinuxContainerResources {
		switch r := m.(type) {
		case *runtimeapi.CreateContainerRequest:
			return r.GetConfig().GetLinux().GetResources()
		case *runtimeapi.UpdateContainerResourcesRequest:
			return r.GetLinux()
		}
		t.Fatalf("memory QoS in a %T", m)
		return nil
	}
	g, s := res(got), res(sent)
	added := 0
	for k := range maps.Keys(g.GetUnified()) {
		if _, ok := s.GetUnified()[k]; ok {
			continue
		}
		if !slices.Contains(memoryQoSKeys, k) {
			t.Errorf("%T: podgate added unified key %s, not memory QoS", got, k)
		}
		delete(g.Unified, k)
		added++
	}
	if added == 0 {
		t.Errorf("%T: unified %v, want memory QoS added", got, g.GetUnified())
	}
}

// qosPod is a Burstable pod of node-a with a container "app" requesting 64 MiB, limited to
// 128 MiB: memory QoS has memory.high to write.
func qosPod(name string) *corev1.Pod {
	p := kubetest.Pod(name, "")
	p.Spec.Containers = []corev1.Container{{Name: "app", Resources: corev1.ResourceRequirements{
		Requests: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("64Mi")},
		Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("128Mi")},
	}}}
	p.Status.QOSClass = corev1.PodQOSBurstable
	return p
}

// podLife makes the requests of a pod's life as a kubelet sends them, and learns the sandbox
// and container IDs from the answers.
type podLife struct {
	pod *corev1.Pod
	// sysctls: the pod asks the node's default sysctl itself; kubeletQoS: the kubelet wrote
	// memory QoS (memory.min) itself.
	sysctls, kubeletQoS bool
	sandboxID, ctrID    string
}

func (l *podLife) sandboxConfig() *runtimeapi.PodSandboxConfig {
	lx := &runtimeapi.LinuxPodSandboxConfig{
		CgroupParent: "/kubepods/burstable/pod" + string(l.pod.UID),
		SecurityContext: &runtimeapi.LinuxSandboxSecurityContext{
			NamespaceOptions: &runtimeapi.NamespaceOption{Network: runtimeapi.NamespaceMode_POD, Pid: runtimeapi.NamespaceMode_CONTAINER},
			Seccomp:          &runtimeapi.SecurityProfile{ProfileType: runtimeapi.SecurityProfile_RuntimeDefault},
		},
	}
	if l.sysctls {
		lx.Sysctls = map[string]string{"net.ipv4.tcp_keepalive_time": "600"}
	}
	return &runtimeapi.PodSandboxConfig{
		Metadata: &runtimeapi.PodSandboxMetadata{Name: l.pod.Name, Namespace: l.pod.Namespace, Uid: string(l.pod.UID)},
		Linux:    lx,
	}
}

func (l *podLife) resources() *runtimeapi.LinuxContainerResources {
	r := &runtimeapi.LinuxContainerResources{CpuPeriod: 100000, CpuShares: 102, MemoryLimitInBytes: 128 << 20}
	if l.kubeletQoS {
		r.Unified = map[string]string{cgroup.MemoryMinKey: "0", cgroup.MemoryHighKey: "126805606"}
	}
	return r
}

func (l *podLife) request(t *testing.T, method string) proto.Message {
	t.Helper()
	switch method {
	case "PullImage":
		return &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: "registry.example/app:v1"}, SandboxConfig: l.sandboxConfig()}
	case "RunPodSandbox":
		return &runtimeapi.RunPodSandboxRequest{Config: l.sandboxConfig()}
	case "CreateContainer":
		return &runtimeapi.CreateContainerRequest{PodSandboxId: l.sandboxID, SandboxConfig: l.sandboxConfig(), Config: &runtimeapi.ContainerConfig{
			Metadata: &runtimeapi.ContainerMetadata{Name: "app"}, Image: &runtimeapi.ImageSpec{Image: "registry.example/app:v1"},
			Linux: &runtimeapi.LinuxContainerConfig{Resources: l.resources(), SecurityContext: &runtimeapi.LinuxContainerSecurityContext{
				NamespaceOptions: &runtimeapi.NamespaceOption{Network: runtimeapi.NamespaceMode_POD, Pid: runtimeapi.NamespaceMode_CONTAINER},
				Seccomp:          &runtimeapi.SecurityProfile{ProfileType: runtimeapi.SecurityProfile_RuntimeDefault},
			}},
		}}
	case "StartContainer":
		return &runtimeapi.StartContainerRequest{ContainerId: l.ctrID}
	case "UpdateContainerResources":
		return &runtimeapi.UpdateContainerResourcesRequest{ContainerId: l.ctrID, Linux: l.resources()}
	case "UpdatePodSandboxResources":
		return &runtimeapi.UpdatePodSandboxResourcesRequest{PodSandboxId: l.sandboxID, Resources: &runtimeapi.LinuxContainerResources{CpuShares: 204, CpuQuota: 50000, CpuPeriod: 100000}}
	case "RemoveContainer":
		return &runtimeapi.RemoveContainerRequest{ContainerId: l.ctrID}
	case "StopPodSandbox":
		return &runtimeapi.StopPodSandboxRequest{PodSandboxId: l.sandboxID}
	case "RemovePodSandbox":
		return &runtimeapi.RemovePodSandboxRequest{PodSandboxId: l.sandboxID}
	}
	t.Fatalf("no request of %s", method)
	return nil
}

// learn takes the sandbox's and the container's ID from the answers that give them.
func (l *podLife) learn(t *testing.T, method string, answer []byte) {
	t.Helper()
	switch method {
	case "RunPodSandbox":
		var resp runtimeapi.RunPodSandboxResponse
		if err := proto.Unmarshal(answer, &resp); err != nil || resp.GetPodSandboxId() == "" {
			t.Fatalf("RunPodSandbox answered %x (%v): no sandbox ID", answer, err)
		}
		l.sandboxID = resp.GetPodSandboxId()
	case "CreateContainer":
		var resp runtimeapi.CreateContainerResponse
		if err := proto.Unmarshal(answer, &resp); err != nil || resp.GetContainerId() == "" {
			t.Fatalf("CreateContainer answered %x (%v): no container ID", answer, err)
		}
		l.ctrID = resp.GetContainerId()
	}
}
