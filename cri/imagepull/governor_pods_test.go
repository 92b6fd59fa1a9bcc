package imagepull

import (
	"errors"
	"reflect"
	"slices"
	"sync"
	"testing"
	"time"

	"k8s.io/klog/v2"
)

// TestPodPulls: a pod's waiting pulls are reported, queued or started, oldest first, and
// forgotten once they return.
func TestPodPulls(t *testing.T) {
	g := New(Limits{MaxParallel: 1})
	tr := trace(g)
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	var mu sync.Mutex
	clock := t0
	g.now = func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		return clock
	}
	setClock := func(t time.Time) {
		mu.Lock()
		defer mu.Unlock()
		clock = t
	}
	b := newFakeBackend()
	setClock(t0.Add(time.Second))
	first := newPull(t, "example.com/first", PriorityNormal, withPod("default", "web", "uid-web"))
	resFirst := goDo(t.Context(), g, first, b.pull(first.Image))
	running := b.next(t)
	setClock(t0.Add(2 * time.Second))
	second := newPull(t, "example.com/second", PriorityNormal, withPod("default", "web", "uid-web"))
	resSecond := goDo(t.Context(), g, second, b.pull(second.Image))
	tr.await(t, "queued", second.Image)
	other := newPull(t, "example.com/other", PriorityNormal, withPod("default", "db", "uid-db"))
	resOther := goDo(t.Context(), g, other, b.pull(other.Image))
	tr.await(t, "queued", other.Image)

	web := klog.KRef("default", "web")
	want := []PullStatus{
		{Image: first.Image, Registry: "example.com", Pod: web, PodUID: "uid-web", Since: t0.Add(time.Second), Started: t0.Add(time.Second),
			Queued: 2, InFlight: 1, RegistryInFlight: 1, MaxParallel: 1, Waiters: 1},
		{Image: second.Image, Registry: "example.com", Pod: web, PodUID: "uid-web", Since: t0.Add(2 * time.Second),
			Position: 1, Waiting: WaitingNode, Queued: 2, InFlight: 1, RegistryInFlight: 1, MaxParallel: 1, Waiters: 1},
	}
	if got := g.PodPulls("uid-web"); !reflect.DeepEqual(got, want) {
		t.Errorf("PodPulls(uid-web) = %+v, want %+v", got, want)
	}
	if got := g.PodPulls("uid-none"); len(got) != 0 {
		t.Errorf("PodPulls of a pod without pulls = %+v, want none", got)
	}
	all := g.Pulls()
	i := slices.IndexFunc(all, func(s PullStatus) bool { return s.Image == other.Image })
	if len(all) != 3 || i < 0 || all[i].Position != 2 || all[i].Pod != klog.KRef("default", "db") {
		t.Errorf("Pulls() = %+v, want web's two and db's, second in the queue", all)
	}
	running.release <- nil
	wait(t, resFirst)
	b.next(t).release <- nil
	wait(t, resSecond)
	b.next(t).release <- nil
	wait(t, resOther)
	for _, uid := range []string{"uid-web", "uid-db"} {
		if got := g.PodPulls(uid); len(got) != 0 {
			t.Errorf("PodPulls(%s) after every pull returned = %+v, want none", uid, got)
		}
	}
	if got := g.Pulls(); len(got) != 0 {
		t.Errorf("Pulls() after every pull returned = %+v, want none", got)
	}
}

