//go:build linux

package cluster_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/random"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/podgate/podgate/test/cluster"
	"github.com/podgate/podgate/test/registry"
	"github.com/podgate/podgate/test/rig"
)

// pullStallConfig: one pull at a time, a pull below 8 KiB/s over 3 s is stalled.
const pullStallConfig = `imagePulls:
  maxParallel: 1
  stall:
    minBytesPerSecond: 8192
    window: 3s
`

// TestPullStalledThroughKubelet: a real kubelet on podgate starts a pod whose image's second
// layer trickles at 300 B/s. podgate cancels the stalled pull and the pod gets a PullStalled
// Event naming the image, the registry and the minimum; the kubelet reports its own
// ErrImagePull (with podgate's message) and backs off; once the registry recovers, the
// kubelet's retry pulls the image and the pod runs.
func TestPullStalledThroughKubelet(t *testing.T) {
	n := startNodeConfigured(t, true, parallelPulls, pullStallConfig, rig.Options{})
	c := n.cluster
	reg := registry.New(4 << 20)
	host := reg.Serve(t)
	img, err := random.Image(8<<10, 2)
	if err != nil {
		t.Fatal(err)
	}
	ref, err := reg.PushImage("stall/img:v1", img)
	if err != nil {
		t.Fatal(err)
	}
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	trickled, err := layers[1].Digest()
	if err != nil {
		t.Fatal(err)
	}
	reg.Trickle(trickled.String(), 300)
	reg.Count(true)

	pod := createPod(t, c, pullingPod("stalled", c.NodeName(), ref))
	e := waitEvent(t, c, pod, "PullStalled", `"`+ref+`"`, "from registry "+host, "over the last 3s", "below the minimum of 8.0 KiB/s")
	if e.Type != corev1.EventTypeWarning {
		t.Errorf("PullStalled Event of type %s, want Warning", e.Type)
	}
	// The kubelet's own view: ErrImagePull with podgate's message, then its back-off.
	seen := map[string]string{}
	waitPod(t, c, pod.Namespace, pod.Name, func(p *corev1.Pod) bool {
		for _, s := range p.Status.ContainerStatuses {
			if w := s.State.Waiting; w != nil {
				seen[w.Reason] = w.Message
			}
		}
		return seen["ImagePullBackOff"] != "" || seen["ErrImagePull"] != "" && kubeletEvent(t, c, pod, "BackOff")
	})
	kubeletSaid := kubeletEvent(t, c, pod, "Failed", "rpc error: code = Unavailable desc = pull of "+ref+" stalled") && kubeletEvent(t, c, pod, "Failed", "ErrImagePull")
	if !kubeletSaid {
		t.Errorf("no kubelet Event Failed with ErrImagePull and podgate's message; pod's waiting reasons %q", seen)
	}

	reg.Trickle(trickled.String(), 0)
	waitPod(t, c, pod.Namespace, pod.Name, func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
}

// kubeletEvent reports whether the kubelet wrote a core/v1 Event of reason about pod whose
// message holds every one of parts.
func kubeletEvent(t *testing.T, c *cluster.Cluster, pod *corev1.Pod, reason string, parts ...string) bool {
	t.Helper()
	list, err := c.Client().CoreV1().Events(pod.Namespace).List(t.Context(), metav1.ListOptions{
		FieldSelector: fmt.Sprintf("involvedObject.uid=%s,reason=%s", pod.UID, reason),
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range list.Items {
		ok := true
		for _, p := range parts {
			ok = ok && strings.Contains(e.Message, p)
		}
		if ok {
			return true
		}
	}
	return false
}
