//go:build linux

package cluster_test

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2/ktesting"

	"github.com/podgate/podgate/test/cluster"
	"github.com/podgate/podgate/test/registry"
	"github.com/podgate/podgate/test/rig"
)

// pullEventsConfig is podgate's pull cap of one and Event thresholds short enough for a test.
const pullEventsConfig = `imagePulls:
  maxParallel: 1
  waitEventAfter: 1s
  progressEventAfter: 1s
  progressEventInterval: 2s
`

// The kubelet sends every pull at once: podgate's queue is the one that holds them.
var parallelPulls = map[string]any{"serializeImagePulls": false}

// podgateEvents returns podgate's Events about the pod with uid, oldest first.
func podgateEvents(t *testing.T, c *cluster.Cluster, ns string, uid types.UID) []eventsv1.Event {
	t.Helper()
	list, err := c.Client().EventsV1().Events(ns).List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []eventsv1.Event
	for _, e := range list.Items {
		if e.Regarding.UID == uid && e.ReportingController == "podgate.dev/podgate" {
			out = append(out, e)
		}
	}
	slices.SortFunc(out, func(a, b eventsv1.Event) int { return a.EventTime.Compare(b.EventTime.Time) })
	return out
}

// waitEvent waits for podgate's Event of reason about pod whose note holds every one of parts.
func waitEvent(t *testing.T, c *cluster.Cluster, pod *corev1.Pod, reason string, parts ...string) eventsv1.Event {
	t.Helper()
	var found eventsv1.Event
	waitFor(t, 2*time.Minute, fmt.Sprintf("a %s Event about %s with %q", reason, pod.Name, parts), func() (bool, error) {
		var notes []string
		for _, e := range podgateEvents(t, c, pod.Namespace, pod.UID) {
			notes = append(notes, e.Reason+": "+e.Note)
			if e.Reason != reason {
				continue
			}
			ok := true
			for _, p := range parts {
				ok = ok && strings.Contains(e.Note, p)
			}
			if ok {
				found = e
				return true, nil
			}
		}
		return false, fmt.Errorf("the pod has %q", notes)
	})
	if found.ReportingInstance != c.NodeName() || found.Regarding.Kind != "Pod" || found.Regarding.Name != pod.Name {
		t.Errorf("Event %s: reportingInstance %q, regarding %+v", found.Name, found.ReportingInstance, found.Regarding)
	}
	return found
}

