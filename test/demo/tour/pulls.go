//go:build linux

package tour

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"github.com/podgate/podgate/test/dranode"
	"github.com/podgate/podgate/test/harness"
	"github.com/podgate/podgate/test/registry"
)

// PullReport is what the pull step saw, all from podgate's side (its metrics, its log and the
// CRI answers); the registries' request logs are the independent record to check it against.
type PullReport struct {
	// Running and Queued are the pulls podgate ran and held once the queue had formed;
	// RunningA those of them from registry A.
	Running, RunningA, Queued int
	// Asked is how many pods asked for a pull.
	Asked int
	// Refs are the images by pod name.
	Refs map[string]string
	// Started holds the images in the order podgate started their pulls.
	Started []string
	// CriticalPosition is the critical pod's pull's place in Started, from 1.
	CriticalPosition int
	// Deduplicated counts the calls that joined a pull of the same image; TwinPulls is how many
	// pulls podgate started of the image two pods asked for.
	Deduplicated, TwinPulls int
	// GoneCode is what the deleted pod's pull was answered; CancelledPodDeleted what podgate
	// counted as cancelled because the pod was deleted.
	GoneCode            codes.Code
	CancelledPodDeleted int
	// Took is how long the step's pulls took, from the registries' release of the held
	// downloads to the last answer.
	Took time.Duration
}

// The pods of the pull step, in the order they ask, and the image each asks for: four images
// on registry A, which has a cap of 2, three on B, which has only the node's cap of 3; twin asks
// for pull-a1's image; gone is deleted while it waits; critical asks last.
var pullPods = []struct{ pod, image string }{
	{"pull-a1", "a/1"}, {"pull-a2", "a/2"}, {"pull-b1", "b/1"},
	{"pull-a3", "a/3"}, {"pull-a4", "a/4"}, {"pull-b2", "b/2"}, {"gone", "b/3"},
	{"twin", "a/1"},
}

// Pulls asks for the pull step's images as the kubelet would, one PullImage per pod, and shows
// the caps, the queue, the priority, the de-duplication and the cancellation.
func (e *Env) Pulls(ctx context.Context) (*PullReport, error) {
	e.step("Image pulls: %d pods ask for images on two throttled registries; podgate's caps are %d on the node and %d for registry A "+
		"(the registries hold the first downloads until all have asked, so that the queue shows on a busy machine too)",
		len(pullPods)+1, maxParallel, registryACap)
	refs, err := e.pushPullImages()
	if err != nil {
		return nil, err
	}
	rep := &PullReport{Refs: map[string]string{}, Asked: len(pullPods) + 1}
	logStart := len(e.Podgate.Log.String())
	pods := map[string]*corev1.Pod{}
	for _, pp := range pullPods {
		if pods[pp.pod], err = e.createPod(ctx, Namespace, pp.pod, refs[pp.image], nil); err != nil {
			return nil, err
		}
		rep.Refs[pp.pod] = refs[pp.image]
	}
	critical, err := e.createPod(ctx, metav1.NamespaceSystem, "critical", refs["b/4"], func(p *corev1.Pod) {
		p.Spec.PriorityClassName = "system-node-critical"
		// Read from the sandbox config when podgate does not know the pod from the API yet.
		p.Labels = map[string]string{"podgate.dev/priority-class": "system-node-critical"}
	})
	if err != nil {
		return nil, err
	}
	rep.Refs["critical"] = refs["b/4"]

	var wg sync.WaitGroup
	// Whatever goes wrong, the step returns once its pulls have: the held ones once released
	// (the deferred release runs first).
	defer wg.Wait()
	var mu sync.Mutex
	answers := map[string]error{}
	pull := func(pod *corev1.Pod, ref string) {
		wg.Go(func() {
			// The aborted pull is the point of a step: the CRI client's own error log of it
			// would only repeat what the step says.
			_, err := e.Through.Images.PullImage(klog.NewContext(ctx, logr.Discard()), &runtimeapi.ImageSpec{Image: ref}, nil, e.sandboxConfig(pod))
			mu.Lock()
			answers[pod.Name] = err
			mu.Unlock()
		})
	}
	// The registries hold the downloads that start until every pod has asked: a pull takes a
	// second, and on a loaded machine asking nine times may take longer than that.
	holding := []*registry.Registry{e.RegA, e.RegB}
	release := func() {
		for _, reg := range holding {
			reg.Release()
		}
		holding = nil
	}
	for _, reg := range holding {
		reg.Hold()
	}
	defer release()
	// One at a time, each once podgate has it (queued, started or joined), so that the queue's
	// order is the order above.
	for _, pp := range pullPods {
		before, err := e.arrivals(ctx)
		if err != nil {
			return nil, err
		}
		pull(pods[pp.pod], refs[pp.image])
		if err := e.waitFor(ctx, "podgate to take the pull of "+pp.pod, func(ctx context.Context) (bool, error) {
			n, err := e.arrivals(ctx)
			return n > before, err
		}); err != nil {
			return nil, err
		}
	}
	m, err := e.Podgate.Scrape(ctx)
	if err != nil {
		return nil, err
	}
	rep.Running, rep.Queued = gauge(m, "podgate_image_pull_in_flight"), gauge(m, "podgate_image_pull_queue_length")
	rep.RunningA = gauge(m, "podgate_image_pull_registry_in_flight", "registry", e.RegA.Host)
	e.say("cap: podgate ran %d pulls at once (%d from registry A, its own cap) and held %d in its queue: "+
		"containerd never downloads more than the node and each registry can take", rep.Running, rep.RunningA, rep.Queued)

	// The critical pod asks last, once everything else waits.
	pull(critical, refs["b/4"])
	if err := e.waitMetric(ctx, "the critical pull queued", "podgate_image_pull_queue_length", float64(rep.Queued+1)); err != nil {
		return nil, err
	}
	// gone is deleted while its pull waits: podgate hears it from the API server.
	if err := dranode.DeletePod(ctx, e.Kube, pods["gone"]); err != nil {
		return nil, err
	}
	if err := e.waitMetric(ctx, "the deleted pod's pull cancelled", "podgate_image_pull_cancelled_total", 1, "reason", "pod_deleted"); err != nil {
		return nil, err
	}
	start := time.Now()
	release()
	wg.Wait()
	rep.Took = time.Since(start)
	for pod, err := range answers {
		if pod != "gone" && err != nil {
			return nil, fmt.Errorf("pull for pod %s: %w", pod, err)
		}
	}
	rep.GoneCode = status.Code(answers["gone"])

	m, err = e.Podgate.Scrape(ctx)
	if err != nil {
		return nil, err
	}
	rep.Deduplicated = gauge(m, "podgate_image_pull_deduplicated_total", "kind", "image")
	rep.CancelledPodDeleted = gauge(m, "podgate_image_pull_cancelled_total", "kind", "image", "reason", "pod_deleted")
	rep.Started = harness.PullsStarted(e.Podgate.Log.String()[logStart:])
	rep.CriticalPosition = slices.Index(rep.Started, refs["b/4"]) + 1
	e.say("priority: pod kube-system/critical asked last (%d of %d), and its pull started %s, right after the %d running: "+
		"a system-node-critical pod never waits behind ordinary images", rep.Asked, rep.Asked, ordinal(rep.CriticalPosition), rep.Running)
	rep.TwinPulls = countOf(rep.Started, refs["a/1"])
	e.say("de-duplication: pods %s/pull-a1 and %s/twin both asked for %s; podgate started %d pull for both (%d call joined another's): "+
		"one download per image, however many pods want it", Namespace, Namespace, refs["a/1"], rep.TwinPulls, rep.Deduplicated)
	e.say("cancellation: pod %s/gone was deleted in the API server while its pull of %s waited; podgate answered %s (%d cancelled for a deleted pod) "+
		"and never asked containerd for it: no bandwidth for pods that are gone", Namespace, refs["b/3"], rep.GoneCode, rep.CancelledPodDeleted)
	e.say("the registries' request logs agree: at most %d images at once in all, %d from registry A; %d of %d images fetched; "+
		"all pulls answered %s after the registries let the downloads go",
		registry.MaxAtOnce(append(e.RegA.Requests(), e.RegB.Requests()...), registry.ByRepo), registry.MaxAtOnce(e.RegA.Requests(), registry.ByRepo),
		len(registry.FirstRequests(e.RegA.Requests()))+len(registry.FirstRequests(e.RegB.Requests())), len(refs), rep.Took.Round(100*time.Millisecond))
	return rep, nil
}

