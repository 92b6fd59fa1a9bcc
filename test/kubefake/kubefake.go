// Package kubefake adapts a client-go clientset, usually the fake one, to the narrow Kubernetes
// API interfaces of podgate's packages (agent/kube.API and dra's), so that unit tests keep
// client-go's fake clientset, its object tracker and its reactors.
package kubefake

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
)

// Client is a clientset seen through podgate's interfaces.
type Client struct {
	kubernetes.Interface
}

// Wrap returns cs as a Client.
func Wrap(cs kubernetes.Interface) Client { return Client{cs} }

// IsWatchListSemanticsUnSupported tells client-go's reflector, as the fake clientset itself
// does, that the initial list cannot be streamed as watch events.
func (c Client) IsWatchListSemanticsUnSupported() bool {
	u, ok := c.Interface.(interface{ IsWatchListSemanticsUnSupported() bool })
	return ok && u.IsWatchListSemanticsUnSupported()
}

// GetPod reads a pod.
func (c Client) GetPod(ctx context.Context, namespace, name string) (*corev1.Pod, error) {
	return c.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
}

// ListPods lists pods.
func (c Client) ListPods(ctx context.Context, namespace string, opts metav1.ListOptions) (*corev1.PodList, error) {
	return c.CoreV1().Pods(namespace).List(ctx, opts)
}

// WatchPods watches pods.
func (c Client) WatchPods(ctx context.Context, namespace string, opts metav1.ListOptions) (watch.Interface, error) {
	return c.CoreV1().Pods(namespace).Watch(ctx, opts)
}

// GetNode reads a Node.
func (c Client) GetNode(ctx context.Context, name string) (*corev1.Node, error) {
	return c.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
}

// GetResourceClaim reads a ResourceClaim.
func (c Client) GetResourceClaim(ctx context.Context, namespace, name string) (*resourceapi.ResourceClaim, error) {
	return c.ResourceV1().ResourceClaims(namespace).Get(ctx, name, metav1.GetOptions{})
}

// UpdateResourceClaimStatus writes a ResourceClaim's status.
func (c Client) UpdateResourceClaimStatus(ctx context.Context, claim *resourceapi.ResourceClaim) (*resourceapi.ResourceClaim, error) {
	return c.ResourceV1().ResourceClaims(claim.Namespace).UpdateStatus(ctx, claim, metav1.UpdateOptions{})
}

// ListResourceSlices lists ResourceSlices.
func (c Client) ListResourceSlices(ctx context.Context, opts metav1.ListOptions) (*resourceapi.ResourceSliceList, error) {
	return c.ResourceV1().ResourceSlices().List(ctx, opts)
}

// WatchResourceSlices watches ResourceSlices.
func (c Client) WatchResourceSlices(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	return c.ResourceV1().ResourceSlices().Watch(ctx, opts)
}

// CreateEvent writes a new events.k8s.io/v1 Event.
func (c Client) CreateEvent(ctx context.Context, e *eventsv1.Event) (*eventsv1.Event, error) {
	return c.EventsV1().Events(e.Namespace).Create(ctx, e, metav1.CreateOptions{})
}

// PatchEvent applies a JSON merge patch to an Event.
func (c Client) PatchEvent(ctx context.Context, namespace, name string, patch []byte) (*eventsv1.Event, error) {
	return c.EventsV1().Events(namespace).Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{})
}
