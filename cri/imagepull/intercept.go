package imagepull

import (
	"context"
	"slices"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podgate/podgate/cri"
)

// Prioritizer returns the priority of a pull from its request (its sandbox config names the
// pod). A nil Prioritizer makes every pull normal.
type Prioritizer func(ctx context.Context, req *runtimeapi.PullImageRequest) Priority

// Interceptor is the governor as a PullImage interceptor: it rejects a bad image reference with
// InvalidArgument before anything is queued, then holds the call in the governor.
func (g *Governor) Interceptor(prio Prioritizer) cri.Interceptor[*runtimeapi.PullImageRequest, *runtimeapi.PullImageResponse] {
	return func(ctx context.Context, req *runtimeapi.PullImageRequest, next cri.Forward[*runtimeapi.PullImageRequest, *runtimeapi.PullImageResponse]) (*runtimeapi.PullImageResponse, error) {
		p, err := NewPull(req)
		if err != nil {
			return nil, err
		}
		if prio != nil {
			p.Priority = prio(ctx, req)
		}
		return g.Do(ctx, p, func(ctx context.Context) (*runtimeapi.PullImageResponse, error) {
			return next(ctx, req)
		})
	}
}

// SandboxPriority derives a pull's priority without the Kubernetes API, from the sandbox
// config that comes with the PullImage call: a pod in one of Namespaces whose label (or
// annotation) Label names system-node-critical or system-cluster-critical gets that priority.
// The namespace restriction mirrors Kubernetes, which admits the system-* classes only in
// kube-system by default.
type SandboxPriority struct {
	// Label is the pod label or annotation key that carries a priority class name.
	Label string
	// Namespaces are the namespaces whose pods may claim a critical priority this way.
	Namespaces []string
}

// Of returns the priority the sandbox config claims, or PriorityNormal.
func (s SandboxPriority) Of(cfg *runtimeapi.PodSandboxConfig) Priority {
	if s.Label == "" || cfg == nil {
		return PriorityNormal
	}
	ns := cfg.GetMetadata().GetNamespace()
	if !slices.Contains(s.Namespaces, ns) {
		return PriorityNormal
	}
	class, ok := cfg.GetLabels()[s.Label]
	if !ok {
		class = cfg.GetAnnotations()[s.Label]
	}
	return PriorityOf(class, nil)
}
