package imagepull

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// testPriorityLabel is agent/config's DefaultPriorityLabel (which imports this package).
const testPriorityLabel = "podgate.dev/priority-class"

// podMap is the API server's pods, by UID, as agent/kube's PodLookup shows them.
type podMap map[types.UID]*corev1.Pod

var _ Pods = podMap(nil)

func (m podMap) Get(uid types.UID) (*corev1.Pod, bool) {
	p, ok := m[uid]
	return p, ok
}

func (m podMap) OnDeleted(func(*corev1.Pod)) {}

func TestPullPriority(t *testing.T) {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "pod-1", UID: "uid-1"},
		Spec:       corev1.PodSpec{NodeName: "node-a", PriorityClassName: "system-node-critical"},
	}
	prio := podPriority(podMap{pod.UID: pod}, SandboxPriority{Label: testPriorityLabel, Namespaces: []string{"kube-system"}})
	req := func(uid, ns string, labels map[string]string) *runtimeapi.PullImageRequest {
		return &runtimeapi.PullImageRequest{SandboxConfig: &runtimeapi.PodSandboxConfig{
			Metadata: &runtimeapi.PodSandboxMetadata{Uid: uid, Namespace: ns}, Labels: labels}}
	}
	tests := []struct {
		name string
		req  *runtimeapi.PullImageRequest
		want Priority
	}{
		{"from the API server", req("uid-1", "default", nil), PriorityNodeCritical},
		{"unknown pod: sandbox fallback", req("uid-x", "kube-system", map[string]string{testPriorityLabel: "system-cluster-critical"}), PriorityClusterCritical},
		{"unknown pod, no label", req("uid-x", "kube-system", nil), PriorityNormal},
	}
	for _, tt := range tests {
		if got := prio(t.Context(), tt.req); got != tt.want {
			t.Errorf("%s: priority %v, want %v", tt.name, got, tt.want)
		}
	}
}
