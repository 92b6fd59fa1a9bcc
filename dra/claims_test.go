package dra

import (
	"errors"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/containerd/errdefs"
	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/dynamic-resource-allocation/resourceclaim"
	"k8s.io/utils/ptr"

	"github.com/podgate/podgate/test/kubefake"
)

func claimPod(refs ...corev1.PodResourceClaim) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web", UID: "pod-uid"},
		Spec:       corev1.PodSpec{NodeName: "node-a", ResourceClaims: refs},
	}
}

// allocatedClaim is a claim allocated to one device per driver and reserved for the pods.
func allocatedClaim(name string, drivers []string, reservedFor ...types.UID) *resourceapi.ResourceClaim {
	c := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID("uid-" + name)},
		Status:     resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{}},
	}
	for i, d := range drivers {
		c.Status.Allocation.Devices.Results = append(c.Status.Allocation.Devices.Results, resourceapi.DeviceRequestAllocationResult{
			Request: "nic", Driver: d, Pool: "node-a", Device: "nic" + string(rune('0'+i)),
		})
	}
	for _, uid := range reservedFor {
		c.Status.ReservedFor = append(c.Status.ReservedFor, resourceapi.ResourceClaimConsumerReference{Resource: "pods", Name: "web", UID: uid})
	}
	return c
}

// countGets counts the GETs of ResourceClaims the client serves.
func countGets(client *fake.Clientset) *atomic.Int32 {
	var n atomic.Int32
	client.PrependReactor("get", "resourceclaims", func(k8stesting.Action) (bool, runtime.Object, error) {
		n.Add(1)
		return false, nil, nil
	})
	return &n
}

// ownedBy makes pod the claim's controlling owner, as the resourceclaim controller does for a
// claim from a template and the scheduler for the claim of extended resources.
func ownedBy(c *resourceapi.ResourceClaim, pod *corev1.Pod, controller bool) *resourceapi.ResourceClaim {
	c.OwnerReferences = append(c.OwnerReferences, metav1.OwnerReference{
		APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID, Controller: ptr.To(controller),
	})
	return c
}

// withStatus returns pod with its status's claim names: pod claim name to ResourceClaim name,
// "" for a claim the template does not need.
func withStatus(pod *corev1.Pod, names ...[2]string) *corev1.Pod {
	for _, n := range names {
		st := corev1.PodResourceClaimStatus{Name: n[0]}
		if n[1] != "" {
			st.ResourceClaimName = ptr.To(n[1])
		}
		pod.Status.ResourceClaimStatuses = append(pod.Status.ResourceClaimStatuses, st)
	}
	return pod
}

// withExtended returns pod with the scheduler's claim for its extended resources.
func withExtended(pod *corev1.Pod, claim string, mappings ...corev1.ContainerExtendedResourceRequest) *corev1.Pod {
	pod.Status.ExtendedResourceClaimStatus = &corev1.PodExtendedResourceClaimStatus{ResourceClaimName: claim, RequestMappings: mappings}
	return pod
}

// claimSummary is what a test compares of a PodClaim.
type claimSummary struct {
	PodClaimName, Name string
	UID                types.UID
	Drivers            []string
	Extended           bool
	Containers         []string
	Requests           []string // the RequestMappings' request names
}

func summarize(claims []PodClaim) []claimSummary {
	var out []claimSummary
	for _, c := range claims {
		s := claimSummary{PodClaimName: c.PodClaimName, Name: c.Name, UID: c.UID, Drivers: c.Drivers(), Extended: c.Extended, Containers: c.Containers()}
		for _, m := range c.RequestMappings {
			s.Requests = append(s.Requests, m.RequestName)
		}
		out = append(out, s)
	}
	return out
}

