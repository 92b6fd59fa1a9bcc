package dra

import (
	"context"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
)

// The Kubernetes API access dra needs, one capability each. agent's client implements them all
// (without client-go's clientset and its every API group); tests use test/kubefake.

// ResourceClaimGetter reads a ResourceClaim.
type ResourceClaimGetter interface {
	GetResourceClaim(ctx context.Context, namespace, name string) (*resourceapi.ResourceClaim, error)
}

// ResourceClaimStatusUpdater writes a ResourceClaim's status (the status subresource).
type ResourceClaimStatusUpdater interface {
	UpdateResourceClaimStatus(ctx context.Context, claim *resourceapi.ResourceClaim) (*resourceapi.ResourceClaim, error)
}

// ResourceSliceWatcher lists and watches ResourceSlices (cluster-scoped).
type ResourceSliceWatcher interface {
	ListResourceSlices(ctx context.Context, opts metav1.ListOptions) (*resourceapi.ResourceSliceList, error)
	WatchResourceSlices(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)
}

// ResourceClaimStatusClient reads a claim and writes its status.
type ResourceClaimStatusClient interface {
	ResourceClaimGetter
	ResourceClaimStatusUpdater
}