func createPod(t *testing.T, c *cluster.Cluster, pod *corev1.Pod) *corev1.Pod {
	t.Helper()
	created, err := c.Client().CoreV1().Pods(pod.Namespace).Create(t.Context(), pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return created
}

func pullingPod(name, node, image string) *corev1.Pod {
	pod := testPod(name, node)
	pod.Spec.Containers[0].Image = image
	pod.Spec.Containers[0].ImagePullPolicy = corev1.PullIfNotPresent
	return pod
}

// progressRE reads the bytes of a PullProgress note: "…: 4.0 MiB of 12.0 MiB (33%)…".
var progressRE = regexp.MustCompile(`: ([0-9.]+) ([KMGT]?i?B) of ([0-9.]+) ([KMGT]?i?B) \(`)

func noteBytes(t *testing.T, note string) (done, total float64) {
	t.Helper()
	m := progressRE.FindStringSubmatch(note)
	if m == nil {
		t.Fatalf("no bytes in %q", note)
	}
	unit := map[string]float64{"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
	d, _ := strconv.ParseFloat(m[1], 64)
	tot, _ := strconv.ParseFloat(m[3], 64)
	return d * unit[m[2]], tot * unit[m[4]]
}

// TestPullEvents runs pods through a real kubelet on podgate with a cap of one pull, from
// the throttled local registry: the pod whose image downloads gets progress Events whose bytes
// grow and end at the image's size (from containerd's content store); the pod behind it a
// queue Event naming the cap and its place; a pod deleted while its pull waits a cancellation
// Event.
func TestPullEvents(t *testing.T) {
	n := startNodeConfigured(t, true, parallelPulls, pullEventsConfig, rig.Options{})
	c := n.cluster
	// 12 MiB at 2 MiB/s: six seconds of download, three progress Events at least.
	const layerSize, bandwidth = 12 << 20, 2 << 20
	reg := registry.New(bandwidth)
	reg.Serve(t)
	big := reg.Push(t, "events/big", 1, layerSize)[0]
	small := reg.Push(t, "events/small", 2, 64<<10)
	reg.Count(true)

	running := createPod(t, c, pullingPod("running", c.NodeName(), big))
	waitFor(t, 2*time.Minute, "the big layer's download", func() (bool, error) {
		s := reg.Stats()
		return len(s.BlobGets) >= 2, fmt.Errorf("registry: %+v", s)
	})
	// The big pull stays in flight, part-way, until the pods behind it are lined up and one is
	// cancelled, however slowly the machine starts them: six seconds of download alone were
	// not always enough.
	reg.Pause()
	waiting := createPod(t, c, pullingPod("waiting", c.NodeName(), small[0]))
	waitEvent(t, c, waiting, "PullQueued", small[0], "imagePulls.maxParallel 1, 1 running", "place 1 of 1")
	deleted := createPod(t, c, pullingPod("deleted", c.NodeName(), small[1]))
	waitEvent(t, c, deleted, "PullQueued", small[1], "place 2 of 2")
	var zero int64
	if err := c.Client().CoreV1().Pods(deleted.Namespace).Delete(t.Context(), deleted.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatal(err)
	}
	waitEvent(t, c, deleted, "PullCancelled", small[1], "while it waited in podgate's queue; it never reached the runtime")
	reg.Resume()

	waitPod(t, c, running.Namespace, running.Name, func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
	final := waitEvent(t, c, running, "PullProgress", "Pulled image", "(100%)")
	var last, total float64
	var notes []string
	for _, e := range podgateEvents(t, c, running.Namespace, running.UID) {
		if e.Reason != "PullProgress" {
			continue
		}
		if strings.Contains(e.Note, "its size is not known yet") {
			// The first Event may come before the tracker has seen the manifest (a busy
			// machine); once the size is known it stays known.
			if len(notes) > 0 {
				t.Errorf("the size went unknown again after %q: %q", notes[len(notes)-1], e.Note)
			}
			continue
		}
		notes = append(notes, e.Note)
		done, tot := noteBytes(t, e.Note)
		if done < last {
			t.Errorf("progress went back: %q", notes)
		}
		last, total = done, tot
	}
	t.Logf("progress Events of %s:\n%s", running.Name, strings.Join(notes, "\n"))
	if len(notes) < 3 {
		t.Errorf("%d progress Events for a %d-second download, want several", len(notes), layerSize/bandwidth)
	}
	if total < layerSize || last != total || !strings.Contains(final.Note, "Pulled image") {
		t.Errorf("progress ends at %v of %v bytes (%q), want the image's size, at least the layer's %d", last, total, final.Note, layerSize)
	}
	waitPod(t, c, waiting.Namespace, waiting.Name, func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
}

// eventWrites reads the API server's count of Event writes of events.k8s.io (POST and PATCH):
// podgate's only, since the kubelet writes core/v1 Events.
func eventWrites(t *testing.T, c *cluster.Cluster) float64 {
	t.Helper()
	raw, err := c.Client().CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(strings.NewReader(string(raw)))
	if err != nil {
		t.Fatal(err)
	}
	var n float64
	for _, m := range families["apiserver_request_total"].GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		if labels["group"] == "events.k8s.io" && labels["resource"] == "events" && (labels["verb"] == "POST" || labels["verb"] == "PATCH") {
			n += m.GetCounter().GetValue()
		}
	}
	return n
}

// TestPullEventWritesBounded: 100 pods whose pulls wait behind one held pull (cap 1) for 20 s
// cost the API server one Event write each, plus a few progress Events for the held pull, not
// one per pod per second: counted by the API server itself (apiserver_request_total).
func TestPullEventWritesBounded(t *testing.T) {
	n := startNodeConfigured(t, true, parallelPulls, pullEventsConfig, rig.Options{})
	c := n.cluster
	_, ctx := ktesting.NewTestContext(t)
	const pods, window = 100, 20 * time.Second
	reg := registry.New(0)
	reg.Serve(t)
	refs := reg.Push(t, "bounded", pods, 4<<10)
	reg.Count(true)
	reg.Hold() // the first pull holds the only slot; the others queue in podgate
	defer reg.Release()
	before := eventWrites(t, c)
	var created []*corev1.Pod
	for i, ref := range refs {
		created = append(created, createPod(t, c, pullingPod(fmt.Sprintf("bounded-%d", i), c.NodeName(), ref)))
	}
	// Every pod's pull has reached podgate: 99 wait, one is held at the registry. (A pod may
	// be told twice: the kubelet retries a pull that failed, and the retry waits again.)
	waitFor(t, 5*time.Minute, "every pull queued in podgate and told so", func() (bool, error) {
		told := map[types.UID]bool{}
		list, err := c.Client().EventsV1().Events(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		for _, e := range list.Items {
			if e.Reason == "PullQueued" {
				told[e.Regarding.UID] = true
			}
		}
		return len(told) >= pods-1, fmt.Errorf("%d pods told PullQueued", len(told))
	})
	queuedAt, atQueued := time.Now(), eventWrites(t, c)
	// Hold the queue for the window: the waiting pulls cost the API server nothing more, where
	// a report per second would write pods × window/1s Events.
	waitFor(t, window+time.Minute, "the window to pass", func() (bool, error) { return time.Since(queuedAt) >= window, nil })
	end := eventWrites(t, c)
	list, err := c.Client().EventsV1().Events(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	reasons := map[string]int{}
	for _, e := range list.Items {
		if e.ReportingController == "podgate.dev/podgate" {
			reasons[e.Reason]++
		}
	}
	held := time.Since(queuedAt)
	elapsed := time.Since(created[0].CreationTimestamp.Time)
	t.Logf("%d pods, all queued after %s, held %s more: %v Event writes at the API server in all, %v in the window; podgate's Events by reason %v",
		pods, queuedAt.Sub(created[0].CreationTimestamp.Time).Round(time.Second), held.Round(time.Second), end-before, end-atQueued, reasons)
	// In the window only the held pull's progress is reported, every 2 s (its note changes with
	// the time); before it, one PullQueued per pod (and per retried pull) and that progress.
	if window := end - atQueued; window > float64(held/(2*time.Second))+2 {
		t.Errorf("%v Event writes while the queue was held for %s, want only the held pull's progress, one per 2 s", window, held.Round(time.Second))
	}
	if total, limit := end-before, float64(reasons["PullQueued"])+float64(elapsed/(2*time.Second))+2; total > limit || reasons["PullQueued"] > pods+10 {
		t.Errorf("%v Event writes in all (%d PullQueued), want at most one PullQueued per pull and a progress Event per 2 s: %v", total, reasons["PullQueued"], limit)
	}
	var zero int64
	for _, p := range created {
		if err := c.Client().CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
			t.Fatal(err)
		}
	}
}
