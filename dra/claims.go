package dra

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
)

// claimFetchTimeout bounds the GET of one ResourceClaim. RunPodSandbox waits on it; a healthy
// API server answers in milliseconds and a busy one in seconds, so no answer after 10 s means
// it is down or overloaded, and the kubelet retries the sandbox on its next sync.
const claimFetchTimeout = 10 * time.Second

// PodClaim is one ResourceClaim of a pod with the devices allocated to it by the drivers
// podgate prepares for.
type PodClaim struct {
	// Name is the pod's name for the claim (spec.resourceClaims[].name).
	PodClaimName string
	UID          types.UID
	Namespace    string
	Name         string
	// Results are the claim's allocated devices that podgate's drivers serve.
	Results []resourceapi.DeviceRequestAllocationResult
}

// Drivers returns the names of the drivers of c's results, sorted, each once.
func (c PodClaim) Drivers() []string {
	var out []string
	for _, r := range c.Results {
		if !slices.Contains(out, r.Driver) {
			out = append(out, r.Driver)
		}
	}
	slices.Sort(out)
	return out
}

// ClaimResolver finds a pod's ResourceClaims in the API server: at most one GET per claim, on
// demand, never a watch of the cluster's claims. A claim already read for the same pod is not
// read again (a pod's sandbox re-created by the kubelet): while a claim is reserved for a pod
// its allocation cannot change.
type ClaimResolver struct {
	client ResourceClaimGetter
	// serves reports whether podgate prepares devices of a driver; nil: every driver.
	serves func(driver string) bool

	mu    sync.Mutex
	cache map[types.NamespacedName]*resourceapi.ResourceClaim
}

// NewClaimResolver creates a resolver that reads claims with client. drivers limits the devices
// it returns to those drivers; empty means every driver.
func NewClaimResolver(client ResourceClaimGetter, drivers []string) *ClaimResolver {
	r := &ClaimResolver{client: client, cache: map[types.NamespacedName]*resourceapi.ResourceClaim{}}
	if len(drivers) > 0 {
		allowed := slices.Clone(drivers)
		r.serves = func(d string) bool { return slices.Contains(allowed, d) }
	}
	return r
}

// PodClaims returns pod's claims that have devices for podgate's drivers, in the order of
// spec.resourceClaims. A pod without claims costs no API request.
//
// Errors are classified for the CRI boundary: a claim not created yet, not allocated, or not
// reserved for this pod is FailedPrecondition (the kubelet retries once the scheduler and the
// claim controller caught up); an API server that does not answer is Unavailable. Each error
// names the pod and the claim.
func (r *ClaimResolver) PodClaims(ctx context.Context, pod *corev1.Pod) ([]PodClaim, error) {
	var out []PodClaim
	for _, ref := range pod.Spec.ResourceClaims {
		name, err := claimName(pod, ref)
		if err != nil {
			return nil, err
		}
		if name == "" {
			continue // the template asked for no claim (its status entry has no name)
		}
		claim, err := r.fetch(ctx, pod, name)
		if err != nil {
			return nil, err
		}
		if err := usableBy(claim, pod); err != nil {
			return nil, err
		}
		pc := PodClaim{PodClaimName: ref.Name, UID: claim.UID, Namespace: claim.Namespace, Name: claim.Name}
		for _, res := range claim.Status.Allocation.Devices.Results {
			if r.serves == nil || r.serves(res.Driver) {
				pc.Results = append(pc.Results, res)
			}
		}
		if len(pc.Results) > 0 {
			out = append(out, pc)
		}
	}
	return out, nil
}

// claimName is the ResourceClaim a pod's claim reference stands for: named directly, or
// generated from a template and reported in the pod's status; "" when the template made none.
func claimName(pod *corev1.Pod, ref corev1.PodResourceClaim) (string, error) {
	if ref.ResourceClaimName != nil {
		return *ref.ResourceClaimName, nil
	}
	for _, st := range pod.Status.ResourceClaimStatuses {
		if st.Name == ref.Name {
			if st.ResourceClaimName == nil {
				return "", nil
			}
			return *st.ResourceClaimName, nil
		}
	}
	return "", errdefs.ErrFailedPrecondition.WithMessage(fmt.Sprintf(
		"pod %s/%s claim %s: the claim from its template is not created yet", pod.Namespace, pod.Name, ref.Name))
}

// usableBy checks that the claim is allocated and reserved for pod, as the kubelet does before
// it prepares a claim.
func usableBy(claim *resourceapi.ResourceClaim, pod *corev1.Pod) error {
	where := fmt.Sprintf("pod %s/%s claim %s/%s", pod.Namespace, pod.Name, claim.Namespace, claim.Name)
	if claim.Status.Allocation == nil {
		return errdefs.ErrFailedPrecondition.WithMessage(where + ": not allocated")
	}
	for _, c := range claim.Status.ReservedFor {
		if c.Resource == "pods" && c.UID == pod.UID {
			return nil
		}
	}
	return errdefs.ErrFailedPrecondition.WithMessage(where + ": not reserved for this pod")
}

// fetch returns a claim of the pod's namespace (a pod can only use its own namespace's claims):
// the one read before when it is reserved for this pod, else a GET.
func (r *ClaimResolver) fetch(ctx context.Context, pod *corev1.Pod, name string) (*resourceapi.ResourceClaim, error) {
	key := types.NamespacedName{Namespace: pod.Namespace, Name: name}
	r.mu.Lock()
	cached := r.cache[key]
	r.mu.Unlock()
	if cached != nil && usableBy(cached, pod) == nil {
		return cached, nil
	}
	ctx, cancel := context.WithTimeout(ctx, claimFetchTimeout)
	defer cancel()
	claim, err := r.client.GetResourceClaim(ctx, pod.Namespace, name)
	where := fmt.Sprintf("pod %s/%s claim %s/%s", pod.Namespace, pod.Name, pod.Namespace, name)
	switch {
	case apierrors.IsNotFound(err):
		return nil, errdefs.ErrFailedPrecondition.WithMessage(where + ": not found")
	case err != nil:
		return nil, fmt.Errorf("%s: %w: %w", where, errdefs.ErrUnavailable, err)
	}
	r.mu.Lock()
	r.cache[key] = claim
	r.mu.Unlock()
	return claim, nil
}

// Forget drops what the resolver remembers of a claim, once no pod of this node uses it.
func (r *ClaimResolver) Forget(namespace, name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.cache, types.NamespacedName{Namespace: namespace, Name: name})
}

// Claim returns the claim namespace/name as last read, or reads it. For steps after the
// prepare, which read the claim's configuration: it cannot change while the claim is reserved.
func (r *ClaimResolver) Claim(ctx context.Context, namespace, name string) (*resourceapi.ResourceClaim, error) {
	key := types.NamespacedName{Namespace: namespace, Name: name}
	r.mu.Lock()
	cached := r.cache[key]
	r.mu.Unlock()
	if cached != nil {
		return cached, nil
	}
	ctx, cancel := context.WithTimeout(ctx, claimFetchTimeout)
	defer cancel()
	claim, err := r.client.GetResourceClaim(ctx, namespace, name)
	switch {
	case apierrors.IsNotFound(err):
		return nil, errdefs.ErrFailedPrecondition.WithMessage(fmt.Sprintf("claim %s/%s: not found", namespace, name))
	case err != nil:
		return nil, fmt.Errorf("claim %s/%s: %w: %w", namespace, name, errdefs.ErrUnavailable, err)
	}
	r.mu.Lock()
	r.cache[key] = claim
	r.mu.Unlock()
	return claim, nil
}
