package agent

import (
	"context"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podgate/podgate/cri/imagepull"
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
	prio := pullPriority(l, imagepull.SandboxPriority{Label: DefaultPriorityLabel, Namespaces: []string{"kube-system"}})
	req := func(uid, ns string, labels map[string]string) *runtimeapi.PullImageRequest {
		return &runtimeapi.PullImageRequest{SandboxConfig: &runtimeapi.PodSandboxConfig{
			Metadata: &runtimeapi.PodSandboxMetadata{Uid: uid, Namespace: ns}, Labels: labels}}
	}
	tests := []struct {
		name string
		req  *runtimeapi.PullImageRequest
		want imagepull.Priority
	}{
		{"from the API server", req("uid-1", "default", nil), imagepull.PriorityNodeCritical},
		{"unknown pod: sandbox fallback", req("uid-x", "kube-system", map[string]string{DefaultPriorityLabel: "system-cluster-critical"}), imagepull.PriorityClusterCritical},
		{"unknown pod, no label", req("uid-x", "kube-system", nil), imagepull.PriorityNormal},
	}
	for _, tt := range tests {
		if got := prio(t.Context(), tt.req); got != tt.want {
			t.Errorf("%s: priority %v, want %v", tt.name, got, tt.want)
		}
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

// TestPodDeletionCancelsWaitingPull drives the real informer with the fake clientset: a pull
// queued for a pod leaves the queue, Aborted and without reaching the backend, when the pod is
// deleted or marked for deletion.
func TestPodDeletionCancelsWaitingPull(t *testing.T) {
	tests := []struct {
		name   string
		delete func(ctx context.Context, client *fake.Clientset, pod *corev1.Pod) error
	}{
		{"deleted", func(ctx context.Context, client *fake.Clientset, pod *corev1.Pod) error {
			return client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{})
		}},
		{"deletionTimestamp set", func(ctx context.Context, client *fake.Clientset, pod *corev1.Pod) error {
			pod = pod.DeepCopy()
			now := metav1.Now()
			pod.DeletionTimestamp = &now
			_, err := client.CoreV1().Pods(pod.Namespace).Update(ctx, pod, metav1.UpdateOptions{})
			return err
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := t.Context()
			pod := testPod("2", "")
			client, l, _ := startLookup(t, nil, pod)
			g := imagepull.New(imagepull.Limits{MaxParallel: 1})
			l.OnDeleted(func(p *corev1.Pod) { g.PodDeleted(string(p.UID)) })

			// A blocker holds the only slot until the test ends.
			release := make(chan struct{})
			defer close(release)
			started := make(chan struct{})
			blocker, err := imagepull.NewPull(&runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: "example.com/blocker"}})
			if err != nil {
				t.Fatal(err)
			}
			go func() {
				_, _ = g.Do(ctx, blocker, func(context.Context) (*runtimeapi.PullImageResponse, error) {
					close(started)
					<-release
					return &runtimeapi.PullImageResponse{}, nil
				})
			}()
			<-started

			victim, err := imagepull.NewPull(&runtimeapi.PullImageRequest{
				Image:         &runtimeapi.ImageSpec{Image: "example.com/app"},
				SandboxConfig: &runtimeapi.PodSandboxConfig{Metadata: &runtimeapi.PodSandboxMetadata{Uid: string(pod.UID), Namespace: pod.Namespace, Name: pod.Name}},
			})
			if err != nil {
				t.Fatal(err)
			}
			res := make(chan error, 1)
			go func() {
				_, err := g.Do(ctx, victim, func(context.Context) (*runtimeapi.PullImageResponse, error) {
					t.Error("backend called for a deleted pod's pull")
					return nil, nil
				})
				res <- err
			}()
			// The deletion must find the pull queued: wait until the governor holds it.
			if err := wait.PollUntilContextTimeout(ctx, time.Millisecond, kubeTimeout, true, func(context.Context) (bool, error) {
				return g.Stats().Queued == 1, nil
			}); err != nil {
				t.Fatalf("pull never queued: %v", err)
			}
			if err := tt.delete(ctx, client, pod); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-res:
				// The governor classifies; the CRI boundary maps the class to the gRPC code.
				if !errdefs.IsAborted(err) {
					t.Errorf("pull for the deleted pod = %v, want an Aborted-class error", err)
				}
			case <-time.After(kubeTimeout):
				t.Fatal("pull for the deleted pod still waits")
			}
			if s := g.Stats(); s.Queued != 0 {
				t.Errorf("queue holds %d after the deletion, want 0", s.Queued)
			}
		})
	}
}
