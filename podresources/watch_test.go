package podresources

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"

	pb "github.com/podgate/podgate/podresources/api/v1alpha1"
)

// recvUntilSynced reads a watch's initial events up to SYNCED and returns them, SYNCED last.
func recvUntilSynced(t *testing.T, w grpc.ServerStreamingClient[pb.WatchEvent]) []*pb.WatchEvent {
	t.Helper()
	var evs []*pb.WatchEvent
	for {
		ev, err := w.Recv()
		if err != nil {
			t.Fatalf("watch, before SYNCED: %v", err)
		}
		evs = append(evs, ev)
		if ev.GetType() == pb.WatchEvent_SYNCED {
			return evs
		}
	}
}

func event(typ pb.WatchEvent_Type, rev uint64, p *pb.Pod) *pb.WatchEvent {
	return &pb.WatchEvent{Type: typ, Pod: p, Revision: rev}
}

// TestWatch: the known pods as POD_ADDED at the snapshot's revision, SYNCED, then the published
// events in order; an event published between the watch's subscription and its snapshot, which
// the snapshot holds already, is not sent again.
func TestWatch(t *testing.T) {
	ctx := testContext(t)
	b := NewBroadcaster(4, 16)
	a1 := pod("a", "one", "uid-1", sandbox(t0), netClaim())
	b1 := pod("b", "two", "uid-2", nil)
	src := &fakeSource{}
	src.set(5, a1, b1)
	// The race, made deterministic: while the watch reads its snapshot, the registry changes
	// (revision 6, which the snapshot then holds) and publishes; a late event of revision 5
	// arrives too.
	changed := proto.CloneOf(b1)
	changed.Sandbox = sandbox(t0.Add(time.Second))
	var once sync.Once
	src.onPods = func() {
		once.Do(func() {
			b.Publish(event(pb.WatchEvent_POD_UPDATED, 5, a1))
			src.set(6, a1, changed)
			b.Publish(event(pb.WatchEvent_POD_UPDATED, 6, changed))
		})
	}
	r := newRig(t, Options{Source: src, Broadcaster: b})

	w, err := r.ext().Watch(ctx, &pb.WatchRequest{})
	if err != nil {
		t.Fatal(err)
	}
	initial := recvUntilSynced(t, w)
	if len(initial) != 3 {
		t.Fatalf("initial events: %d, want 2 POD_ADDED and SYNCED:\n%v", len(initial), initial)
	}
	want := map[string]*pb.Pod{"uid-1": a1, "uid-2": changed}
	for _, ev := range initial[:2] {
		if ev.GetType() != pb.WatchEvent_POD_ADDED || ev.GetRevision() != 6 || !proto.Equal(ev.GetPod(), want[ev.GetPod().GetUid()]) {
			t.Errorf("initial event %s, want POD_ADDED at revision 6 of %s", prototext.Format(ev), prototext.Format(want[ev.GetPod().GetUid()]))
		}
		delete(want, ev.GetPod().GetUid())
	}
	if len(want) != 0 {
		t.Errorf("pods not sent: %v", want)
	}
	if s := initial[2]; s.GetRevision() != 6 || s.GetPod() != nil {
		t.Errorf("SYNCED %s, want revision 6 and no pod", prototext.Format(s))
	}

	later := []*pb.WatchEvent{
		event(pb.WatchEvent_POD_ADDED, 7, pod("c", "three", "uid-3", nil)),
		event(pb.WatchEvent_DEVICES_PREPARED, 8, pod("c", "three", "uid-3", nil, netClaim())),
		event(pb.WatchEvent_POD_REMOVED, 9, a1),
	}
	for _, ev := range later {
		b.Publish(ev)
	}
	for _, wantEv := range later {
		ev, err := w.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if !proto.Equal(ev, wantEv) {
			t.Fatalf("event %s, want %s (revisions 5 and 6 are in the snapshot and skipped)", prototext.Format(ev), prototext.Format(wantEv))
		}
	}
}