func TestPodClaims(t *testing.T) {
	direct := corev1.PodResourceClaim{Name: "net", ResourceClaimName: ptr.To("shared-net")}
	templated := corev1.PodResourceClaim{Name: "gpu", ResourceClaimTemplateName: ptr.To("gpu-template")}
	pod := claimPod()
	otherPod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web", UID: "old-pod-uid"}}
	gpuMappings := []corev1.ContainerExtendedResourceRequest{
		{ContainerName: "app", ResourceName: "example.com/gpu", RequestName: "container-0-request-0"},
		{ContainerName: "sidecar", ResourceName: "example.com/gpu", RequestName: "container-1-request-0"},
		{ContainerName: "app", ResourceName: "example.com/fpga", RequestName: "container-0-request-1"},
	}
	for _, tc := range []struct {
		name    string
		pod     *corev1.Pod
		claims  []runtime.Object
		drivers []string // dra.drivers
		want    []claimSummary
		class   error    // the error's class, nil for success
		is      error    // another error the error must wrap, if any
		says    []string // what the message must say
		gets    int32
	}{
		{name: "no claims", pod: claimPod(), gets: 0},
		{
			name: "direct claim", pod: claimPod(direct),
			claims: []runtime.Object{allocatedClaim("shared-net", []string{"net.example", "gpu.example"}, "pod-uid")},
			want:   []claimSummary{{PodClaimName: "net", Name: "shared-net", UID: "uid-shared-net", Drivers: []string{"gpu.example", "net.example"}}},
			gets:   1,
		},
		{
			// Only generated claims are checked for their owner: a claim the user named is
			// usually shared, and owned by no pod or another.
			name: "direct claim owned by another pod", pod: claimPod(direct),
			claims: []runtime.Object{ownedBy(allocatedClaim("shared-net", []string{"net.example"}, "pod-uid"), otherPod, true)},
			want:   []claimSummary{{PodClaimName: "net", Name: "shared-net", UID: "uid-shared-net", Drivers: []string{"net.example"}}},
			gets:   1,
		},
		{
			name: "only the configured drivers", pod: claimPod(direct), drivers: []string{"net.example"},
			claims: []runtime.Object{allocatedClaim("shared-net", []string{"net.example", "gpu.example"}, "pod-uid")},
			want:   []claimSummary{{PodClaimName: "net", Name: "shared-net", UID: "uid-shared-net", Drivers: []string{"net.example"}}},
			gets:   1,
		},
		{
			name: "claim of other drivers only is skipped", pod: claimPod(direct), drivers: []string{"net.example"},
			claims: []runtime.Object{allocatedClaim("shared-net", []string{"gpu.example"}, "pod-uid")},
			gets:   1,
		},
		{
			name: "template claim named in the pod's status, the pod its controller",
			pod:  withStatus(claimPod(templated), [2]string{"gpu", "web-gpu-x1"}),
			claims: []runtime.Object{
				ownedBy(allocatedClaim("web-gpu-x1", []string{"gpu.example"}, "pod-uid"), pod, true),
				// The template's name is no claim's: podgate reads the one in the status.
				ownedBy(allocatedClaim("gpu-template", []string{"other.example"}, "pod-uid"), pod, true),
			},
			want: []claimSummary{{PodClaimName: "gpu", Name: "web-gpu-x1", UID: "uid-web-gpu-x1", Drivers: []string{"gpu.example"}}},
			gets: 1,
		},
		{
			name:   "template claim without owner",
			pod:    withStatus(claimPod(templated), [2]string{"gpu", "web-gpu-x1"}),
			claims: []runtime.Object{allocatedClaim("web-gpu-x1", []string{"gpu.example"}, "pod-uid")},
			class:  errdefs.ErrFailedPrecondition,
			says:   []string{"ResourceClaim ns/web-gpu-x1 was not created for Pod ns/web (Pod is not owner)"},
			gets:   1,
		},
		{
			// A pod re-created under the same name: the claim of the old one is not the new one's,
			// even were it reserved for it.
			name:   "template claim controlled by another pod of the same name",
			pod:    withStatus(claimPod(templated), [2]string{"gpu", "web-gpu-x1"}),
			claims: []runtime.Object{ownedBy(allocatedClaim("web-gpu-x1", []string{"gpu.example"}, "pod-uid"), otherPod, true)},
			class:  errdefs.ErrFailedPrecondition,
			says:   []string{"ResourceClaim ns/web-gpu-x1 was not created for Pod ns/web"},
			gets:   1,
		},
		{
			name:   "template claim owned by the pod, not as controller",
			pod:    withStatus(claimPod(templated), [2]string{"gpu", "web-gpu-x1"}),
			claims: []runtime.Object{ownedBy(allocatedClaim("web-gpu-x1", []string{"gpu.example"}, "pod-uid"), pod, false)},
			class:  errdefs.ErrFailedPrecondition,
			says:   []string{"ResourceClaim ns/web-gpu-x1 was not created for Pod ns/web"},
			gets:   1,
		},
		{
			name:   "template claim not reserved for the pod",
			pod:    withStatus(claimPod(templated), [2]string{"gpu", "web-gpu-x1"}),
			claims: []runtime.Object{ownedBy(allocatedClaim("web-gpu-x1", []string{"gpu.example"}), pod, true)},
			class:  errdefs.ErrFailedPrecondition,
			says:   []string{"pod ns/web claim ns/web-gpu-x1: not reserved for this pod (uid pod-uid)"},
			gets:   1,
		},
		{
			name: "template claim not created yet", pod: claimPod(templated),
			class: errdefs.ErrFailedPrecondition, is: resourceclaim.ErrClaimNotFound,
			says: []string{"pod ns/web claim gpu (template gpu-template): ResourceClaim not created yet"},
		},
		{
			// The status of another pod claim says nothing of this one's.
			name: "template claim not created yet, another one is", pod: withStatus(claimPod(direct, templated), [2]string{"other", "web-other-x1"}),
			claims: []runtime.Object{allocatedClaim("shared-net", []string{"net.example"}, "pod-uid")},
			class:  errdefs.ErrFailedPrecondition, is: resourceclaim.ErrClaimNotFound,
			says: []string{"pod ns/web claim gpu (template gpu-template): ResourceClaim not created yet"},
		},
		{
			name: "template that needs no claim is skipped",
			pod:  withStatus(claimPod(templated, direct), [2]string{"gpu", ""}),
			claims: []runtime.Object{
				allocatedClaim("shared-net", []string{"net.example"}, "pod-uid"),
				ownedBy(allocatedClaim("gpu-template", []string{"gpu.example"}, "pod-uid"), pod, true),
			},
			want: []claimSummary{{PodClaimName: "net", Name: "shared-net", UID: "uid-shared-net", Drivers: []string{"net.example"}}},
			gets: 1,
		},
		{
			name:  "claim reference of an unknown kind",
			pod:   claimPod(corev1.PodResourceClaim{Name: "future"}),
			class: errdefs.ErrInvalidArgument, is: resourceclaim.ErrAPIUnsupported,
			says: []string{`pod "ns/web", spec.resourceClaim "future": none of the supported fields are set`},
		},
		{
			name: "extended-resource claim, after the pod's claims",
			pod:  withExtended(claimPod(direct), "web-extended-resources-abcde", gpuMappings...),
			claims: []runtime.Object{
				allocatedClaim("shared-net", []string{"net.example"}, "pod-uid"),
				ownedBy(allocatedClaim("web-extended-resources-abcde", []string{"gpu.example"}, "pod-uid"), pod, true),
			},
			want: []claimSummary{
				{PodClaimName: "net", Name: "shared-net", UID: "uid-shared-net", Drivers: []string{"net.example"}},
				{
					Name: "web-extended-resources-abcde", UID: "uid-web-extended-resources-abcde", Drivers: []string{"gpu.example"},
					Extended: true, Containers: []string{"app", "sidecar"},
					Requests: []string{"container-0-request-0", "container-1-request-0", "container-0-request-1"},
				},
			},
			gets: 2,
		},
		{
			name:   "extended-resource claim not owned by the pod",
			pod:    withExtended(claimPod(), "web-extended-resources-abcde", gpuMappings...),
			claims: []runtime.Object{allocatedClaim("web-extended-resources-abcde", []string{"gpu.example"}, "pod-uid")},
			class:  errdefs.ErrFailedPrecondition,
			says:   []string{"ResourceClaim ns/web-extended-resources-abcde was not created for Pod ns/web (Pod is not owner)"},
			gets:   1,
		},
		{
			name:   "extended-resource claim not reserved for the pod",
			pod:    withExtended(claimPod(), "web-extended-resources-abcde", gpuMappings...),
			claims: []runtime.Object{ownedBy(allocatedClaim("web-extended-resources-abcde", []string{"gpu.example"}, "other-pod"), pod, true)},
			class:  errdefs.ErrFailedPrecondition,
			says:   []string{"pod ns/web claim ns/web-extended-resources-abcde: not reserved for this pod"},
			gets:   1,
		},
		{
			name: "extended-resource status without a claim name", pod: withExtended(claimPod(), ""),
		},
		{
			name: "not allocated", pod: claimPod(direct),
			claims: []runtime.Object{&resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "shared-net", UID: "u"}}},
			class:  errdefs.ErrFailedPrecondition, says: []string{"pod ns/web claim ns/shared-net: not allocated"}, gets: 1,
		},
		{
			name: "reserved for another pod", pod: claimPod(direct),
			claims: []runtime.Object{allocatedClaim("shared-net", []string{"net.example"}, "other-pod")},
			class:  errdefs.ErrFailedPrecondition, says: []string{"pod ns/web claim ns/shared-net: not reserved for this pod (uid pod-uid)"}, gets: 1,
		},
		{
			name: "missing", pod: claimPod(direct),
			class: errdefs.ErrFailedPrecondition, says: []string{"pod ns/web claim ns/shared-net: not found"}, gets: 1,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client := fake.NewClientset(tc.claims...)
			gets := countGets(client)
			r := NewClaimResolver(kubefake.Wrap(client), tc.drivers)
			got, err := r.PodClaims(t.Context(), tc.pod)
			if gets.Load() != tc.gets {
				t.Errorf("%d GETs, want %d", gets.Load(), tc.gets)
			}
			if tc.class != nil {
				if err == nil {
					t.Fatalf("PodClaims: %v, no error; want %v", summarize(got), tc.class)
				}
				// errdefs.Resolve is how the CRI boundary finds the gRPC code.
				if c := errdefs.Resolve(err); !errors.Is(c, tc.class) {
					t.Errorf("PodClaims: %q of class %v, want %v", err, c, tc.class)
				}
				if tc.is != nil && !errors.Is(err, tc.is) {
					t.Errorf("PodClaims: %q does not wrap %q", err, tc.is)
				}
				for _, s := range tc.says {
					if !strings.Contains(err.Error(), s) {
						t.Errorf("PodClaims: %q, want it to say %q", err, s)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, summarize(got)); diff != "" {
				t.Errorf("claims (-want +got):\n%s", diff)
			}
		})
	}
}

