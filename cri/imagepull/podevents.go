package imagepull

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/podgate/podgate/cri/imagepull/progress"
)

// Reasons of the pull Events.
const (
	// ReasonPullQueued: the pull waits in podgate's queue (which cap, its place).
	ReasonPullQueued = "PullQueued"
	// ReasonPullProgress: how far the running pull has got, and how it ended.
	ReasonPullProgress = "PullProgress"
	// ReasonPullShared: the pull shares another pod's pull of the image.
	ReasonPullShared = "PullShared"
	// ReasonPullCancelled: the pull was dropped because its pod was deleted.
	ReasonPullCancelled = "PullCancelled"
	// ReasonPullStalled: podgate cancelled the pull because its rate stayed below
	// imagePulls.stall.minBytesPerSecond over imagePulls.stall.window.
	ReasonPullStalled = "PullStalled"
	// ReasonPullThrottled: the pull waits in podgate's queue for its registry's cool-down
	// (the registry pushed back: which registry, since when, the next try).
	ReasonPullThrottled = "PullThrottled"
)

// PodRef is the pod an Event is about.
type PodRef struct {
	Namespace, Name string
	UID             types.UID
}

// EventSink writes pod Events (agent/kube's EventRecorder, adapted by the agent): eventType
// corev1.EventTypeNormal or Warning, reason a short CamelCase word, action what podgate did
// or is doing. It must not block.
type EventSink interface {
	Eventf(pod PodRef, eventType, reason, action, noteFormat string, args ...any)
}

// pullEventsPeriod is how often the pulls are looked at for Events: the thresholds are seconds.
const pullEventsPeriod = time.Second

// pullEvents tells pods, through Events, what podgate's pull governor does with their pulls:
// a pull that waits for a slot longer than waitAfter (why, its place, how many run); a pull
// that runs longer than progressAfter (bytes done of total, rate, time so far), again every
// progressInterval and once more when it ends; a pull shared with another pod's; a pull
// cancelled because its pod is gone.
type pullEvents struct {
	// tracker is the pulls' progress; nil when pull progress is off.
	tracker  *progress.Tracker
	recorder EventSink
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
	kind  Kind
}

type toldPull struct {
	queued bool
	// throttled is 1 + the push-backs of the pull when its pod was last told of its
	// registry's cool-down; 0: not told.
	throttled    int
	lastProgress time.Time
	seen         bool
}

var _ Observer = (*pullEvents)(nil)

func newPullEvents(t *progress.Tracker, rec EventSink, waitAfter, progressAfter, progressInterval time.Duration) *pullEvents {
	return &pullEvents{
		tracker: t, recorder: rec, now: time.Now,
		waitAfter: waitAfter, progressAfter: progressAfter, progressInterval: progressInterval,
		told: map[pullCaller]*toldPull{}, progressed: map[pullCaller]time.Time{},
	}
}

func podOf(p Pull) PodRef {
	return PodRef{Namespace: p.Pod.Namespace, Name: p.Pod.Name, UID: types.UID(p.PodUID)}
}

// PullEvent implements Observer.
func (e *pullEvents) PullEvent(ev Event) {
	pod := podOf(ev.Pull)
	switch ev.Kind {
	case EventJoined:
		with := "a pull without a pod"
		if ev.Leader.Name != "" {
			with = "the pull of pod " + ev.Leader.String()
		}
		state := "waiting in podgate's queue"
		if ev.Started {
			state = "already running"
		}
		e.recorder.Eventf(pod, corev1.EventTypeNormal, ReasonPullShared, "Waiting",
			"%s %q is pulled once for the pods that need it: this pod shares %s, %s", ev.Pull.Kind.title(), ev.Pull.Image, with, state)
	case EventPodDeleted:
		where := "while it waited in podgate's queue; it never reached the runtime"
		if ev.Started {
			where = "while the runtime pulled it; the runtime's pull is cancelled unless another pod waits for it"
		}
		e.recorder.Eventf(pod, corev1.EventTypeWarning, ReasonPullCancelled, "Cancelled",
			"Pull of %s %q cancelled: the pod was deleted %s", ev.Pull.Kind.noun(), ev.Pull.Image, where)
	case EventFinished:
		if stall := (*stallError)(nil); errors.As(ev.Err, &stall) {
			e.recorder.Eventf(pod, corev1.EventTypeWarning, ReasonPullStalled, "Cancelled",
				"Pull of image %q stalled: %s from registry %s over the last %s, below the minimum of %s (imagePulls.stall.minBytesPerSecond); podgate cancelled it, the kubelet retries it with back-off",
				stall.image, rateString(stall.rate), stall.registry, progress.ShortDuration(stall.rule.Window), rateString(float64(stall.rule.MinBytesPerSecond)))
		}
		e.finished(ev, pod)
	}
}

// finished tells a pod that was told of its pull's progress how the pull ended.
func (e *pullEvents) finished(ev Event, pod PodRef) {
	e.mu.Lock()
	var since time.Time
	var told bool
	for c, at := range e.progressed {
		if c.pod == pod.UID && c.image == ev.Pull.Image && c.kind == ev.Pull.Kind {
			since, told = at, true
			delete(e.progressed, c)
		}
	}
	e.mu.Unlock()
	if !told || ev.Err != nil {
		return // the kubelet reports a failed pull itself
	}
	var p progress.Progress
	if e.tracker != nil && ev.Pull.Kind == KindImage {
		p, _ = e.tracker.Progress(ev.Pull.Image)
	}
	took := e.now().Sub(since)
	if p.Known() {
		e.recorder.Eventf(pod, corev1.EventTypeNormal, ReasonPullProgress, "Pulled",
			"Pulled image %q: %s of %s (100%%) in %s", ev.Pull.Image, progress.Bytes(p.Total), progress.Bytes(p.Total), took.Round(time.Second))
		return
	}
	e.recorder.Eventf(pod, corev1.EventTypeNormal, ReasonPullProgress, "Pulled", "Pulled %s %q in %s", ev.Pull.Kind.noun(), ev.Pull.Image, took.Round(time.Second))
}

