package podresources

import (
	"context"
	"errors"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"
	v1 "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// lister serves the kubelet-compatible v1.PodResourcesLister. With a kubelet socket, every
// answer holds the kubelet's part from a kubelet call sent after the v1 call arrived; when
// that part is missing, the call fails Unavailable rather than answer without it.
type lister struct {
	v1.UnimplementedPodResourcesListerServer
	source  Source
	kubelet *kubeletClient // nil: podgate does not ask the kubelet
}

var _ v1.PodResourcesListerServer = (*lister)(nil)

// List implements v1.PodResourcesListerServer: every pod podgate or the kubelet knows.
func (l *lister) List(ctx context.Context, _ *v1.ListPodResourcesRequest) (*v1.ListPodResourcesResponse, error) {
	var fromKubelet []*v1.PodResources
	if l.kubelet != nil {
		resp, err := l.kubelet.List(ctx)
		if err != nil && !errors.Is(err, errNoKubelet) {
			return nil, l.unavailable(ctx, "List", err)
		}
		fromKubelet = resp.GetPodResources() // nil without a kubelet: podgate's part alone
	}
	pods, _ := l.source.Pods()
	return &v1.ListPodResourcesResponse{PodResources: mergeList(pods, l.source, fromKubelet)}, nil
}

// Get implements v1.PodResourcesListerServer: one pod, NotFound when neither podgate nor the
// kubelet knows it.
func (l *lister) Get(ctx context.Context, req *v1.GetPodResourcesRequest) (*v1.GetPodResourcesResponse, error) {
	if err := validPodRef("pod_name", req.GetPodName(), "pod_namespace", req.GetPodNamespace()); err != nil {
		return nil, err
	}
	var fromKubelet *v1.PodResources
	if l.kubelet != nil {
		pr, found, err := l.kubelet.Get(ctx, req.GetPodNamespace(), req.GetPodName())
		if err != nil && !errors.Is(err, errNoKubelet) {
			return nil, l.unavailable(ctx, "Get", err)
		}
		if found {
			fromKubelet = pr
		}
	}
	p, ok := l.source.Pod(req.GetPodNamespace(), req.GetPodName())
	switch {
	case ok:
		spec, specOK := l.source.Containers(p)
		return &v1.GetPodResourcesResponse{PodResources: mergePod(p, spec, specOK, fromKubelet)}, nil
	case fromKubelet != nil:
		return &v1.GetPodResourcesResponse{PodResources: fromKubelet}, nil
	}
	klog.FromContext(ctx).V(4).Info("PodResources Get for an unknown pod", "pod", klog.KRef(req.GetPodNamespace(), req.GetPodName()))
	return nil, status.Errorf(codes.NotFound, "pod %s/%s: not found", req.GetPodNamespace(), req.GetPodName())
}

// GetAllocatableResources implements v1.PodResourcesListerServer: the kubelet's answer, or an
// empty one without a kubelet (podgate allocates nothing itself).
func (l *lister) GetAllocatableResources(ctx context.Context, _ *v1.AllocatableResourcesRequest) (*v1.AllocatableResourcesResponse, error) {
	if l.kubelet == nil {
		return &v1.AllocatableResourcesResponse{}, nil
	}
	resp, err := l.kubelet.GetAllocatableResources(ctx)
	switch {
	case errors.Is(err, errNoKubelet):
		return &v1.AllocatableResourcesResponse{}, nil
	case err != nil:
		return nil, l.unavailable(ctx, "GetAllocatableResources", err)
	}
	return resp, nil
}

// unavailable is the answer of a call whose kubelet part is missing: Unavailable naming why,
// logged and counted; or the caller's own cancellation or deadline when it gave up first.
func (l *lister) unavailable(ctx context.Context, method string, err error) error {
	if ctx.Err() != nil {
		return status.FromContextError(ctx.Err()).Err()
	}
	reason := "error"
	var we *kubeletWaitError
	switch {
	case errors.As(err, &we):
		reason = "timeout"
	case errors.Is(err, errKubeletClosed):
		reason = "stopping"
	}
	l.kubelet.metrics.kubeletUnavailable.WithLabelValues(method, reason).Inc()
	klog.FromContext(ctx).Info("Answering Unavailable: the kubelet's part of the answer is missing", "method", method, "reason", reason, "err", err)
	return status.Errorf(codes.Unavailable, "podgate cannot answer %s without the kubelet's devices, CPUs and memory: %v", method, err)
}
