package agent

import (
	"context"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/podgate/podgate/agent/kube"
	"github.com/podgate/podgate/cri/imagepull"
	"github.com/podgate/podgate/cri/imagepull/progress"
)

// Reasons of the pull Events.
const (
	reasonPullQueued    = "PullQueued"
	reasonPullProgress  = "PullProgress"
	reasonPullShared    = "PullShared"
	reasonPullCancelled = "PullCancelled"
)

// pullEventsPeriod is how often the pulls are looked at for Events: the thresholds are seconds.
const pullEventsPeriod = time.Second

// pullEvents tells pods, through Events, what podgate's pull governor does with their pulls:
// a pull that waits for a slot longer than waitAfter (why, its place, how many run); a pull
// that runs longer than progressAfter (bytes done of total, rate, time so far), again every
// progressInterval and once more when it ends; a pull shared with another pod's; a pull
// cancelled because its pod is gone.
type pullEvents struct {
	view     *pullView
	recorder *kube.EventRecorder
	now      func() time.Time

	waitAfter, progressAfter, progressInterval time.Duration

	// told is what each caller's pod was told, by caller; only Run's goroutine uses it.
	told map[pullCaller]*toldPull
	mu   sync.Mutex
	// progressed holds the callers told of progress, with their pull's start, for the final
	// Event.
	progressed map[pullCaller]time.Time
}

// pullCaller identifies one caller's pull.
type pullCaller struct {
	pod   types.UID
	image string
	since time.Time
}

type toldPull struct {
	queued       bool
	lastProgress time.Time
	seen         bool
}

var _ imagepull.Observer = (*pullEvents)(nil)

func newPullEvents(view *pullView, rec *kube.EventRecorder, waitAfter, progressAfter, progressInterval time.Duration) *pullEvents {
	return &pullEvents{
		view: view, recorder: rec, now: time.Now,
		waitAfter: waitAfter, progressAfter: progressAfter, progressInterval: progressInterval,
		told: map[pullCaller]*toldPull{}, progressed: map[pullCaller]time.Time{},
	}
}

func podOf(p imagepull.Pull) kube.PodRef {
	return kube.PodRef{Namespace: p.Pod.Namespace, Name: p.Pod.Name, UID: types.UID(p.PodUID)}
}

// PullEvent implements imagepull.Observer.
func (e *pullEvents) PullEvent(ev imagepull.Event) {
	pod := podOf(ev.Pull)
	switch ev.Kind {
	case imagepull.EventJoined:
		with := "a pull without a pod"
		if ev.Leader.Name != "" {
			with = "the pull of pod " + ev.Leader.String()
		}
		state := "waiting in podgate's queue"
		if ev.Started {
			state = "already running"
		}
		e.recorder.Eventf(pod, corev1.EventTypeNormal, reasonPullShared, "Waiting",
			"Image %q is pulled once for the pods that need it: this pod shares %s, %s", ev.Pull.Image, with, state)
	case imagepull.EventPodDeleted:
		where := "while it waited in podgate's queue; it never reached the runtime"
		if ev.Started {
			where = "while the runtime pulled it; the runtime's pull is cancelled unless another pod waits for it"
		}
		e.recorder.Eventf(pod, corev1.EventTypeWarning, reasonPullCancelled, "Cancelled",
			"Pull of image %q cancelled: the pod was deleted %s", ev.Pull.Image, where)
	case imagepull.EventFinished:
		e.finished(ev, pod)
	}
}

// finished tells a pod that was told of its pull's progress how the pull ended.
func (e *pullEvents) finished(ev imagepull.Event, pod kube.PodRef) {
	e.mu.Lock()
	var since time.Time
	var told bool
	for c, at := range e.progressed {
		if c.pod == pod.UID && c.image == ev.Pull.Image {
			since, told = at, true
			delete(e.progressed, c)
		}
	}
	e.mu.Unlock()
	if !told || ev.Err != nil {
		return // the kubelet reports a failed pull itself
	}
	var p progress.Progress
	if e.view.progress != nil {
		p, _ = e.view.progress.Progress(ev.Pull.Image)
	}
	took := e.now().Sub(since)
	if p.Known() {
		e.recorder.Eventf(pod, corev1.EventTypeNormal, reasonPullProgress, "Pulled",
			"Pulled image %q: %s of %s (100%%) in %s", ev.Pull.Image, bytesOf(p.Total), bytesOf(p.Total), took.Round(time.Second))
		return
	}
	e.recorder.Eventf(pod, corev1.EventTypeNormal, reasonPullProgress, "Pulled", "Pulled image %q in %s", ev.Pull.Image, took.Round(time.Second))
}