// bigPod is a pod of about size bytes on the wire, in its sysctls.
func bigPod(uid string, size int) *pb.Pod {
	p := pod("big", "pod-"+uid, uid, sandbox(t0))
	p.Sandbox.Sysctls = &pb.Sysctls{Asked: map[string]string{"net.core.big": strings.Repeat("x", size)}}
	return p
}

// TestWatchSlowWatcherDropped: a client that stops reading while large events are published
// blocks its watch on HTTP/2 flow control; its buffer fills and the broadcaster drops it. The
// client then reads what was queued for it, in order, and ResourceExhausted.
func TestWatchSlowWatcherDropped(t *testing.T) {
	ctx := testContext(t)
	b := NewBroadcaster(4, DefaultWatcherBuffer)
	r := newRig(t, Options{Source: &fakeSource{}, Broadcaster: b})
	// Fixed HTTP/2 windows: with grpc's BDP estimation the client could buffer up to 16 MiB
	// without reading, and whether the watch blocks would depend on timing.
	conn := dial(t, r.path, grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
	w, err := pb.NewPodResourcesClient(conn).Watch(ctx, &pb.WatchRequest{})
	if err != nil {
		t.Fatal(err)
	}
	recvUntilSynced(t, w)
	if got := metricValue(t, r.metrics, "podgate_podresources_watchers"); got != 1 {
		t.Fatalf("watchers gauge = %v, want 1", got)
	}

	// 400 events of 16 KiB, 6.4 MiB: far past the windows (64 KiB each) plus the buffer of 256.
	const events, size = 400, 16 << 10
	for i := range events {
		b.Publish(event(pb.WatchEvent_POD_UPDATED, uint64(i+1), bigPod("uid-big", size)))
	}
	eventually(t, "the slow watcher is dropped", func() bool { return b.Watchers() == 0 })
	if got := metricValue(t, r.metrics, "podgate_podresources_watchers_dropped_total"); got != 1 {
		t.Errorf("watchers_dropped_total = %v, want 1", got)
	}
	if got := metricValue(t, r.metrics, "podgate_podresources_watchers"); got != 0 {
		t.Errorf("watchers gauge = %v after the drop, want 0", got)
	}

	var got uint64
	for {
		ev, err := w.Recv()
		if err != nil {
			if st := status.Convert(err); st.Code() != codes.ResourceExhausted || !strings.Contains(st.Message(), "behind") {
				t.Fatalf("after %d events: %v, want ResourceExhausted saying the client fell behind", got, err)
			}
			break
		}
		if ev.GetRevision() != got+1 {
			t.Fatalf("event of revision %d after %d: events lost or out of order before the drop", ev.GetRevision(), got)
		}
		got = ev.GetRevision()
	}
	if got >= events {
		t.Errorf("the client read all %d events, want fewer: it was dropped", got)
	}
}

// TestWatchMaxWatchers: a watch over the limit is ResourceExhausted; one ending frees its slot.
func TestWatchMaxWatchers(t *testing.T) {
	ctx := testContext(t)
	b := NewBroadcaster(1, 16)
	r := newRig(t, Options{Source: webSource(), Broadcaster: b})

	firstCtx, endFirst := context.WithCancel(ctx)
	defer endFirst()
	first, err := r.ext().Watch(firstCtx, &pb.WatchRequest{})
	if err != nil {
		t.Fatal(err)
	}
	recvUntilSynced(t, first)

	second, err := r.ext().Watch(ctx, &pb.WatchRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := second.Recv(); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("second watch with a limit of 1: %v, want ResourceExhausted", err)
	}

	endFirst()
	eventually(t, "the first watch ends", func() bool { return b.Watchers() == 0 })
	third, err := r.ext().Watch(ctx, &pb.WatchRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if evs := recvUntilSynced(t, third); len(evs) != 2 {
		t.Errorf("third watch: %d initial events, want POD_ADDED and SYNCED", len(evs))
	}
}

// TestWatchShutdown: Shutdown ends the running watches (Unavailable) and Serve returns nil.
func TestWatchShutdown(t *testing.T) {
	ctx := testContext(t)
	b := NewBroadcaster(4, 16)
	r := newRig(t, Options{Source: webSource(), Broadcaster: b})
	w, err := r.ext().Watch(ctx, &pb.WatchRequest{})
	if err != nil {
		t.Fatal(err)
	}
	recvUntilSynced(t, w)

	r.shutdown(t) // fails the test unless Serve returned nil
	if _, err := w.Recv(); status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "stopping") {
		t.Errorf("watch after Shutdown: %v, want Unavailable saying podgate is stopping", err)
	}
	if _, ok := b.subscribe(); ok {
		t.Error("the broadcaster took a watcher after Shutdown")
	}
	b.Publish(event(pb.WatchEvent_POD_ADDED, 1, webPod())) // no watcher left: must not panic
}

func TestBroadcaster(t *testing.T) {
	t.Run("limit", func(t *testing.T) {
		b := NewBroadcaster(2, 1)
		w1, ok1 := b.subscribe()
		_, ok2 := b.subscribe()
		if _, ok3 := b.subscribe(); !ok1 || !ok2 || ok3 {
			t.Fatalf("subscribe ok = %v %v %v, want true true false", ok1, ok2, ok3)
		}
		b.unsubscribe(w1)
		b.unsubscribe(w1) // a second time changes nothing
		if got := b.Watchers(); got != 1 {
			t.Fatalf("Watchers = %d, want 1", got)
		}
		if _, ok := b.subscribe(); !ok {
			t.Fatal("subscribe after unsubscribe refused")
		}
	})
	t.Run("drop", func(t *testing.T) {
		b := NewBroadcaster(2, 1)
		drops := 0
		b.onDrop = func() { drops++ }
		slow, _ := b.subscribe()
		fast, _ := b.subscribe()
		b.Publish(event(pb.WatchEvent_POD_ADDED, 1, nil))
		<-fast.ch
		b.Publish(event(pb.WatchEvent_POD_ADDED, 2, nil))
		// The slow watcher's channel is closed; it may still hand over event 1, queued
		// before the drop, never event 2.
		for ev := range slow.ch {
			if ev.GetRevision() != 1 {
				t.Fatalf("slow watcher got event %d after it was dropped", ev.GetRevision())
			}
		}
		if !b.wasDropped(slow) {
			t.Fatal("slow watcher not marked dropped")
		}
		if ev := <-fast.ch; ev.GetRevision() != 2 || b.wasDropped(fast) {
			t.Fatalf("fast watcher got %v, dropped %v; want event 2 and not dropped", ev, b.wasDropped(fast))
		}
		if drops != 1 || b.Watchers() != 1 {
			t.Fatalf("drops %d, watchers %d; want 1 and 1", drops, b.Watchers())
		}
		b.unsubscribe(slow) // the watch's deferred unsubscribe after a drop: no double close
	})
	t.Run("close", func(t *testing.T) {
		b := NewBroadcaster(2, 1)
		w, _ := b.subscribe()
		b.Close()
		if _, ok := <-w.ch; ok || b.wasDropped(w) {
			t.Fatal("after Close the channel is open or the watcher counted dropped")
		}
		b.unsubscribe(w)
		b.Publish(event(pb.WatchEvent_POD_ADDED, 1, nil))
		if _, ok := b.subscribe(); ok {
			t.Fatal("subscribe after Close accepted")
		}
	})
	t.Run("concurrent", func(t *testing.T) {
		// Watchers come and go while events are published; each sees its events in order.
		// Run under -race.
		b := NewBroadcaster(8, 4)
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					w, ok := b.subscribe()
					if !ok {
						continue
					}
					var last uint64
					for range 3 {
						ev, ok := <-w.ch
						if !ok {
							break
						}
						if ev.GetRevision() <= last {
							t.Errorf("revision %d after %d", ev.GetRevision(), last)
						}
						last = ev.GetRevision()
					}
					b.unsubscribe(w)
				}
			}()
		}
		for i := range 2000 {
			b.Publish(event(pb.WatchEvent_POD_UPDATED, uint64(i+1), nil))
		}
		b.Close()
		close(stop)
		wg.Wait()
		if got := b.Watchers(); got != 0 {
			t.Errorf("Watchers = %d after Close, want 0", got)
		}
	})
}