// run looks at the pulls of v every second until ctx ends.
func (e *pullEvents) run(ctx context.Context, v *view) {
	every(ctx, pullEventsPeriod, func() { e.look(v) })
}

// look reports what the thresholds call for about the pulls of v and forgets the pulls that
// are gone.
func (e *pullEvents) look(v *view) {
	now := e.now()
	for _, t := range e.told {
		t.seen = false
	}
	for _, p := range v.pulls() {
		if p.PodUID == "" {
			continue
		}
		c := pullCaller{pod: types.UID(p.PodUID), image: p.Image, since: p.Since, kind: p.Kind}
		t := e.told[c]
		if t == nil {
			t = &toldPull{}
			e.told[c] = t
		}
		t.seen = true
		pod := PodRef{Namespace: p.Pod.Namespace, Name: p.Pod.Name, UID: c.pod}
		switch {
		case p.Started.IsZero() && p.Waiting == WaitingCoolDown:
			// At once, and again each time the pull's own try is refused.
			if t.throttled != 1+p.PushBacks {
				t.throttled = 1 + p.PushBacks
				e.recorder.Eventf(pod, corev1.EventTypeNormal, ReasonPullThrottled, "Waiting", "%s", throttledNote(p, now))
			}
		case p.Started.IsZero():
			if !t.queued && now.Sub(p.Since) >= e.waitAfter {
				t.queued = true
				e.recorder.Eventf(pod, corev1.EventTypeNormal, ReasonPullQueued, "Waiting", "%s", queuedNote(p, now))
			}
		case now.Sub(p.Started) >= e.progressAfter && now.Sub(t.lastProgress) >= e.progressInterval:
			t.lastProgress = now
			e.mu.Lock()
			if _, ok := e.progressed[c]; !ok {
				e.progressed[c] = p.Started
			}
			e.mu.Unlock()
			e.recorder.Eventf(pod, corev1.EventTypeNormal, ReasonPullProgress, "Pulling", "%s", progressNote(p, now, e.tracker != nil))
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
	case WaitingNode:
		why = fmt.Sprintf("the node's cap is reached (imagePulls.maxParallel %d, %d running)", p.MaxParallel, p.InFlight)
	case WaitingRegistry:
		why = fmt.Sprintf("the cap of registry %s is reached (imagePulls.perRegistry %d, %d running; %d on the node)",
			p.Registry, p.RegistryCap, p.RegistryInFlight, p.InFlight)
	case WaitingRate:
		why = fmt.Sprintf("the request budget of registry %s is spent (imagePulls.perRegistryRate: %d pulls per %s, bursts of %d); next pull at %s",
			p.Registry, p.Rate.Pulls, p.Rate.Interval, p.Rate.Burst, stamp(p.NextTry))
	default:
		why = fmt.Sprintf("%d pulls running", p.InFlight)
	}
	return fmt.Sprintf("Pulling %s %q waits in podgate's queue for %s: %s; place %d of %d waiting (priority %s)",
		p.Kind.noun(), p.Image, p.waited(now).Round(time.Second), why, p.Position, p.Queued, p.Priority)
}

// progressNote says how far a running pull has got.
func progressNote(p pull, now time.Time, tracked bool) string {
	took := now.Sub(p.Started).Round(time.Second)
	switch {
	case p.Kind != KindImage:
		return fmt.Sprintf("Pulling %s %q: %s so far", p.Kind.noun(), p.Image, took)
	case p.progress.Known():
		pct := 100 * float64(p.progress.Done) / float64(p.progress.Total)
		return fmt.Sprintf("Pulling image %q: %s of %s (%.0f%%), %s/s, %s so far", p.Image,
			progress.Bytes(p.progress.Done), progress.Bytes(p.progress.Total), pct, progress.Bytes(p.progress.Rate), took)
	case tracked:
		return fmt.Sprintf("Pulling image %q: %s so far; its size is not known yet (no manifest from the registry)", p.Image, took)
	default:
		return fmt.Sprintf("Pulling image %q: %s so far (pull progress is off: imagePulls.containerdAddress)", p.Image, took)
	}
}

// throttledNote says why a pull waits for its registry's cool-down: which registry answered
// what since when, when it is tried next, and until when podgate holds the pull.
func throttledNote(p pull, now time.Time) string {
	next := "another pod's pull is trying the registry now"
	if !p.NextTry.IsZero() {
		next = fmt.Sprintf("next try at %s (in %s)", stamp(p.NextTry), max(0, p.NextTry.Sub(now)).Round(time.Second))
	}
	own := ""
	if p.PushBacks > 0 {
		own = "; the registry refused this pull once"
		if p.PushBacks > 1 {
			own = fmt.Sprintf("; the registry refused this pull %d times", p.PushBacks)
		}
	}
	return fmt.Sprintf("Pulling %s %q waits in podgate's queue: registry %s pushed back (%s), cooling down since %s; %s%s; podgate holds the pull until %s at most (imagePulls.coolDown.retryFor), then the registry's own error goes to the kubelet",
		p.Kind.noun(), p.Image, p.Registry, pushBackStatus(p.PushBackCode), stamp(p.CoolingSince), next, own, stamp(p.HeldUntil))
}

// stamp writes a moment of a pull's note, in UTC to the second.
func stamp(t time.Time) string { return t.UTC().Format(time.RFC3339) }
