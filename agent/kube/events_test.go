package kube

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/podgate/podgate/test/kubefake"
)

// eventRig is a recorder writing to client-go's fake clientset, with a clock of the test's.
type eventRig struct {
	cs  *fake.Clientset
	rec *EventRecorder
	mu  sync.Mutex
	now time.Time
}

func newEventRig(t *testing.T, opts ...EventOption) *eventRig {
	t.Helper()
	r := &eventRig{cs: fake.NewClientset(), now: time.Date(2026, 5, 6, 7, 8, 9, 0, time.UTC)}
	r.rec = NewEventRecorder(kubefake.Wrap(r.cs), "node-a", opts...)
	r.rec.now = func() time.Time {
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.now
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.rec.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return r
}

func (r *eventRig) advance(d time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.now = r.now.Add(d)
}

// writes counts the creates and patches of Events the API server got.
func (r *eventRig) writes() (creates, patches int) {
	for _, a := range r.cs.Actions() {
		if a.GetResource().Resource != "events" {
			continue
		}
		switch a.GetVerb() {
		case "create":
			creates++
		case "patch":
			patches++
		}
	}
	return creates, patches
}

// settled reports whether the recorder has no write in flight.
func (r *eventRig) settled() bool {
	r.rec.mu.Lock()
	defer r.rec.mu.Unlock()
	for _, s := range r.rec.series {
		if s.pending {
			return false
		}
	}
	return true
}

// await waits until the API server got creates and patches writes, and the recorder has
// taken in their results.
func (r *eventRig) await(t *testing.T, creates, patches int) {
	t.Helper()
	r.awaitWrites(t, creates, patches, true)
}

// awaitWrites waits until the API server got creates and patches writes, and with settled
// until the recorder has no write in flight.
func (r *eventRig) awaitWrites(t *testing.T, creates, patches int, settled bool) {
	t.Helper()
	err := wait.PollUntilContextTimeout(t.Context(), 5*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		c, p := r.writes()
		return c == creates && p == patches && (!settled || r.settled()), nil
	})
	if err != nil {
		c, p := r.writes()
		t.Fatalf("Event writes: %d creates, %d patches; want %d, %d", c, p, creates, patches)
	}
}

var web = PodRef{Namespace: "default", Name: "web", UID: "uid-web"}

// TestEventRecorderWritesEvent: an Event is an events.k8s.io/v1 Event about the pod, reported
// by podgate.dev/podgate on the node.
func TestEventRecorderWritesEvent(t *testing.T) {
	r := newEventRig(t)
	r.rec.Eventf(web, corev1.EventTypeNormal, "PullQueued", "Waiting", "image %s waits", "busybox")
	r.await(t, 1, 0)
	list, err := r.cs.EventsV1().Events("default").List(t.Context(), metav1.ListOptions{})
	if err != nil || len(list.Items) != 1 {
		t.Fatalf("Events: %v, %v", list, err)
	}
	e := list.Items[0]
	want := corev1.ObjectReference{APIVersion: "v1", Kind: "Pod", Namespace: "default", Name: "web", UID: "uid-web"}
	if e.Regarding != want || e.ReportingController != ReportingController || e.ReportingInstance != "node-a" ||
		e.Reason != "PullQueued" || e.Action != "Waiting" || e.Note != "image busybox waits" || e.Type != corev1.EventTypeNormal ||
		!e.EventTime.Time.Equal(r.now) || e.Series != nil {
		t.Errorf("Event %+v", e)
	}
}

