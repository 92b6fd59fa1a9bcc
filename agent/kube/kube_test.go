package kube

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"

	"github.com/podgate/podgate/test/kubefake"
)

// kubeTimeout bounds each wait for the informer; reaching it fails the test.
const kubeTimeout = 30 * time.Second

func testPod(uid, class string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "pod-" + uid, UID: types.UID("uid-" + uid)},
		Spec:       corev1.PodSpec{NodeName: "node-a", PriorityClassName: class},
	}
}

// startLookup runs a PodLookup with opts on a fake clientset holding pods and waits for its
// sync. It returns the field selector the informer listed with.
func startLookup(t *testing.T, opts []PodLookupOption, pods ...runtime.Object) (*fake.Clientset, *PodLookup, <-chan string) {
	t.Helper()
	client := fake.NewClientset(pods...)
	selectors := make(chan string, 100)
	client.PrependReactor("list", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		selectors <- a.(k8stesting.ListAction).GetListRestrictions().Fields.String()
		return false, nil, nil
	})
	l, err := NewPodLookup(kubefake.Wrap(client), "node-a", opts...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { l.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	syncCtx, cancelSync := context.WithTimeout(ctx, kubeTimeout)
	defer cancelSync()
	if !cache.WaitForCacheSync(syncCtx.Done(), l.HasSynced) {
		t.Fatal("pod informer did not sync")
	}
	return client, l, selectors
}

func TestPodLookupScopedToNode(t *testing.T) {
	client, l, selectors := startLookup(t, nil, testPod("1", "system-node-critical"))
	if sel := <-selectors; sel != "spec.nodeName=node-a" {
		t.Errorf("informer listed pods with field selector %q, want spec.nodeName=node-a", sel)
	}
	if l.NodeName() != "node-a" || l.Client() != kubefake.Wrap(client) {
		t.Errorf("NodeName = %q, Client is the lookup's clientset: %v; want node-a, true", l.NodeName(), l.Client() == kubefake.Wrap(client))
	}
	pod, ok := l.Get("uid-1")
	if !ok || pod.Name != "pod-1" {
		t.Fatalf("Get(uid-1) = %v, %v", pod, ok)
	}
	if _, ok := l.Get("uid-unknown"); ok {
		t.Error("Get of an unknown UID found a pod")
	}
}

// TestPodLookupStripsManagedFields checks that the informer caches pods without their
// managedFields, listed or watched, and with everything else.
func TestPodLookupStripsManagedFields(t *testing.T) {
	withFields := func(uid string) *corev1.Pod {
		pod := testPod(uid, "system-node-critical")
		pod.Labels = map[string]string{"app": "web"}
		pod.ManagedFields = []metav1.ManagedFieldsEntry{{
			Manager: "kube-controller-manager", Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "v1",
			FieldsType: "FieldsV1", FieldsV1: metav1.NewFieldsV1(`{"f:metadata":{"f:labels":{"f:app":{}}}}`),
		}}
		return pod
	}
	client, l, _ := startLookup(t, nil, withFields("1"))
	if _, err := client.CoreV1().Pods("default").Create(t.Context(), withFields("2"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	err := wait.PollUntilContextTimeout(t.Context(), 10*time.Millisecond, kubeTimeout, true, func(context.Context) (bool, error) {
		_, ok := l.Get("uid-2")
		return ok, nil
	})
	if err != nil {
		t.Fatalf("watched pod not in the cache: %v", err)
	}
	for _, uid := range []types.UID{"uid-1", "uid-2"} {
		pod, ok := l.Get(uid)
		if !ok {
			t.Fatalf("Get(%s): not found", uid)
		}
		if pod.ManagedFields != nil {
			t.Errorf("cached pod %s keeps managedFields %v", uid, pod.ManagedFields)
		}
		if pod.Labels["app"] != "web" || pod.Spec.PriorityClassName != "system-node-critical" {
			t.Errorf("cached pod %s lost more than managedFields: labels %v, priority class %q", uid, pod.Labels, pod.Spec.PriorityClassName)
		}
	}
}
