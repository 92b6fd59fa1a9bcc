package progress

import (
	"context"
	"sync"
	"testing"
	"time"

	contentapi "github.com/containerd/containerd/api/services/content/v1"
	"github.com/prometheus/client_golang/prometheus"
)

// TestStallWindow feeds readings one second apart, as the tracker's polls come, and checks the
// verdict after each: below the minimum over the whole window is a stall, below it for part of
// the window is stalling, a burst inside the window clears it, a restarted ingest starts the
// window afresh and a fetched pull is never judged.
func TestStallWindow(t *testing.T) {
	rule := StallRule{MinBytesPerSecond: 1000, Window: 5 * time.Second}
	start := time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)
	type step struct {
		done    int64
		rate    float64
		forSecs int
		stalled bool
	}
	for _, tc := range []struct {
		name  string
		steps []step // one reading a second
	}{
		{"steady above the minimum", []step{{0, 0, 0, false}, {1000, 0, 0, false}, {2000, 0, 0, false}, {3000, 0, 0, false},
			{4000, 0, 0, false}, {5000, 0, 0, false}, {6000, 0, 0, false}, {7000, 0, 0, false}}},
		{"a trickle stalls once the window is full", []step{{0, 0, 0, false}, {200, 200, 1, false}, {400, 200, 2, false}, {600, 200, 3, false},
			{800, 200, 4, false}, {1000, 200, 5, true}, {1200, 200, 5, true}}},
		{"a fast start then a trickle: stalled once the start has left the window", []step{{0, 0, 0, false}, {10000, 0, 0, false}, {10100, 100, 1, false},
			{10200, 100, 2, false}, {10300, 100, 3, false}, {10400, 100, 4, false}, {10500, 100, 5, true}, {10600, 100, 5, true}}},
		{"a burst clears a stalling pull", []step{{0, 0, 0, false}, {100, 100, 1, false}, {200, 100, 2, false}, {9000, 0, 0, false}, {9100, 100, 1, false}}},
		{"a restarted ingest starts afresh", []step{{0, 0, 0, false}, {100, 100, 1, false}, {200, 100, 2, false}, {300, 100, 3, false},
			{50, 0, 0, false}, {60, 10, 1, false}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var w stallWindow
			for i, s := range tc.steps {
				w.add(start.Add(time.Duration(i)*time.Second), s.done, rule.Window)
				got := w.judge(rule, 0)
				want := Stall{Rate: s.rate, For: time.Duration(s.forSecs) * time.Second, Stalled: s.stalled}
				if got != want {
					t.Fatalf("reading %d (%d bytes at %ds): %+v, want %+v", i, s.done, i, got, want)
				}
				if got.Stalling() != (s.forSecs > 0) {
					t.Errorf("reading %d: Stalling() %v with For %s", i, got.Stalling(), got.For)
				}
			}
			if n := len(w.samples); n > int(rule.Window/time.Second)+1 {
				t.Errorf("%d readings kept, want at most the window's and its base", n)
			}
		})
	}
	t.Run("bytes containerd may hold unwritten count", func(t *testing.T) {
		var w stallWindow
		for i := range 10 { // nothing written, but up to 5000 bytes may be held: 1000 B/s
			w.add(start.Add(time.Duration(i)*time.Second), 0, rule.Window)
		}
		if got := w.judge(rule, 5000); got != (Stall{}) {
			t.Errorf("5000 bytes unseen in 5s judged %+v, want not below 1000 B/s", got)
		}
		if got := w.judge(rule, 4999); !got.Stalled || got.Rate != 0 {
			t.Errorf("4999 bytes unseen in 5s judged %+v, want stalled at 0 B/s seen", got)
		}
	})
	t.Run("fetched", func(t *testing.T) {
		w := stallWindow{complete: true}
		for i := range 10 {
			w.add(start.Add(time.Duration(i)*time.Second), 0, rule.Window)
		}
		if got := w.judge(rule, 0); got != (Stall{}) {
			t.Errorf("a fetched pull judged %+v", got)
		}
	})
	t.Run("off", func(t *testing.T) {
		var w stallWindow
		for i := range 10 {
			w.add(start.Add(time.Duration(i)*time.Second), 0, rule.Window)
		}
		if got := w.judge(StallRule{Window: rule.Window}, 0); got != (Stall{}) {
			t.Errorf("no minimum, judged %+v", got)
		}
	})
}