func countOf(s []string, v string) int {
	n := 0
	for _, x := range s {
		if x == v {
			n++
		}
	}
	return n
}

// pushPullImages pushes the step's images: a/1..a/4 to registry A, b/1..b/4 to B, each one
// layer of random bytes. It returns their references by short name.
func (e *Env) pushPullImages() (map[string]string, error) {
	refs := map[string]string{}
	for _, r := range []struct {
		reg    *registry.Registry
		prefix string
	}{{e.RegA, "a"}, {e.RegB, "b"}} {
		for i := 1; i <= 4; i++ {
			img, err := randomImage()
			if err != nil {
				return nil, err
			}
			short := fmt.Sprintf("%s/%d", r.prefix, i)
			if refs[short], err = r.reg.PushImage("pulls/"+strings.ReplaceAll(short, "/", "")+":v1", img); err != nil {
				return nil, err
			}
		}
	}
	return refs, nil
}

// arrivals counts the pulls podgate has taken: running, queued, or joined to another.
func (e *Env) arrivals(ctx context.Context) (int, error) {
	m, err := e.Podgate.Scrape(ctx)
	if err != nil {
		return 0, err
	}
	return gauge(m, "podgate_image_pull_in_flight") + gauge(m, "podgate_image_pull_queue_length") +
		gauge(m, "podgate_image_pull_deduplicated_total", "kind", "image"), nil
}

// createPod creates a pod bound to the node, with one container of image, as the scheduler
// leaves it; edit changes it before it is created.
func (e *Env) createPod(ctx context.Context, namespace, name, image string, edit func(*corev1.Pod)) (*corev1.Pod, error) {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec: corev1.PodSpec{
			NodeName:                      e.Cluster.NodeName(),
			AutomountServiceAccountToken:  ptr.To(false),
			TerminationGracePeriodSeconds: ptr.To[int64](0),
			Containers:                    []corev1.Container{{Name: "c", Image: image, Command: []string{"sleep", "3600"}}},
		},
	}
	if edit != nil {
		edit(pod)
	}
	got, err := e.Kube.CoreV1().Pods(namespace).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("create pod %s/%s: %w", namespace, name, err)
	}
	e.apiPods = append(e.apiPods, got)
	return got, nil
}

func ordinal(n int) string {
	switch {
	case n%100 >= 11 && n%100 <= 13:
		return fmt.Sprintf("%dth", n)
	case n%10 == 1:
		return fmt.Sprintf("%dst", n)
	case n%10 == 2:
		return fmt.Sprintf("%dnd", n)
	case n%10 == 3:
		return fmt.Sprintf("%drd", n)
	}
	return fmt.Sprintf("%dth", n)
}
