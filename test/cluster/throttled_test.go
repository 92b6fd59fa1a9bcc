//go:build linux

package cluster_test

import (
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/podgate/podgate/test/cluster"
	"github.com/podgate/podgate/test/registry"
	"github.com/podgate/podgate/test/rig"
)

// throttledPullConfig: a registry's first cool-down 1 s, doubled up to 4 s, a pull held up to
// 2 minutes.
const throttledPullConfig = `imagePulls:
  coolDown:
    initialDelay: 1s
    maxDelay: 4s
    retryFor: 2m
`

// throttledBurst is a burst of pods whose images come from a registry that answers 429 for a
// while, and what the burst saw.
type throttledBurst struct {
	pods []*corev1.Pod
	// refused counts the requests the registry answered 429, by repository.
	refused map[string]int
	// running is the time from the first pod's creation to the last pod's Running.
	running time.Duration
	// kubeletRefused counts the kubelet's Events of failed pulls and back-offs (Failed with
	// ErrImagePull, BackOff), all pods together.
	kubeletRefused int
}

// runThrottledBurst creates one pod per image of n fresh images of reg, bound to c's node,
// while reg answers 429 for limit from the first pod's creation, and waits until every pod
// runs. Each burst pushes images under prefix of its own.
func runThrottledBurst(tb testing.TB, c *cluster.Cluster, reg *registry.Registry, prefix string, n int, limit time.Duration) throttledBurst {
	tb.Helper()
	refs := pushRunnable(tb, reg, prefix, n)
	reg.Reset()
	reg.Count(true)
	defer reg.Count(false)
	reg.Refuse(http.StatusTooManyRequests, "")
	var b throttledBurst
	start := time.Now()
	lift := time.AfterFunc(limit, reg.Allow) // the registry's limit, from the burst's start
	defer lift.Stop()
	for i, ref := range refs {
		pod, err := c.Client().CoreV1().Pods(metav1.NamespaceDefault).Create(tb.Context(),
			pullingPod(fmt.Sprintf("%s-%d", prefix, i), c.NodeName(), ref), metav1.CreateOptions{})
		if err != nil {
			tb.Fatal(err)
		}
		b.pods = append(b.pods, pod)
	}
	var last time.Time
	for _, pod := range b.pods {
		p := waitPodWithin(tb, c, pod, 5*time.Minute, containerRunning)
		for _, s := range p.Status.ContainerStatuses {
			if r := s.State.Running; r != nil && r.StartedAt.After(last) {
				last = r.StartedAt.Time
			}
		}
	}
	// StartedAt is in whole seconds: the burst ends within the second of the last start.
	b.running = last.Add(time.Second).Sub(start.Truncate(time.Second))
	b.refused = registry.RefusedByRepo(reg.Requests())
	for _, pod := range b.pods {
		b.kubeletRefused += kubeletEvents(tb, c, pod, "Failed", "ErrImagePull") + kubeletEvents(tb, c, pod, "BackOff")
	}
	return b
}

// containerRunning tells whether the pod's container runs.
func containerRunning(p *corev1.Pod) bool {
	for _, s := range p.Status.ContainerStatuses {
		if s.State.Running != nil {
			return true
		}
	}
	return false
}

// pushRunnable pushes n images <prefix>/imgI:v1 that run: the rig's busybox with a small
// random layer of each image's own on top.
func pushRunnable(tb testing.TB, reg *registry.Registry, prefix string, n int) []string {
	tb.Helper()
	base, err := tarball.ImageFromPath(filepath.Join(rig.InstallDir(), "images", "busybox.tar"), nil)
	if err != nil {
		tb.Fatal(err)
	}
	var refs []string
	for i := range n {
		layer, err := random.Layer(16<<10, types.DockerLayer)
		if err != nil {
			tb.Fatal(err)
		}
		img, err := mutate.AppendLayers(base, layer)
		if err != nil {
			tb.Fatal(err)
		}
		ref, err := reg.PushImage(fmt.Sprintf("%s/img%d:v1", prefix, i), img)
		if err != nil {
			tb.Fatal(err)
		}
		refs = append(refs, ref)
	}
	return refs
}

// deleteBurst deletes the burst's pods (grace period 0: the API server forgets them at once).
func deleteBurst(tb testing.TB, c *cluster.Cluster, b throttledBurst) {
	tb.Helper()
	var zero int64
	for _, pod := range b.pods {
		if err := c.Client().CoreV1().Pods(pod.Namespace).Delete(tb.Context(), pod.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
			tb.Fatal(err)
		}
	}
}

