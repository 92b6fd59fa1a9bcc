// Package kubetest runs podgate's pod lookup on client-go's fake clientset for agent's unit
// tests. Features read pods through narrow interfaces of their own and test with fakes of them.
package kubetest

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"

	"github.com/podgate/podgate/agent/kube"
	"github.com/podgate/podgate/test/kubefake"
)

// Timeout bounds each wait for the informer; reaching it fails the test.
const Timeout = 30 * time.Second

// Pod is pod "pod-"+uid (UID "uid-"+uid) in default on node-a with the priority class given.
func Pod(uid, class string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "pod-" + uid, UID: types.UID("uid-" + uid)},
		Spec:       corev1.PodSpec{NodeName: "node-a", PriorityClassName: class},
	}
}

// StartLookup runs a PodLookup for node-a on a fake API server holding pods, until the test
// ends, and waits for its informer's sync.
func StartLookup(t testing.TB, pods ...runtime.Object) (*fake.Clientset, *kube.PodLookup) {
	t.Helper()
	client := fake.NewClientset(pods...)
	l, err := kube.NewPodLookup(kubefake.Wrap(client), "node-a")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { l.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	syncCtx, cancelSync := context.WithTimeout(ctx, Timeout)
	defer cancelSync()
	if !cache.WaitForCacheSync(syncCtx.Done(), l.HasSynced) {
		t.Fatal("pod informer did not sync")
	}
	return client, l
}
