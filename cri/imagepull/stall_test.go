package imagepull

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/podgate/podgate/cri/imagepull/progress"
)

// recordedEvent is one Event a fakeSink was given.
type recordedEvent struct {
	pod                     PodRef
	eventType, reason, note string
}

// fakeSink records the Events written.
type fakeSink struct {
	mu     sync.Mutex
	events []recordedEvent
}

var _ EventSink = (*fakeSink)(nil)

func (s *fakeSink) Eventf(pod PodRef, eventType, reason, _, noteFormat string, args ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.events = append(s.events, recordedEvent{pod, eventType, reason, fmt.Sprintf(noteFormat, args...)})
}

func (s *fakeSink) byReason(reason string) []recordedEvent {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []recordedEvent
	for _, e := range s.events {
		if e.reason == reason {
			out = append(out, e)
		}
	}
	return out
}

// TestStallCancelsAndNames: with maxParallel 1, a running pull shared by two pods and a pull
// of another image queued behind it; the stall cancels the backend call, both callers get one
// Unavailable error naming the image, the registry, the rate and the minimum, each pod a
// PullStalled Event, the registry's counter goes up, and the queued pull starts at once.
func TestStallCancelsAndNames(t *testing.T) {
	reg := prometheus.NewRegistry()
	sink := &fakeSink{}
	events := newPullEvents(nil, sink, time.Hour, time.Hour, time.Hour) // no pull progress
	g := New(Limits{MaxParallel: 1, PerRegistry: map[string]int{"slow.example.com": 1}}, WithRegisterer(reg), WithObserver(events))
	tr := trace(g)
	b := newFakeBackend()
	pa := newPull(t, "slow.example.com/app:1", PriorityNormal, withPod("default", "a", "uid-a"))
	pb := newPull(t, "slow.example.com/app:1", PriorityNormal, withPod("default", "b", "uid-b"))
	pc := newPull(t, "fast.example.com/other:1", PriorityNormal, withPod("default", "c", "uid-c"))
	resA := goDo(t.Context(), g, pa, b.pull(pa.Image))
	call := b.next(t)
	resB := goDo(t.Context(), g, pb, b.pull("must-not-be-called"))
	tr.await(t, "joined", pb.Image)
	resC := goDo(t.Context(), g, pc, b.pull(pc.Image))
	tr.await(t, "queued", pc.Image)

	if g.Stall(pa.Image, time.Now(), 210, progress.StallRule{MinBytesPerSecond: 1024, Window: 5 * time.Minute}) {
		t.Fatal("Stall cancelled a pull that started at another time")
	}
	running := g.Running()
	if len(running) != 1 {
		t.Fatalf("running %+v, want the one pull", running)
	}
	rule := progress.StallRule{MinBytesPerSecond: 1024, Window: 5 * time.Minute}
	if !g.Stall(pa.Image, running[0].Started, 210, rule) {
		t.Fatal("Stall found no running pull")
	}
	if call.ctx.Err() == nil {
		t.Error("the backend call goes on after the stall")
	}
	// The slot goes to the queued pull.
	if next := b.next(t); next.image != pc.Image {
		t.Errorf("after the stall %s started, want %s", next.image, pc.Image)
	} else {
		next.release <- nil
	}
	want := "pull of slow.example.com/app:1 stalled: 210 B/s from registry slow.example.com over the last 5m, below imagePulls.stall.minBytesPerSecond 1.0 KiB/s; podgate cancelled the pull"
	for name, ch := range map[string]<-chan result{"leader": resA, "shared": resB} {
		r := wait(t, ch)
		if !errdefs.IsUnavailable(r.err) || r.err == nil || r.err.Error() != want {
			t.Errorf("%s caller got %v, want Unavailable %q", name, r.err, want)
		}
	}
	if r := wait(t, resC); r.err != nil {
		t.Errorf("queued pull: %v", r.err)
	}
	if got := testutil.ToFloat64(g.metrics.stalls.WithLabelValues("slow.example.com")); got != 1 {
		t.Errorf("podgate_image_pull_stalls_total{registry=slow.example.com} = %v, want 1", got)
	}
	stalled := sink.byReason(ReasonPullStalled)
	if len(stalled) != 2 {
		t.Fatalf("PullStalled Events %+v, want one per waiting pod", stalled)
	}
	pods := map[string]bool{}
	for _, e := range stalled {
		pods[e.pod.Name] = true
		for _, s := range []string{`"slow.example.com/app:1"`, "registry slow.example.com", "210 B/s from", "1.0 KiB/s", "5m"} {
			if !strings.Contains(e.note, s) || e.eventType != "Warning" {
				t.Errorf("%s Event %q (%s) lacks %q", e.pod.Name, e.note, e.eventType, s)
			}
		}
	}
	if !pods["a"] || !pods["b"] {
		t.Errorf("PullStalled Events for %v, want pods a and b", pods)
	}
	// A new caller starts a pull of its own, not the stalled one's.
	resD := goDo(t.Context(), g, pa, b.pull(pa.Image))
	b.next(t).release <- nil
	if r := wait(t, resD); r.err != nil {
		t.Errorf("pull after the stall: %v", r.err)
	}
	if g.Stall(pa.Image, running[0].Started, 210, rule) {
		t.Error("a second Stall of the same pull cancelled something")
	}
}