// TestPodClaimsCacheChecksOwner: a claim read for one pod, which names it directly, is not
// handed from the cache to a pod for which it must have been generated.
func TestPodClaimsCacheChecksOwner(t *testing.T) {
	client := fake.NewClientset(allocatedClaim("web-gpu-x1", []string{"gpu.example"}, "pod-uid", "pod-2"))
	gets := countGets(client)
	r := NewClaimResolver(kubefake.Wrap(client), nil)
	if _, err := r.PodClaims(t.Context(), claimPod(corev1.PodResourceClaim{Name: "gpu", ResourceClaimName: ptr.To("web-gpu-x1")})); err != nil {
		t.Fatal(err)
	}
	pod2 := withStatus(claimPod(corev1.PodResourceClaim{Name: "gpu", ResourceClaimTemplateName: ptr.To("gpu-template")}), [2]string{"gpu", "web-gpu-x1"})
	pod2.UID = "pod-2"
	_, err := r.PodClaims(t.Context(), pod2)
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "(Pod is not owner)") {
		t.Errorf("PodClaims for a pod that does not own the cached claim: %v, want FailedPrecondition, Pod is not owner", err)
	}
	if gets.Load() != 2 {
		t.Errorf("%d GETs, want 2: the cached claim failed the check, so it is read again", gets.Load())
	}
}