// TestWatchDroppedWatcherKeepsItsSlot: a watch dropped for falling behind whose client still
// does not read keeps running on the server (its handler is blocked sending to the client), so
// it must keep its place under maxWatchers until it has ended; otherwise a client that opens
// watches and never reads them makes podgate hold ever more goroutines and events, past the
// limit.
func TestWatchDroppedWatcherKeepsItsSlot(t *testing.T) {
	ctx := testContext(t)
	b := NewBroadcaster(1, 4)
	r := newRig(t, Options{Source: &fakeSource{}, Broadcaster: b})
	conn := dial(t, r.path, grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
	slow, err := pb.NewPodResourcesClient(conn).Watch(ctx, &pb.WatchRequest{})
	if err != nil {
		t.Fatal(err)
	}
	recvUntilSynced(t, slow)

	// Two events of 1 MiB, far past the client's 64 KiB window: the handler sends the first
	// and blocks sending the second until the client reads, which it does not.
	for rev := range uint64(2) {
		b.Publish(event(pb.WatchEvent_POD_UPDATED, rev+1, bigPod("uid-big", 1<<20)))
	}
	eventually(t, "the handler takes both events", func() bool { return queued(b) == 0 })
	// The handler takes nothing more: the buffer of 4 fills and the fifth event drops it.
	for rev := range uint64(5) {
		b.Publish(event(pb.WatchEvent_POD_UPDATED, rev+3, bigPod("uid-big", 16)))
	}
	if got := metricValue(t, r.metrics, "podgate_podresources_watchers_dropped_total"); got != 1 {
		t.Fatalf("watchers_dropped_total = %v, want 1", got)
	}
	const watchMethod = "/podgate.podresources.v1alpha1.PodResources/Watch"
	if got := metricValue(t, r.metrics, "podgate_podresources_requests_total", "method", watchMethod, "code", "ResourceExhausted"); got != 0 {
		t.Fatalf("the dropped watch ended on the server (%v) although its client reads nothing", got)
	}

	// The dropped watch's handler still runs: a second watch is over the limit of 1.
	if ev, err := tryWatch(ctx, r); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("a second watch while the dropped one still runs on the server: %v, %v; want ResourceExhausted (maxWatchers 1)", ev, err)
	}

	// Once the slow client reads to the end, the dropped watch ends and its place is free.
	for {
		if _, err := slow.Recv(); err != nil {
			if status.Code(err) != codes.ResourceExhausted {
				t.Fatalf("dropped watch: %v, want ResourceExhausted", err)
			}
			break
		}
	}
	eventually(t, "the dropped watch's handler returns", func() bool {
		return metricValue(t, r.metrics, "podgate_podresources_requests_total", "method", watchMethod, "code", "ResourceExhausted") >= 1
	})
	eventually(t, "a new watch is admitted", func() bool {
		ev, err := tryWatch(ctx, r)
		if status.Code(err) == codes.ResourceExhausted {
			return false
		}
		if err != nil || ev.GetType() != pb.WatchEvent_SYNCED {
			t.Fatalf("new watch: %v, %v; want SYNCED", ev, err)
		}
		return true
	})
}

// queued is how many events wait in the watchers' buffers.
func queued(b *Broadcaster) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := 0
	for w := range b.watchers {
		n += len(w.ch)
	}
	return n
}

// tryWatch opens a watch on an empty source, returns its first event or error, and ends it.
func tryWatch(ctx context.Context, r *rig) (*pb.WatchEvent, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w, err := r.ext().Watch(ctx, &pb.WatchRequest{})
	if err != nil {
		return nil, err
	}
	return w.Recv()
}
