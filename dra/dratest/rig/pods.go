package rig

import (
	"context"
	"fmt"
	"sync"

	"github.com/containerd/errdefs"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/podgate/podgate/dra/manager"
)

// Pods is the node's pods as agent's Kubernetes adapter shows them to the DRA manager, over a
// fake API server: what its informer holds (the pods the API server had when the rig was made,
// until Delete), a GET of the API server for any other pod. A real informer is agent/kube's to
// test.
type Pods struct {
	client kubernetes.Interface

	mu        sync.Mutex
	pods      map[types.UID]*corev1.Pod
	onDeleted []func(*corev1.Pod)
}

var _ manager.Pods = (*Pods)(nil)

// NewPods returns the pods of client, holding pods as its informer would.
func NewPods(client kubernetes.Interface, pods ...*corev1.Pod) *Pods {
	p := &Pods{client: client, pods: map[types.UID]*corev1.Pod{}}
	for _, pod := range pods {
		p.pods[pod.UID] = pod.DeepCopy()
	}
	return p
}

// Get implements manager.Pods.
func (p *Pods) Get(uid types.UID) (*corev1.Pod, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	pod, ok := p.pods[uid]
	return pod, ok
}

// GetOrFetch implements manager.Pods: the informer's pod, else the API server's, which must
// be the pod of that UID bound to Node.
func (p *Pods) GetOrFetch(ctx context.Context, uid types.UID, namespace, name string) (*corev1.Pod, error) {
	if pod, ok := p.Get(uid); ok {
		return pod, nil
	}
	pod, err := p.client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return nil, fmt.Errorf("get pod %s/%s uid %s: %w", namespace, name, uid, errdefs.ErrNotFound)
	case err != nil:
		return nil, fmt.Errorf("get pod %s/%s uid %s: %w: %w", namespace, name, uid, errdefs.ErrUnavailable, err)
	case pod.UID != uid:
		return nil, fmt.Errorf("get pod %s/%s uid %s: %w: the name holds another pod", namespace, name, uid, errdefs.ErrNotFound)
	case pod.Spec.NodeName != Node:
		return nil, fmt.Errorf("get pod %s/%s uid %s: %w: not bound to %s", namespace, name, uid, errdefs.ErrFailedPrecondition, Node)
	}
	return pod, nil
}

// HasSynced implements manager.Pods: the informer listed the pods when the rig was made.
func (*Pods) HasSynced() bool { return true }

// OnDeleted implements manager.Pods.
func (p *Pods) OnDeleted(fn func(*corev1.Pod)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.onDeleted = append(p.onDeleted, fn)
}

// Delete deletes pod from the API server, and then from the informer, whose subscribers are
// told, as the informer does when the deletion reaches it.
func (p *Pods) Delete(ctx context.Context, pod *corev1.Pod) error {
	if err := p.client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{}); err != nil {
		return err
	}
	p.mu.Lock()
	gone, ok := p.pods[pod.UID]
	delete(p.pods, pod.UID)
	fns := p.onDeleted
	p.mu.Unlock()
	if ok {
		for _, fn := range fns {
			fn(gone)
		}
	}
	return nil
}
