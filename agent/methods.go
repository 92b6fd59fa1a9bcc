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
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podgate/podgate/cri"
	"github.com/podgate/podgate/cri/pipeline"
)

type (
	createContainerHook    = pipeline.Hook[*runtimeapi.CreateContainerRequest, *runtimeapi.CreateContainerResponse]
	startContainerHook     = pipeline.Hook[*runtimeapi.StartContainerRequest, *runtimeapi.StartContainerResponse]
	updateResourcesHook    = pipeline.Hook[*runtimeapi.UpdateContainerResourcesRequest, *runtimeapi.UpdateContainerResourcesResponse]
	updatePodResourcesHook = pipeline.Hook[*runtimeapi.UpdatePodSandboxResourcesRequest, *runtimeapi.UpdatePodSandboxResourcesResponse]
	removeContainerHook    = pipeline.Hook[*runtimeapi.RemoveContainerRequest, *runtimeapi.RemoveContainerResponse]
	pullImageHook          = pipeline.Hook[*runtimeapi.PullImageRequest, *runtimeapi.PullImageResponse]
)

// createContainerHooks: CreateContainer.
func (p *proxy) createContainerHooks() []createContainerHook {
	return []createContainerHook{
		{Feature: "sysctl", Before: "wait while the sandbox's sysctls are verified (verify: fail)", Fn: p.sysctls.CreateContainer, ReadOnly: true},
		{Feature: "resources", Before: "add memory.min/memory.high (memory QoS)", After: "record the container in its sandbox", Fn: p.resources.CreateContainer, ReadOnly: !p.resources.MemoryQoS()},
	}
}

// startContainerHooks: StartContainer.
func (p *proxy) startContainerHooks() []startContainerHook {
	return []startContainerHook{
		{Feature: "resources", After: "verify the container's cgroup, in the background once the calls pause", Fn: p.resources.StartContainer, ReadOnly: true},
	}
}

// updateContainerResourcesHooks: UpdateContainerResources.
func (p *proxy) updateContainerResourcesHooks() []updateResourcesHook {
	return []updateResourcesHook{
		{Feature: "resources", Before: "add memory.min/memory.high (memory QoS)", After: "verify the container's cgroup (in the answer with verify: fail)", Fn: p.resources.UpdateContainerResources, ReadOnly: !p.resources.MemoryQoS()},
	}
}

// updatePodSandboxResourcesHooks: UpdatePodSandboxResources (an in-place pod-level resize).
func (p *proxy) updatePodSandboxResourcesHooks() []updatePodResourcesHook {
	return []updatePodResourcesHook{
		{Feature: "resources", After: "record the pod-level resources; verify the pod's cgroup, in the background once the calls pause (the kubelet writes it after the answer)", Fn: p.resources.UpdatePodSandboxResources, ReadOnly: true},
	}
}

// removeContainerHooks: RemoveContainer.
func (p *proxy) removeContainerHooks() []removeContainerHook {
	return []removeContainerHook{
		{Feature: "resources", After: "forget the container", Fn: p.resources.RemoveContainer, ReadOnly: true},
	}
}

// pullImageHooks: PullImage.
func (p *proxy) pullImageHooks() []pullImageHook {
	return []pullImageHook{
		{Feature: "image-pulls", Before: "refuse a bad reference; queue under the caps by priority; share an identical pull; drop the pull of a deleted pod", Fn: p.pulls.Interceptor()},
	}
}

// pullSecurityProfileHook: PullSecurityProfile (cri-api v0.38, KEP-6061), which podgate's
// cri-api v0.37 has no types for: one hook, on the request's bytes (cri.InterceptRaw), until
// podgate moves to cri-api v0.38.0 and it becomes a table like PullImage's. image-pulls:
// refuse a bad reference; queue with the image pulls, under the same caps, by priority; share
// an identical pull; drop the pull of a deleted pod.
func (p *proxy) pullSecurityProfileHook() cri.RawInterceptor {
	return p.pulls.ProfileInterceptor()
}

// register plugs every table into the CRI server: the sandbox pipeline's methods, then the
// tables above.
func (p *proxy) register() {
	p.pipeline.Register(p.server)
	pipeline.Intercept(p.server, cri.CreateContainer, p.createContainerHooks())
	pipeline.Intercept(p.server, cri.StartContainer, p.startContainerHooks())
	pipeline.Intercept(p.server, cri.UpdateContainerResources, p.updateContainerResourcesHooks())
	pipeline.Intercept(p.server, cri.UpdatePodSandboxResources, p.updatePodSandboxResourcesHooks())
	pipeline.Intercept(p.server, cri.RemoveContainer, p.removeContainerHooks())
	pipeline.Intercept(p.server, cri.PullImage, p.pullImageHooks())
	cri.InterceptRaw(p.server, cri.PullSecurityProfile, p.pullSecurityProfileHook())
}