// TestPodClaimContainers: Containers names the users of the Extended claim only.
func TestPodClaimContainers(t *testing.T) {
	ext := PodClaim{Extended: true, RequestMappings: []corev1.ContainerExtendedResourceRequest{
		{ContainerName: "b", RequestName: "r0"}, {ContainerName: "a", RequestName: "r1"}, {ContainerName: "b", RequestName: "r2"},
	}}
	if diff := cmp.Diff([]string{"b", "a"}, ext.Containers()); diff != "" {
		t.Errorf("Containers (-want +got):\n%s", diff)
	}
	if got := (PodClaim{PodClaimName: "net"}).Containers(); got != nil {
		t.Errorf("Containers of a spec claim: %v, want nil", got)
	}
}

func TestPodClaimsReadOncePerPod(t *testing.T) {
	client := fake.NewClientset(allocatedClaim("shared-net", []string{"net.example"}, "pod-uid", "pod-2"))
	gets := countGets(client)
	r := NewClaimResolver(kubefake.Wrap(client), nil)
	pod := claimPod(corev1.PodResourceClaim{Name: "net", ResourceClaimName: ptr.To("shared-net")})
	for range 3 { // the kubelet re-creates a sandbox: the claim is not read again
		if _, err := r.PodClaims(t.Context(), pod); err != nil {
			t.Fatal(err)
		}
	}
	if gets.Load() != 1 {
		t.Errorf("%d GETs for three sandboxes of one pod, want 1", gets.Load())
	}
	// Another pod sharing the claim is in reservedFor too: still no GET.
	pod2 := pod.DeepCopy()
	pod2.UID = "pod-2"
	if _, err := r.PodClaims(t.Context(), pod2); err != nil {
		t.Fatal(err)
	}
	// A pod the cached claim is not reserved for makes podgate read it again.
	pod3 := pod.DeepCopy()
	pod3.UID = "pod-3"
	if _, err := r.PodClaims(t.Context(), pod3); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("pod the claim is not reserved for: %v, want FailedPrecondition", err)
	}
	if gets.Load() != 2 {
		t.Errorf("%d GETs, want 2", gets.Load())
	}
}

func TestPodClaimsAPIDown(t *testing.T) {
	client := fake.NewClientset()
	client.PrependReactor("get", "resourceclaims", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("connection refused")
	})
	r := NewClaimResolver(kubefake.Wrap(client), nil)
	_, err := r.PodClaims(t.Context(), claimPod(corev1.PodResourceClaim{Name: "net", ResourceClaimName: ptr.To("shared-net")}))
	if !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "ns/shared-net") || !strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("PodClaims: %v, want Unavailable naming the claim and the cause", err)
	}
}
