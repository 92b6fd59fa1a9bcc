package dra

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/resourceclaim"
	"k8s.io/utils/ptr"
)

// claimFetchTimeout bounds the GET of one ResourceClaim. RunPodSandbox waits on it; a healthy
// API server answers in milliseconds and a busy one in seconds, so no answer after 10 s means
// it is down or overloaded, and the kubelet retries the sandbox on its next sync.
const claimFetchTimeout = 10 * time.Second

// acceptPodGroups is the kubelet's DRAWorkloadResourceClaims feature gate (alpha, off by
// default in 1.36) as podgate sees it: off, so that podgate accepts the claims the kubelet
// accepts and no others. With it on, a claim owned by or reserved for the pod's PodGroup would
// do too.
const acceptPodGroups = false

// PodClaim is one ResourceClaim of a pod with the devices allocated to it by the drivers
// podgate prepares for.
type PodClaim struct {
	// PodClaimName is the pod's name for the claim (spec.resourceClaims[].name), by which the
	// containers name it in resources.claims; "" for the Extended claim.
	PodClaimName string
	UID          types.UID
	Namespace    string
	Name         string
	// Results are the claim's allocated devices that podgate's drivers serve.
	Results []resourceapi.DeviceRequestAllocationResult

	// Extended marks the claim the scheduler created for the pod's extended resources backed
	// by DRA (pod.status.extendedResourceClaimStatus): no entry of spec.resourceClaims and no
	// container's resources.claims names it.
	Extended bool
	// RequestMappings are, for the Extended claim, the pod status's mappings of a container's
	// extended resource to the claim's request that serves it, as the scheduler wrote them.
	// The containers that use the claim are those they name ([PodClaim.Containers]), so that
	// the PodResources service can list the claim under those only, as the kubelet does. Nil
	// for the other claims.
	RequestMappings []corev1.ContainerExtendedResourceRequest
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

// Containers returns, for the Extended claim, the names of the containers that use it (from
// its RequestMappings), each once, in the order of the mappings; nil for the other claims,
// which the containers name in resources.claims by PodClaimName.
func (c PodClaim) Containers() []string {
	var out []string
	for _, m := range c.RequestMappings {
		if !slices.Contains(out, m.ContainerName) {
			out = append(out, m.ContainerName)
		}
	}
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

// podClaimRef is one claim a pod uses: an entry of spec.resourceClaims, or the Extended claim.
type podClaimRef struct {
	podClaimName string
	// name is the ResourceClaim's name.
	name string
	// mustCheckOwner: the claim was generated for the pod, which must be its controller.
	mustCheckOwner bool
	// mappings is set for the Extended claim only.
	mappings []corev1.ContainerExtendedResourceRequest
	extended bool
}

// PodClaims returns pod's claims that have devices for podgate's drivers: those of
// spec.resourceClaims in their order, then the claim of the pod's extended resources backed by
// DRA (pod.status.extendedResourceClaimStatus). A pod without claims costs no API request.
//
// Each claim is checked as the kubelet checks it before it prepares: a claim generated for the
// pod (from a template, or the scheduler's claim for extended resources) must be controlled by
// the pod; every claim must be allocated and reserved for the pod. A template's claim that the
// pod's status says is not needed is skipped.
//
// Errors are classified for the CRI boundary: a claim not created yet, not found, not owned by
// the pod, not allocated, or not reserved for it is FailedPrecondition (the kubelet retries once
// the scheduler and the claim controller caught up); a claim reference of a kind podgate does
// not know (a newer API) is InvalidArgument; an API server that does not answer is Unavailable.
// Each error names the pod and the claim.
func (r *ClaimResolver) PodClaims(ctx context.Context, pod *corev1.Pod) ([]PodClaim, error) {
	refs, err := podClaimRefs(pod)
	if err != nil {
		return nil, err
	}
	var out []PodClaim
	for _, ref := range refs {
		claim, err := r.fetch(ctx, pod, ref)
		if err != nil {
			return nil, err
		}
		pc := PodClaim{
			PodClaimName: ref.podClaimName, UID: claim.UID, Namespace: claim.Namespace, Name: claim.Name,
			Extended: ref.extended, RequestMappings: slices.Clone(ref.mappings),
		}
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

// podClaimRefs names the ResourceClaims pod uses, with resourceclaim.Name for the entries of
// spec.resourceClaims.
func podClaimRefs(pod *corev1.Pod) ([]podClaimRef, error) {
	var out []podClaimRef
	for i := range pod.Spec.ResourceClaims {
		pc := &pod.Spec.ResourceClaims[i]
		name, mustCheckOwner, err := resourceclaim.Name(pod, pc)
		switch {
		case errors.Is(err, resourceclaim.ErrClaimNotFound):
			return nil, failedPrecondition(fmt.Errorf("pod %s/%s claim %s (template %s): %w",
				pod.Namespace, pod.Name, pc.Name, ptr.Deref(pc.ResourceClaimTemplateName, ""), resourceclaim.ErrClaimNotFound))
		case errors.Is(err, resourceclaim.ErrAPIUnsupported):
			// A newer API than podgate's: no retry helps. Not NotImplemented, which a CRI client reads
			// as "the runtime lacks RunPodSandbox".
			return nil, classed{err, errdefs.ErrInvalidArgument}
		case err != nil:
			return nil, err
		case name == nil:
			continue // the pod's status says the template's claim is not needed
		}
		out = append(out, podClaimRef{podClaimName: pc.Name, name: *name, mustCheckOwner: mustCheckOwner})
	}
	// The scheduler creates this claim with the pod as controller, and the upstream
	// resourceclaim.PodClaims asks for the owner check on it (the kubelet 1.36 skips it): a
	// claim of that name that the pod does not control is not the pod's.
	if st := pod.Status.ExtendedResourceClaimStatus; st != nil && st.ResourceClaimName != "" {
		out = append(out, podClaimRef{name: st.ResourceClaimName, mustCheckOwner: true, mappings: st.RequestMappings, extended: true})
	}
	return out, nil
}

// usableBy checks that the claim may be prepared for pod, as the kubelet checks it: controlled
// by the pod when it was generated for it, allocated, reserved for the pod.
func usableBy(claim *resourceapi.ResourceClaim, pod *corev1.Pod, mustCheckOwner bool) error {
	if mustCheckOwner {
		if err := resourceclaim.IsForPod(pod, claim, acceptPodGroups); err != nil {
			return failedPrecondition(err) // names the pod and the claim
		}
	}
	where := fmt.Sprintf("pod %s/%s claim %s/%s", pod.Namespace, pod.Name, claim.Namespace, claim.Name)
	if claim.Status.Allocation == nil {
		return errdefs.ErrFailedPrecondition.WithMessage(where + ": not allocated")
	}
	if !resourceclaim.IsReservedForPod(pod, claim, acceptPodGroups) {
		return errdefs.ErrFailedPrecondition.WithMessage(fmt.Sprintf("%s: not reserved for this pod (uid %s)", where, pod.UID))
	}
	return nil
}

// classed is err with an errdefs class for the CRI boundary, its message unchanged.
type classed struct{ err, class error }

func (e classed) Error() string { return e.err.Error() }

// Unwrap returns the error, then its class, for errors.Is and errdefs.Resolve.
func (e classed) Unwrap() []error { return []error{e.err, e.class} }

func failedPrecondition(err error) error { return classed{err, errdefs.ErrFailedPrecondition} }

// fetch returns the claim ref names in the pod's namespace (a pod can only use its own
// namespace's claims), checked with usableBy: the one read before when it passes, else a GET.
func (r *ClaimResolver) fetch(ctx context.Context, pod *corev1.Pod, ref podClaimRef) (*resourceapi.ResourceClaim, error) {
	name := ref.name
	key := types.NamespacedName{Namespace: pod.Namespace, Name: name}
	r.mu.Lock()
	cached := r.cache[key]
	r.mu.Unlock()
	if cached != nil && usableBy(cached, pod, ref.mustCheckOwner) == nil {
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
	if err := usableBy(claim, pod, ref.mustCheckOwner); err != nil {
		return nil, err
	}
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

// AllocationResult is the result for the device driver/pool/device in the claim's allocation;
// false when the claim is not allocated or holds no such device.
func AllocationResult(claim *resourceapi.ResourceClaim, driver, pool, device string) (resourceapi.DeviceRequestAllocationResult, bool) {
	if claim.Status.Allocation == nil {
		return resourceapi.DeviceRequestAllocationResult{}, false
	}
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver == driver && r.Pool == pool && r.Device == device {
			return r, true
		}
	}
	return resourceapi.DeviceRequestAllocationResult{}, false
}
