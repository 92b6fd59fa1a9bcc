//go:build linux

package cluster_test

import (
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2/ktesting"

	"github.com/podgate/podgate/test/registry"
)

// TestPodgateRestartDuringImagePull stops podgate while the kubelet's PullImage for a new pod
// is downloading the image's layer from a throttled local registry, and starts podgate again
// once it has exited. With SIGKILL the pull is cut: the kubelet retries it on its own (after its
// image-pull backoff). With SIGTERM podgate lets the pull finish within its shutdown grace period
// (10 s; the layer takes 8 s) or cuts it at the end of it. Either way the pod runs, and the
// registry served each blob of the image at most twice: the interrupted attempt and the
// kubelet's retry, nothing more.
func TestPodgateRestartDuringImagePull(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGKILL, syscall.SIGTERM} {
		t.Run(sig.String(), func(t *testing.T) { testRestartDuringImagePull(t, sig) })
	}
}

func testRestartDuringImagePull(t *testing.T, sig syscall.Signal) {
	n := startNode(t)
	_, ctx := ktesting.NewTestContext(t)
	// 16 MiB at 2 MiB/s: the layer takes 8 s, long enough to kill podgate in the middle of it.
	const layerSize, bandwidth = 16 << 20, 2 << 20
	reg := registry.New(bandwidth)
	reg.Serve(t)
	ref := reg.Push(t, "restart", 1, layerSize)[0]
	reg.Reset()
	reg.Count(true)

	pod := testPod("pulled", n.cluster.NodeName())
	pod.Spec.Containers[0].Image = ref
	pod.Spec.Containers[0].ImagePullPolicy = corev1.PullIfNotPresent
	if _, err := n.cluster.Client().CoreV1().Pods(pod.Namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The manifest and the config are small; the layer is the second blob asked for, and is still
	// being served while the image is active at the registry.
	waitFor(t, 2*time.Minute, "the layer download to start", func() (bool, error) {
		s := reg.Stats()
		return len(s.BlobGets) == 2 && s.ActiveImages() == 1, fmt.Errorf("registry: %+v", s)
	})
	if sig == syscall.SIGKILL {
		n.podgate.Kill()
	} else if code, err := n.podgate.Stop(30 * time.Second); err != nil || code != 0 {
		t.Fatalf("podgate on SIGTERM: exit %d, %v", code, err)
	}
	interrupted := reg.Stats()
	n.startPodgate(t)

	waitPod(t, n.cluster, pod.Namespace, pod.Name, func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
	s := reg.Stats()
	t.Logf("registry: blob GETs %v when podgate had stopped, %v in all; %d blob bytes served for a %d-byte layer",
		interrupted.BlobGets, s.BlobGets, s.Bytes, layerSize)
	if len(s.BlobGets) != 2 {
		t.Errorf("registry served blobs %v, want the image's config and layer", s.BlobGets)
	}
	for blob, gets := range s.BlobGets {
		if gets > 2 {
			t.Errorf("blob %s fetched %d times: more than the interrupted attempt and one retry", blob, gets)
		}
	}
	if sig != syscall.SIGKILL {
		return
	}
	// The kubelet saw the pull fail and retried it: the pod's events say so.
	events, err := n.cluster.Client().CoreV1().Events(pod.Namespace).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + pod.Name})
	if err != nil {
		t.Fatal(err)
	}
	var pulling, failed int
	for _, e := range events.Items {
		switch {
		case e.Reason == "Pulling":
			pulling += int(max(e.Count, 1))
		case e.Reason == "Failed" && strings.Contains(e.Message, ref):
			failed += int(max(e.Count, 1))
		}
	}
	if pulling < 2 || failed < 1 {
		t.Errorf("pod events: %d Pulling, %d Failed for %s; want the failed pull and the kubelet's retry", pulling, failed, ref)
	}
}
