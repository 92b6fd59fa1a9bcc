package agent

// The CRI methods podgate steps into, and in which order its features act on each: one table
// per method. RunPodSandbox, StopPodSandbox and RemovePodSandbox are the sandbox pipeline's
// (pipeline.go, sandboxStages); every other intercepted method is here. Methods in no table
// are forwarded untouched, byte for byte.
//
// A table lists hooks, outermost first: the first hook's "before" runs first and its "after"
// last, as with nested calls. A hook may refuse the call before it is forwarded (nothing
// reaches the runtime), wait, change the request, or act on the answer. A hook that changes
// neither message says so (readOnly): a method whose hooks all only read is forwarded as the
// kubelet sent it and answered as the runtime did, without the copies and comparisons that
// finding a change costs (cri.Observe).

import (
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podgate/podgate/cri"
)

// hook is one feature's part in one CRI method.
type hook[Req, Resp proto.Message] struct {
	// feature names the feature (sysctl, resources, image-pulls), for logs and docs.
	feature string
	// before and after say what it does before forwarding and with the answer.
	before, after string
	fn            cri.Interceptor[Req, Resp]
	// readOnly: fn changes neither the request nor the answer (TestReadOnlyHooksChangeNothing
	// holds it to that).
	readOnly bool
}

type (
	createContainerHook = hook[*runtimeapi.CreateContainerRequest, *runtimeapi.CreateContainerResponse]
	startContainerHook  = hook[*runtimeapi.StartContainerRequest, *runtimeapi.StartContainerResponse]
	updateResourcesHook = hook[*runtimeapi.UpdateContainerResourcesRequest, *runtimeapi.UpdateContainerResourcesResponse]
	removeContainerHook = hook[*runtimeapi.RemoveContainerRequest, *runtimeapi.RemoveContainerResponse]
	pullImageHook       = hook[*runtimeapi.PullImageRequest, *runtimeapi.PullImageResponse]
)

// createContainerHooks: CreateContainer.
func (p *proxy) createContainerHooks() []createContainerHook {
	return []createContainerHook{
		{feature: "sysctl", before: "wait while the sandbox's sysctls are verified (verify: fail)", fn: p.sysctls.createContainer, readOnly: true},
		{feature: "resources", before: "add memory.min/memory.high (memory QoS)", after: "record the container in its sandbox", fn: p.resources.createContainer, readOnly: !p.resources.memoryQoS},
	}
}

// startContainerHooks: StartContainer.
func (p *proxy) startContainerHooks() []startContainerHook {
	return []startContainerHook{
		{feature: "resources", after: "verify the container's cgroup, in the background once the calls pause", fn: p.resources.startContainer, readOnly: true},
	}
}

// updateContainerResourcesHooks: UpdateContainerResources.
func (p *proxy) updateContainerResourcesHooks() []updateResourcesHook {
	return []updateResourcesHook{
		{feature: "resources", before: "add memory.min/memory.high (memory QoS)", after: "verify the container's cgroup (in the answer with verify: fail)", fn: p.resources.updateContainerResources, readOnly: !p.resources.memoryQoS},
	}
}

// removeContainerHooks: RemoveContainer.
func (p *proxy) removeContainerHooks() []removeContainerHook {
	return []removeContainerHook{
		{feature: "resources", after: "forget the container", fn: p.resources.removeContainer, readOnly: true},
	}
}

// pullImageHooks: PullImage.
func (p *proxy) pullImageHooks() []pullImageHook {
	return []pullImageHook{
		{feature: "image-pulls", before: "refuse a bad reference; queue under the caps by priority; share an identical pull; drop the pull of a deleted pod", fn: p.pullInterceptor},
	}
}

// intercept plugs a method's hooks into the CRI server, in the table's order.
func intercept[Req, Resp proto.Message](s *cri.Server, m cri.Method[Req, Resp], hooks []hook[Req, Resp]) {
	for _, h := range hooks {
		if h.readOnly {
			cri.Observe(s, m, h.fn)
		} else {
			cri.Intercept(s, m, h.fn)
		}
	}
}

// register plugs every table into the CRI server: the sandbox pipeline's methods, then the
// tables above.
func (p *proxy) register() {
	p.pipeline.register(p.server)
	p.resources.quiet = quietOf(p.server)
	intercept(p.server, cri.CreateContainer, p.createContainerHooks())
	intercept(p.server, cri.StartContainer, p.startContainerHooks())
	intercept(p.server, cri.UpdateContainerResources, p.updateContainerResourcesHooks())
	intercept(p.server, cri.RemoveContainer, p.removeContainerHooks())
	intercept(p.server, cri.PullImage, p.pullImageHooks())
}