// TestTrackerFindsAStall: a pull whose first layer trickles, so slowly that even with what
// containerd may hold unwritten (the rest of the 1000-byte layer) it is below the minimum, is
// told to onStall once, after the window counted from the first reading of its bytes; a pull whose blobs are all fetched
// (unpacking) never is, however long it runs.
func TestTrackerFindsAStall(t *testing.T) {
	start := time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)
	f := &fakeContent{infos: map[string]*contentapi.Info{}, data: map[string][]byte{}}
	src := map[string]string{distributionSourceLabel + "127.0.0.1": "team/app", configLabel: configDigest}
	f.commit(manifestDigest, 400, src, start.Add(100*time.Millisecond), manifest(configDigest, layer1, layer2))
	f.commit(configDigest, 100, nil, start.Add(200*time.Millisecond), nil)
	f.commit(layer2, 500, nil, start.Add(300*time.Millisecond), nil)
	f.ingest(layer1, 0, 1000)
	path := serveContent(t, f)

	running := []Running{{Image: "127.0.0.1:5000/team/app:v1", Registry: "other", Started: start}}
	var mu sync.Mutex
	clock := start
	var stalls []Progress
	rule := StallRule{MinBytesPerSecond: 400, Window: 3 * time.Second}
	pulls := stallingPulls{running: func() []Running { return running }, stalled: func(r Running, p Progress) {
		if r.Image != running[0].Image {
			t.Errorf("stall of %q, want %q", r.Image, running[0].Image)
		}
		stalls = append(stalls, p)
	}}
	tr, err := New(path, WithRegisterer(prometheus.NewRegistry()), WithStall(rule))
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	tr.now = func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		return clock
	}
	// poll writes done bytes of the first layer (none when negative), a second later.
	poll := func(done int64) Progress {
		t.Helper()
		if done >= 0 {
			f.ingest(layer1, done, 1000)
		}
		mu.Lock()
		clock = clock.Add(time.Second)
		mu.Unlock()
		tr.Poll(t.Context(), pulls)
		p, _ := tr.Progress(running[0].Image)
		return p
	}
	for i, done := range []int64{10, 40, 70} { // 30 B/s
		if p := poll(done); p.Stall.Stalled || len(stalls) != 0 {
			t.Fatalf("poll %d: stalled (%+v, %d told) before the window is full", i, p.Stall, len(stalls))
		}
	}
	p := poll(100)
	if !p.Stall.Stalled || p.Stall.Rate != 30 || p.Stall.For != rule.Window {
		t.Fatalf("after the window: %+v, want stalled at 30 B/s for %s", p.Stall, rule.Window)
	}
	poll(130)
	if len(stalls) != 1 || stalls[0].Stall.Rate != 30 {
		t.Fatalf("Stalled told %d times (%+v), want once at 30 B/s", len(stalls), stalls)
	}

	// Every blob fetched: the runtime unpacks for as long as it takes; no stall.
	running = []Running{{Image: running[0].Image, Registry: "other", Started: clock}}
	stalls = nil
	f.commit(manifestDigest, 400, src, clock, manifest(configDigest, layer1, layer2))
	f.commit(layer1, 1000, nil, clock, nil)
	for i := range 10 {
		if p := poll(-1); p.Stall != (Stall{}) || p.BlobsDone != 3 {
			t.Fatalf("unpacking, poll %d: %+v", i, p)
		}
	}
	if len(stalls) != 0 {
		t.Errorf("an unpacking pull told as stalled: %+v", stalls)
	}
}

// stallingPulls are the pulls running lists, their stalls told to stalled.
type stallingPulls struct {
	running func() []Running
	stalled func(Running, Progress)
}

func (p stallingPulls) Running() []Running { return p.running() }

func (p stallingPulls) Stalled(_ context.Context, r Running, pr Progress) { p.stalled(r, pr) }
