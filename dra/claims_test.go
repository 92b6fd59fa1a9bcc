package dra

import (
	"errors"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/containerd/errdefs"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
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

func TestPodClaims(t *testing.T) {
	direct := corev1.PodResourceClaim{Name: "net", ResourceClaimName: ptr.To("shared-net")}
	templated := corev1.PodResourceClaim{Name: "gpu", ResourceClaimTemplateName: ptr.To("gpu-template")}
	for _, tc := range []struct {
		name    string
		pod     *corev1.Pod
		claims  []runtime.Object
		drivers []string // dra.drivers
		want    []string // claim names with the drivers of their results, "name:driver,driver"
		class   error    // the error's class, nil for success
		says    string
		gets    int32
	}{
		{name: "no claims", pod: claimPod(), gets: 0},
		{
			name: "direct claim", pod: claimPod(direct),
			claims: []runtime.Object{allocatedClaim("shared-net", []string{"net.example", "gpu.example"}, "pod-uid")},
			want:   []string{"shared-net:gpu.example,net.example"}, gets: 1,
		},
		{
			name: "only the configured drivers", pod: claimPod(direct), drivers: []string{"net.example"},
			claims: []runtime.Object{allocatedClaim("shared-net", []string{"net.example", "gpu.example"}, "pod-uid")},
			want:   []string{"shared-net:net.example"}, gets: 1,
		},
		{
			name: "claim of other drivers only is skipped", pod: claimPod(direct), drivers: []string{"net.example"},
			claims: []runtime.Object{allocatedClaim("shared-net", []string{"gpu.example"}, "pod-uid")},
			gets:   1,
		},
		{
			name: "template claim named in the pod's status", pod: func() *corev1.Pod {
				p := claimPod(templated)
				p.Status.ResourceClaimStatuses = []corev1.PodResourceClaimStatus{{Name: "gpu", ResourceClaimName: ptr.To("web-gpu-x1")}}
				return p
			}(),
			claims: []runtime.Object{allocatedClaim("web-gpu-x1", []string{"gpu.example"}, "pod-uid")},
			want:   []string{"web-gpu-x1:gpu.example"}, gets: 1,
		},
		{
			name: "template claim not created yet", pod: claimPod(templated),
			class: errdefs.ErrFailedPrecondition, says: "claim gpu: the claim from its template is not created yet",
		},
		{
			name: "template that needs no claim", pod: func() *corev1.Pod {
				p := claimPod(templated)
				p.Status.ResourceClaimStatuses = []corev1.PodResourceClaimStatus{{Name: "gpu"}}
				return p
			}(),
		},
		{
			name: "not allocated", pod: claimPod(direct),
			claims: []runtime.Object{&resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "shared-net", UID: "u"}}},
			class:  errdefs.ErrFailedPrecondition, says: "pod ns/web claim ns/shared-net: not allocated", gets: 1,
		},
		{
			name: "reserved for another pod", pod: claimPod(direct),
			claims: []runtime.Object{allocatedClaim("shared-net", []string{"net.example"}, "other-pod")},
			class:  errdefs.ErrFailedPrecondition, says: "pod ns/web claim ns/shared-net: not reserved for this pod", gets: 1,
		},
		{
			name: "missing", pod: claimPod(direct),
			class: errdefs.ErrFailedPrecondition, says: "pod ns/web claim ns/shared-net: not found", gets: 1,
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
				if err == nil || !errors.Is(err, tc.class) || !strings.Contains(err.Error(), tc.says) {
					t.Fatalf("PodClaims: %v, want %v saying %q", err, tc.class, tc.says)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, c := range got {
				names = append(names, c.Name+":"+strings.Join(c.Drivers(), ","))
			}
			if strings.Join(names, " ") != strings.Join(tc.want, " ") {
				t.Errorf("claims %v, want %v", names, tc.want)
			}
		})
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