// TestPullStatusRegistryCapAndSharing: a pull held by its registry's cap says so, and a caller
// that joins another pod's pull names that pod, in its status and to the observer; a caller
// that leaves because its pod was deleted is told to the observer.
func TestPullStatusRegistryCapAndSharing(t *testing.T) {
	obs := &recordingObserver{events: make(chan Event, 10)}
	g := New(Limits{MaxParallel: 5, PerRegistry: map[string]int{"example.com": 1}}, WithObserver(obs))
	tr := trace(g)
	b := newFakeBackend()
	first := newPull(t, "example.com/first", PriorityNormal, withPod("default", "a", "uid-a"))
	resFirst := goDo(t.Context(), g, first, b.pull(first.Image))
	running := b.next(t)
	held := newPull(t, "example.com/held", PriorityNormal, withPod("default", "b", "uid-b"))
	resHeld := goDo(t.Context(), g, held, b.pull(held.Image))
	tr.await(t, "queued", held.Image)
	joiner := newPull(t, "example.com/held", PriorityNormal, withPod("default", "c", "uid-c"))
	resJoiner := goDo(t.Context(), g, joiner, b.pull(joiner.Image))
	tr.await(t, "joined", joiner.Image)
	select {
	case e := <-obs.events:
		if e.Kind != EventJoined || e.Leader != klog.KRef("default", "b") || e.Pull.Pod != klog.KRef("default", "c") || e.Started {
			t.Errorf("observer got %+v, want c joining b's queued pull", e)
		}
	case <-time.After(testTimeout):
		t.Fatal("observer not told of the join")
	}
	got := g.PodPulls("uid-c")
	if len(got) != 1 || got[0].Waiting != WaitingRegistry || got[0].RegistryCap != 1 || got[0].Position != 1 ||
		!got[0].Shared || got[0].SharedWith != klog.KRef("default", "b") || got[0].Waiters != 2 {
		t.Errorf("PodPulls(uid-c) = %+v, want one pull held by the registry cap, shared with default/b", got)
	}
	g.PodDeleted("uid-c")
	wait(t, resJoiner)
	select {
	case e := <-obs.events:
		if e.Kind != EventPodDeleted || e.Pull.Pod != klog.KRef("default", "c") {
			t.Errorf("observer got %+v, want c's pod deleted", e)
		}
	case <-time.After(testTimeout):
		t.Fatal("observer not told of the deleted pod")
	}
	running.release <- nil
	wait(t, resFirst)
	if e := <-obs.events; e.Kind != EventFinished || e.Pull.Pod != klog.KRef("default", "a") || e.Err != nil {
		t.Errorf("observer got %+v, want a's pull finished", e)
	}
	b.next(t).release <- errors.New("registry says no")
	wait(t, resHeld)
	if e := <-obs.events; e.Kind != EventFinished || e.Pull.Pod != klog.KRef("default", "b") || e.Err == nil {
		t.Errorf("observer got %+v, want b's pull failed", e)
	}
}

type recordingObserver struct{ events chan Event }

func (o *recordingObserver) PullEvent(e Event) { o.events <- e }

// TestKeepBeforeCancel: a running pull whose every caller left (its pod deleted) is handed to
// keep before its backend call is cancelled, so that what containerd fetched can outlive the
// call; a queued pull that never ran, and a running pull another caller still waits for, are not.
func TestKeepBeforeCancel(t *testing.T) {
	kept := make(chan string, 4)
	var b *fakeBackend
	var running *backendCall
	g := New(Limits{MaxParallel: 1}, WithKeep(func(image string) {
		if running != nil && running.ctx.Err() != nil {
			t.Errorf("keep(%s) called after the backend call was cancelled", image)
		}
		kept <- image
	}))
	tr := trace(g)
	b = newFakeBackend()
	first := newPull(t, "example.com/first", PriorityNormal, withPod("default", "a", "uid-a"))
	resFirst := goDo(t.Context(), g, first, b.pull(first.Image))
	running = b.next(t)
	sharer := newPull(t, "example.com/first", PriorityNormal, withPod("default", "b", "uid-b"))
	resSharer := goDo(t.Context(), g, sharer, b.pull(sharer.Image))
	tr.await(t, "joined", sharer.Image)
	queued := newPull(t, "example.com/queued", PriorityNormal, withPod("default", "c", "uid-c"))
	resQueued := goDo(t.Context(), g, queued, b.pull(queued.Image))
	tr.await(t, "queued", queued.Image)

	g.PodDeleted("uid-c") // queued: nothing fetched
	wait(t, resQueued)
	g.PodDeleted("uid-a") // b still waits for the pull
	wait(t, resFirst)
	select {
	case image := <-kept:
		t.Fatalf("keep(%s) called while a pull nobody ran, or one still waited for, was left", image)
	default:
	}
	g.PodDeleted("uid-b")
	wait(t, resSharer)
	select {
	case image := <-kept:
		if image != first.Image {
			t.Errorf("kept %s, want %s", image, first.Image)
		}
	case <-time.After(testTimeout):
		t.Fatal("the running pull every caller left was not kept")
	}
	<-running.ctx.Done()
}
