package imagepull

import (
	"reflect"
	"sync"
	"testing"
	"time"
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

	want := []PodPull{
		{Image: first.Image, Started: true, Since: t0.Add(time.Second)},
		{Image: second.Image, Started: false, Since: t0.Add(2 * time.Second)},
	}
	if got := g.PodPulls("uid-web"); !reflect.DeepEqual(got, want) {
		t.Errorf("PodPulls(uid-web) = %+v, want %+v", got, want)
	}
	if got := g.PodPulls("uid-none"); len(got) != 0 {
		t.Errorf("PodPulls of a pod without pulls = %+v, want none", got)
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
}