// TestEventRecorderSeries: repeats of an Event within 6 minutes count in its series, written
// at most every 30 s, not as new Events; a repeat after 6 minutes is a new Event.
func TestEventRecorderSeries(t *testing.T) {
	r := newEventRig(t)
	for range 5 {
		r.rec.Eventf(web, corev1.EventTypeWarning, "PullCancelled", "Cancelled", "gone")
	}
	r.await(t, 1, 0)
	r.advance(seriesWriteInterval)
	r.rec.Eventf(web, corev1.EventTypeWarning, "PullCancelled", "Cancelled", "gone") // due: written now
	r.await(t, 1, 1)
	var patched *eventsv1.Event
	for _, a := range r.cs.Actions() {
		if p, ok := a.(k8stesting.PatchAction); ok {
			e, err := r.cs.EventsV1().Events("default").Get(t.Context(), p.GetName(), metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			patched = e
		}
	}
	if patched == nil || patched.Series == nil || patched.Series.Count != 6 || !patched.Series.LastObservedTime.Time.Equal(r.now) {
		t.Errorf("series after 6 reports: %+v", patched)
	}
	// Repeated again within 30 s: counted, written by the flush.
	r.rec.Eventf(web, corev1.EventTypeWarning, "PullCancelled", "Cancelled", "gone")
	r.await(t, 1, 1)
	r.advance(seriesWriteInterval)
	r.rec.flushSeries()
	r.await(t, 1, 2)
	r.advance(seriesWindow)
	r.rec.Eventf(web, corev1.EventTypeWarning, "PullCancelled", "Cancelled", "gone")
	r.await(t, 2, 2)
	if got := testutil.ToFloat64(r.rec.results.WithLabelValues(eventRepeated)); got != 6 {
		t.Errorf("repeated = %v, want 6", got)
	}
}

// TestEventRecorderPerObjectLimit: an object gets 25 Events at once, then one every 5 minutes,
// as the kubelet's spam filter allows; other objects are not held back by it.
func TestEventRecorderPerObjectLimit(t *testing.T) {
	r := newEventRig(t, WithEventRate(1000, 1000))
	for i := range 30 {
		r.rec.Eventf(web, corev1.EventTypeNormal, "PullProgress", "Pulling", "step %d", i)
	}
	other := PodRef{Namespace: "default", Name: "db", UID: "uid-db"}
	r.rec.Eventf(other, corev1.EventTypeNormal, "PullProgress", "Pulling", "step 0")
	r.await(t, objectBurst+1, 0)
	if got := testutil.ToFloat64(r.rec.results.WithLabelValues(eventThrottled)); got != 5 {
		t.Errorf("throttled = %v, want 5", got)
	}
	r.advance(objectRefill)
	r.rec.Eventf(web, corev1.EventTypeNormal, "PullProgress", "Pulling", "later")
	r.await(t, objectBurst+2, 0)
}

// TestEventRecorderNodeRate: the writes of the node wait for the node-wide rate; a full queue
// drops Events instead of blocking the caller.
func TestEventRecorderNodeRate(t *testing.T) {
	r := newEventRig(t, WithEventRate(0.001, 2)) // two at once, then nothing within the test
	for i := range maxQueued + 10 {
		r.rec.Eventf(PodRef{Namespace: "default", Name: fmt.Sprintf("p%d", i), UID: "u"}, corev1.EventTypeNormal, "R", "A", "n")
	}
	r.awaitWrites(t, 2, 0, false) // the rest wait for the rate
	// Throttled per object (all share one UID here) or dropped: never written, never blocking.
	throttled := testutil.ToFloat64(r.rec.results.WithLabelValues(eventThrottled))
	if throttled != float64(maxQueued+10-objectBurst) {
		t.Errorf("throttled = %v, want %d", throttled, maxQueued+10-objectBurst)
	}
	for i := range maxQueued + 10 {
		r.rec.Eventf(PodRef{Namespace: "default", Name: fmt.Sprintf("q%d", i), UID: k8sUID(i)}, corev1.EventTypeNormal, "R", "A", "n")
	}
	if got := testutil.ToFloat64(r.rec.results.WithLabelValues(eventDropped)); got < 1 {
		t.Errorf("queue_full = %v, want some: the queue holds %d", got, maxQueued)
	}
	if c, _ := r.writes(); c != 2 {
		t.Errorf("%d creates past the node's burst of 2", c)
	}
}

func k8sUID(i int) types.UID { return types.UID(fmt.Sprintf("uid-%d", i)) }

func TestTruncate(t *testing.T) {
	if got := truncate("abcdé", 5); got != "ab…" {
		t.Errorf("truncate = %q", got)
	}
	if got := truncate("abc", 6); got != "abc" {
		t.Errorf("truncate = %q", got)
	}
}
