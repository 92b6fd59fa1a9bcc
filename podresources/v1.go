package podresources

import (
	"context"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"
	v1 "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// lister serves the kubelet-compatible v1.PodResourcesLister.
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
		if err != nil && ctx.Err() != nil {
			return nil, status.FromContextError(ctx.Err()).Err()
		}
		fromKubelet = resp.GetPodResources() // nil on error: podgate's part alone
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
		if err != nil && ctx.Err() != nil {
			return nil, status.FromContextError(ctx.Err()).Err()
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

// GetAllocatableResources implements v1.PodResourcesListerServer: the kubelet's answer, or
// an empty one when the kubelet does not answer (podgate allocates nothing itself).
func (l *lister) GetAllocatableResources(ctx context.Context, _ *v1.AllocatableResourcesRequest) (*v1.AllocatableResourcesResponse, error) {
	if l.kubelet == nil {
		return &v1.AllocatableResourcesResponse{}, nil
	}
	resp, err := l.kubelet.GetAllocatableResources(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil, status.FromContextError(ctx.Err()).Err()
		}
		return &v1.AllocatableResourcesResponse{}, nil
	}
	return resp, nil
}