// waitPodWithin is waitPod with a timeout of its own, for testing.TB.
func waitPodWithin(tb testing.TB, c *cluster.Cluster, pod *corev1.Pod, timeout time.Duration, done func(*corev1.Pod) bool) *corev1.Pod {
	tb.Helper()
	var got *corev1.Pod
	waitFor(tb, timeout, "pod "+pod.Name, func() (bool, error) {
		p, err := c.Client().CoreV1().Pods(pod.Namespace).Get(tb.Context(), pod.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		got = p
		return done(p), fmt.Errorf("phase %s, containers %+v", p.Status.Phase, p.Status.ContainerStatuses)
	})
	return got
}

// kubeletEvents counts the kubelet's core/v1 Events of reason about pod whose message holds
// every one of parts, repeats included.
func kubeletEvents(tb testing.TB, c *cluster.Cluster, pod *corev1.Pod, reason string, parts ...string) int {
	tb.Helper()
	list, err := c.Client().CoreV1().Events(pod.Namespace).List(tb.Context(), metav1.ListOptions{
		FieldSelector: fmt.Sprintf("involvedObject.uid=%s,reason=%s", pod.UID, reason),
	})
	if err != nil {
		tb.Fatal(err)
	}
	n := 0
	for _, e := range list.Items {
		ok := true
		for _, p := range parts {
			ok = ok && strings.Contains(e.Message, p)
		}
		if ok {
			n += int(max(e.Count, 1))
		}
	}
	return n
}

// TestThrottledRegistryThroughKubelet: a real kubelet on podgate starts four pods whose images
// (busybox with a layer of their own) come from a registry that answers 429 for six seconds. podgate holds their pulls through the
// registry's cool-down and tries them again within the kubelet's PullImage calls: every pod
// reaches Running without a failed pull or an ImagePullBackOff of the kubelet's, each pod is told
// why it waits (PullThrottled), and no image was tried more than twice while the limit lasted
// (containerd asks up to five times per try).
func TestThrottledRegistryThroughKubelet(t *testing.T) {
	n := startNodeConfigured(t, true, parallelPulls, throttledPullConfig, rig.Options{})
	c := n.cluster
	reg := registry.New(64 << 20)
	host := reg.Serve(t)
	b := runThrottledBurst(t, c, reg, "throttled", 4, 6*time.Second)
	t.Logf("all pods running %s after the first was created; requests refused by repository %v", b.running.Round(time.Second), b.refused)
	if b.kubeletRefused != 0 {
		for _, pod := range b.pods {
			t.Errorf("pod %s: %d kubelet Events of a failed pull, %d of a back-off", pod.Name,
				kubeletEvents(t, c, pod, "Failed", "ErrImagePull"), kubeletEvents(t, c, pod, "BackOff"))
		}
	}
	for _, pod := range b.pods {
		waitEvent(t, c, pod, "PullThrottled", "registry "+host+" pushed back (429 Too Many Requests)")
	}
	if len(b.refused) == 0 {
		t.Error("the registry refused nothing: the limit was not met")
	}
	// Cool-downs of 0.8-1.2, 1.6-2.4 and 3.2-4 s: at most three tries of the registry in six
	// seconds after the first refusals, each by another pull, so each image's first try and at
	// most one more.
	for repo, refused := range b.refused {
		if refused > 2*5 {
			t.Errorf("%s: %d requests refused, want at most two tries' (10)", repo, refused)
		}
	}
}

// throttledBench are the bursts BenchmarkThrottledRegistryBurst runs: pods, and how long the
// registry refuses. Five seconds is shorter than the kubelet's first image back-off (10 s), 30
// seconds longer than its first two (10 s, then 20 s).
var throttledBench = []struct {
	pods  int
	limit time.Duration
}{{8, 5 * time.Second}, {8, 30 * time.Second}}

// BenchmarkThrottledRegistryBurst: a burst of pods, each its own image, from a registry that
// answers 429 for a while (Docker Hub's pull limit, a short one): the kubelet straight on
// containerd (path=direct), then the kubelet on podgate with its default imagePulls.coolDown
// (path=podgate), one node each, one burst per iteration. It reports the time from the first
// pod's creation to the last pod's container start (running-s), the registry's requests it
// answered 429 (refused), and the kubelet's Events of failed pulls and back-offs
// (kubelet-failures). Run it with -benchtime 1x: each burst lasts tens of seconds.
func BenchmarkThrottledRegistryBurst(b *testing.B) {
	for _, path := range []string{"direct", "podgate"} {
		for _, tb := range throttledBench {
			b.Run(fmt.Sprintf("pods=%d/limit=%s/path=%s", tb.pods, tb.limit, path), func(b *testing.B) {
				n := startNodeConfigured(b, path == "podgate", parallelPulls, "", rig.Options{})
				reg := registry.New(64 << 20)
				reg.Serve(b)
				var running time.Duration
				var refused, failures int
				i := 0
				for b.Loop() {
					burst := runThrottledBurst(b, n.cluster, reg, fmt.Sprintf("bench%d", i), tb.pods, tb.limit)
					running += burst.running
					for _, r := range burst.refused {
						refused += r
					}
					failures += burst.kubeletRefused
					b.StopTimer()
					deleteBurst(b, n.cluster, burst)
					b.StartTimer()
					i++
				}
				b.ReportMetric(running.Seconds()/float64(i), "running-s")
				b.ReportMetric(float64(refused)/float64(i), "refused")
				b.ReportMetric(float64(failures)/float64(i), "kubelet-failures")
			})
		}
	}
}