// run looks at the pulls every second until ctx ends.
func (e *pullEvents) run(ctx context.Context) {
	tick := time.NewTicker(pullEventsPeriod)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			e.look()
		}
	}
}

// look reports what the thresholds call for and forgets the pulls that are gone.
func (e *pullEvents) look() {
	now := e.now()
	for _, t := range e.told {
		t.seen = false
	}
	for _, p := range e.view.pulls() {
		if p.PodUID == "" {
			continue
		}
		c := pullCaller{pod: types.UID(p.PodUID), image: p.Image, since: p.Since}
		t := e.told[c]
		if t == nil {
			t = &toldPull{}
			e.told[c] = t
		}
		t.seen = true
		pod := kube.PodRef{Namespace: p.Pod.Namespace, Name: p.Pod.Name, UID: c.pod}
		switch {
		case p.Started.IsZero():
			if !t.queued && now.Sub(p.Since) >= e.waitAfter {
				t.queued = true
				e.recorder.Eventf(pod, corev1.EventTypeNormal, reasonPullQueued, "Waiting", "%s", queuedNote(p, now))
			}
		case now.Sub(p.Started) >= e.progressAfter && now.Sub(t.lastProgress) >= e.progressInterval:
			t.lastProgress = now
			e.mu.Lock()
			if _, ok := e.progressed[c]; !ok {
				e.progressed[c] = p.Started
			}
			e.mu.Unlock()
			e.recorder.Eventf(pod, corev1.EventTypeNormal, reasonPullProgress, "Pulling", "%s", progressNote(p, now, e.view.progress != nil))
		}
	}
	for c, t := range e.told {
		if !t.seen {
			// Gone without a result (its caller gave up, its pod was deleted): nothing more to
			// say of it.
			delete(e.told, c)
			e.mu.Lock()
			delete(e.progressed, c)
			e.mu.Unlock()
		}
	}
}

// queuedNote says why a pull waits: which cap, its place, what runs.
func queuedNote(p pull, now time.Time) string {
	var why string
	switch p.Waiting {
	case imagepull.WaitingNode:
		why = fmt.Sprintf("the node's cap is reached (imagePulls.maxParallel %d, %d running)", p.MaxParallel, p.InFlight)
	case imagepull.WaitingRegistry:
		why = fmt.Sprintf("the cap of registry %s is reached (imagePulls.perRegistry %d, %d running; %d on the node)",
			p.Registry, p.RegistryCap, p.RegistryInFlight, p.InFlight)
	default:
		why = fmt.Sprintf("%d pulls running", p.InFlight)
	}
	return fmt.Sprintf("Pulling image %q waits in podgate's queue for %s: %s; place %d of %d waiting (priority %s)",
		p.Image, p.waited(now).Round(time.Second), why, p.Position, p.Queued, p.Priority)
}

// progressNote says how far a running pull has got.
func progressNote(p pull, now time.Time, tracked bool) string {
	took := now.Sub(p.Started).Round(time.Second)
	switch {
	case p.progress.Known():
		pct := 100 * float64(p.progress.Done) / float64(p.progress.Total)
		return fmt.Sprintf("Pulling image %q: %s of %s (%.0f%%), %s/s, %s so far", p.Image,
			bytesOf(p.progress.Done), bytesOf(p.progress.Total), pct, bytesOf(int64(p.progress.Rate)), took)
	case tracked:
		return fmt.Sprintf("Pulling image %q: %s so far; its size is not known yet (no manifest from the registry)", p.Image, took)
	default:
		return fmt.Sprintf("Pulling image %q: %s so far (pull progress is off: imagePulls.containerdAddress)", p.Image, took)
	}
}

// bytesOf writes n bytes in binary units, as kubectl and crictl do.
func bytesOf(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
