package imagepull

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	testingclock "k8s.io/utils/clock/testing"
)

// tooMany is containerd's error, through the CRI, for a pull whose registry answered 429 to
// the resolver's HEAD; each image's own.
func tooMany(image string) error {
	ref := "r.io/" + image + ":1"
	return status.Errorf(codes.Unknown, `failed to pull and unpack image %q: failed to resolve reference %q: unexpected status from HEAD request to https://r.io/v2/%s/manifests/1: 429 Too Many Requests`, ref, ref, image)
}

// coolGovernor is a governor with cool-downs c and limits on a fake clock at t0, its metrics
// in a registry of their own.
func coolGovernor(t *testing.T, limits Limits, c CoolDown) (*Governor, *testingclock.FakeClock, *tracer, *prometheus.Registry) {
	t.Helper()
	fc := testingclock.NewFakeClock(t0)
	reg := prometheus.NewRegistry()
	g := New(limits, withClock(fc), WithCoolDown(c), WithRegisterer(reg))
	return g, fc, trace(g), reg
}

// statusOf is the status of the caller of image's pull (the first, when several).
func statusOf(t *testing.T, g *Governor, image string) PullStatus {
	t.Helper()
	for _, s := range g.Pulls() {
		if s.Image == image {
			return s
		}
	}
	t.Fatalf("no pull of %s in %+v", image, g.Pulls())
	return PullStatus{}
}

// within fails the test unless d is in [lo, hi].
func within(t *testing.T, what string, d, lo, hi time.Duration) {
	t.Helper()
	if d < lo || d > hi {
		t.Errorf("%s = %s, want within [%s, %s]", what, d, lo, hi)
	}
}

// tryAt moves the fake clock to the next try of image's registry, which the governor's timer
// waits for, and returns that moment.
func tryAt(t *testing.T, g *Governor, fc *testingclock.FakeClock, image string) time.Time {
	t.Helper()
	next := statusOf(t, g, image).NextTry
	if next.IsZero() || !next.After(fc.Now()) {
		t.Fatalf("next try of %s at %s, now %s", image, next, fc.Now())
	}
	if !fc.HasWaiters() {
		t.Fatal("the governor set no timer for the next try")
	}
	fc.SetTime(next)
	return next
}

// TestCoolDownHoldsRegistry: a pull refused with 429 waits in podgate's queue while its
// registry cools down, and so do the registry's new pulls; other registries' pulls start at
// once. When the cool-down ends, the refused pull is tried again within the same call, alone:
// the registry's other pull waits for its answer, and starts once it has pulled. Status and
// metrics say so throughout.
func TestCoolDownHoldsRegistry(t *testing.T) {
	g, fc, tr, reg := coolGovernor(t, Limits{}, CoolDown{InitialDelay: 4 * time.Second, MaxDelay: time.Minute, RetryFor: 5 * time.Minute})
	b := newFakeBackend()
	ctx := t.Context()
	a := newPull(t, "r.io/a:1", PriorityNormal)
	aDone := goDo(ctx, g, a, b.pull("a"))
	ca := b.next(t)
	cDone := goDo(ctx, g, newPull(t, "other.io/c:1", PriorityNormal), b.pull("c"))
	cc := b.next(t)

	fc.Step(10 * time.Millisecond)
	ca.release <- tooMany("a")
	tr.await(t, "pushed back", a.Image)
	pushedAt := fc.Now()
	bp := newPull(t, "r.io/b:1", PriorityNormal)
	bDone := goDo(ctx, g, bp, b.pull("b"))
	tr.await(t, "queued", bp.Image)
	dDone := goDo(ctx, g, newPull(t, "other.io/d:1", PriorityNormal), b.pull("d"))
	cd := b.next(t)
	if cd.image != "d" {
		t.Fatalf("backend pulls %s, want other.io's d at once", cd.image)
	}
	if s := g.Stats(); s.InFlight != 2 || s.Queued != 2 {
		t.Fatalf("governor %+v while r.io cools, want c and d in flight, a and b queued", s)
	}
	sa, sb := statusOf(t, g, a.Image), statusOf(t, g, bp.Image)
	for _, s := range []PullStatus{sa, sb} {
		if s.Waiting != WaitingCoolDown || !s.CoolingSince.Equal(pushedAt) || s.PushBackCode != 429 || s.Probing {
			t.Errorf("%s: %+v, want waiting for the cool-down since %s, 429", s.Image, s, pushedAt)
		}
		within(t, s.Image+"'s next try", s.NextTry.Sub(pushedAt), 3200*time.Millisecond, 4800*time.Millisecond)
	}
	if sa.PushBacks != 1 || !sa.HeldUntil.Equal(pushedAt.Add(5*time.Minute)) || sb.PushBacks != 0 || !sb.HeldUntil.Equal(pushedAt.Add(5*time.Minute)) {
		t.Errorf("a: %d push-backs, held until %s; b: %d, %s; want 1 and 0, both until %s", sa.PushBacks, sa.HeldUntil, sb.PushBacks, sb.HeldUntil, pushedAt.Add(5*time.Minute))
	}
	if v := testutil.ToFloat64(g.hm.pushBacks.WithLabelValues("other", "429")); v != 1 {
		t.Errorf("push-backs = %v, want 1", v)
	}
	checkCooling(t, reg, 1)

	tryAt(t, g, fc, a.Image)
	probe := b.next(t)
	if probe.image != "a" {
		t.Fatalf("the probe is %s, want a, queued before b", probe.image)
	}
	if s := g.Stats(); s.InFlight != 3 || s.Queued != 1 {
		t.Fatalf("governor %+v with the probe out, want b still queued", s)
	}
	if s := statusOf(t, g, bp.Image); !s.Probing || !s.NextTry.IsZero() || s.Waiting != WaitingCoolDown {
		t.Errorf("b while a probes: %+v, want waiting for the probe", s)
	}
	probe.release <- nil
	next := b.next(t)
	if next.image != "b" {
		t.Fatalf("after the probe pulled, backend pulls %s, want b", next.image)
	}
	next.release <- nil
	cc.release <- nil
	cd.release <- nil
	for name, ch := range map[string]<-chan result{"a": aDone, "b": bDone, "c": cDone, "d": dDone} {
		if r := wait(t, ch); r.err != nil || r.resp.GetImageRef() != "sha256:"+name {
			t.Errorf("%s: %v, %v", name, r.resp, r.err)
		}
	}
	if v := testutil.ToFloat64(g.hm.retries.WithLabelValues("other")); v != 1 {
		t.Errorf("retries = %v, want 1 (a's)", v)
	}
	if v := testutil.ToFloat64(g.hm.gaveUp.WithLabelValues("other")); v != 0 {
		t.Errorf("push-back failures = %v, want 0", v)
	}
	checkCooling(t, reg, 0)
}

// checkCooling checks podgate_image_pull_registry_cooling{registry="other"}.
func checkCooling(t *testing.T, reg *prometheus.Registry, want float64) {
	t.Helper()
	exp := fmt.Sprintf("# HELP podgate_image_pull_registry_cooling %s\n# TYPE podgate_image_pull_registry_cooling gauge\npodgate_image_pull_registry_cooling{registry=\"other\"} %v\n",
		"Registries in a cool-down after they pushed back (HTTP 429, or 503 with Retry-After): their pulls wait in podgate's queue. By registry host for the hosts in imagePulls.perRegistry or perRegistryRate (0 or 1), \"other\" for the rest (how many).", want)
	if err := testutil.GatherAndCompare(reg, strings.NewReader(exp), "podgate_image_pull_registry_cooling"); err != nil {
		t.Error(err)
	}
}

// TestCoolDownRetryBound: a registry that goes on refusing is asked again at the end of each
// cool-down, each longer than the last up to MaxDelay, until the next try would come after
// RetryFor from the first push-back: then the caller gets the registry's last error unchanged.
func TestCoolDownRetryBound(t *testing.T) {
	c := CoolDown{InitialDelay: time.Second, MaxDelay: 4 * time.Second, RetryFor: 20 * time.Second}
	g, fc, tr, _ := coolGovernor(t, Limits{}, c)
	b := newFakeBackend()
	a := newPull(t, "r.io/a:1", PriorityNormal)
	done := goDo(t.Context(), g, a, b.pull("a"))
	var first time.Time
	var lastErr error
	backOff := c.InitialDelay
	for attempt := 1; ; attempt++ {
		call := b.next(t)
		fc.Step(10 * time.Millisecond)
		if first.IsZero() {
			first = fc.Now()
		}
		lastErr = fmt.Errorf("attempt %d: %w", attempt, tooMany("a"))
		call.release <- lastErr
		if r, over := answerOrPushBack(t, done, tr, a.Image); over {
			if r.err != lastErr { //nolint:errorlint // the very error the backend returned
				t.Errorf("caller got %v, want the registry's last error unchanged: %v", r.err, lastErr)
			}
			if fc.Now().Sub(first) >= c.RetryFor || attempt < 4 {
				t.Errorf("gave up after %d attempts, %s after the first push-back; want ≥ 4 within %s", attempt, fc.Now().Sub(first), c.RetryFor)
			}
			if v := testutil.ToFloat64(g.hm.gaveUp.WithLabelValues("other")); v != 1 {
				t.Errorf("push-back failures = %v, want 1", v)
			}
			return
		}
		s := statusOf(t, g, a.Image)
		wantLo, wantHi := min(time.Duration(0.8*float64(backOff)), c.MaxDelay), min(time.Duration(1.2*float64(backOff)), c.MaxDelay)
		within(t, fmt.Sprintf("attempt %d's cool-down", attempt), s.NextTry.Sub(fc.Now()), wantLo, wantHi)
		if !s.NextTry.Before(first.Add(c.RetryFor)) {
			t.Fatalf("held for a try at %s, after the retry bound %s", s.NextTry, first.Add(c.RetryFor))
		}
		backOff = min(2*backOff, c.MaxDelay)
		tryAt(t, g, fc, a.Image)
	}
}

// answerOrPushBack waits for the caller's answer (over) or for the governor to put image's
// pull back in the queue.
func answerOrPushBack(t *testing.T, done <-chan result, tr *tracer, image string) (r result, over bool) {
	t.Helper()
	timeout := time.After(testTimeout)
	for {
		select {
		case r := <-done:
			return r, true
		case e := <-tr.events:
			if e == "pushed back "+image {
				return result{}, false
			}
		case <-timeout:
			t.Fatal("the caller got no answer, and the pull was not put back")
		}
	}
}

// TestCoolDownHeldPullGivesUp: a refused pull that waits behind its registry's other pulls
// while the registry goes on refusing them gets its own last error when its hold runs out,
// from the governor's timer, without another try.
func TestCoolDownHeldPullGivesUp(t *testing.T) {
	c := CoolDown{InitialDelay: 4 * time.Second, MaxDelay: 4 * time.Second, RetryFor: 6 * time.Second}
	g, fc, tr, _ := coolGovernor(t, Limits{}, c)
	b := newFakeBackend()
	ctx := t.Context()
	a, bp := newPull(t, "r.io/a:1", PriorityNormal), newPull(t, "r.io/b:1", PriorityNormal)
	aDone, bDone := goDo(ctx, g, a, b.pull("a")), goDo(ctx, g, bp, b.pull("b"))
	calls := map[string]*backendCall{}
	for range 2 {
		c := b.next(t)
		calls[c.image] = c
	}
	fc.Step(10 * time.Millisecond)
	calls["a"].release <- tooMany("a")
	tr.await(t, "pushed back", a.Image)
	bErr := tooMany("b")
	calls["b"].release <- bErr
	tr.await(t, "pushed back", bp.Image)
	heldUntil := statusOf(t, g, bp.Image).HeldUntil

	tryAt(t, g, fc, a.Image)
	probe := b.next(t)
	if probe.image != "a" {
		t.Fatalf("probe %s, want a (refused first)", probe.image)
	}
	aErr := tooMany("a")
	probe.release <- aErr
	// a's next try would come after its hold: it gets its error now.
	if r := wait(t, aDone); r.err != aErr { //nolint:errorlint // the very error the backend returned
		t.Errorf("a: %v, want its registry's error %v", r.err, aErr)
	}
	// b waits for the cool-down; its hold runs out first.
	if next := statusOf(t, g, bp.Image).NextTry; !next.After(heldUntil) {
		t.Fatalf("b's next try %s before its hold ends %s: not the case under test", next, heldUntil)
	}
	fc.SetTime(heldUntil)
	if r := wait(t, bDone); r.err != bErr { //nolint:errorlint // the very error the backend returned
		t.Errorf("b: %v, want its own last error %v", r.err, bErr)
	}
	b.idle(t)
	if s := g.Stats(); s.Queued != 0 || s.InFlight != 0 || s.Waiters != 0 {
		t.Errorf("governor %+v after both gave up, want empty", s)
	}
	if v := testutil.ToFloat64(g.hm.gaveUp.WithLabelValues("other")); v != 2 {
		t.Errorf("push-back failures = %v, want 2", v)
	}
}

// TestCoolDownHoldOver: a pull that never reached the registry, held for a cool-down that
// outlasts RetryFor, tries the registry once when its hold runs out (the registry's only try
// at that moment) and its caller gets the answer, a 429 included, without a retry: a registry
// that refuses for hours ends in its own error, not in pulls held for hours.
func TestCoolDownHoldOver(t *testing.T) {
	c := CoolDown{InitialDelay: time.Minute, MaxDelay: time.Hour, RetryFor: 5 * time.Second}
	g, fc, tr, _ := coolGovernor(t, Limits{}, c)
	b := newFakeBackend()
	ctx := t.Context()
	a := newPull(t, "r.io/a:1", PriorityNormal)
	aDone := goDo(ctx, g, a, b.pull("a"))
	call := b.next(t)
	fc.Step(10 * time.Millisecond)
	aErr := tooMany("a")
	call.release <- aErr
	if r := wait(t, aDone); r.err != aErr { //nolint:errorlint // the very error the backend returned
		t.Errorf("a: %v; want its error at once, the cool-down (≥ 48s) outlasting RetryFor", r.err)
	}
	fc.Step(time.Second)
	bp := newPull(t, "r.io/b:1", PriorityNormal)
	bDone := goDo(ctx, g, bp, b.pull("b"))
	tr.await(t, "queued", bp.Image)
	s := statusOf(t, g, bp.Image)
	if want := fc.Now().Add(c.RetryFor); !s.HeldUntil.Equal(want) || s.Waiting != WaitingCoolDown {
		t.Fatalf("b: %+v, want held for the cool-down until %s", s, want)
	}
	fc.SetTime(s.HeldUntil)
	try := b.next(t)
	if try.image != "b" {
		t.Fatalf("backend pulls %s, want b", try.image)
	}
	bErr := tooMany("b")
	try.release <- bErr
	if r := wait(t, bDone); r.err != bErr { //nolint:errorlint // the very error the backend returned
		t.Errorf("b: %v, want the registry's answer %v", r.err, bErr)
	}
	b.idle(t)
}

// TestPushBackOnlyHolds: with cool-downs on, a pull that fails for any other reason, a 503
// without Retry-After among them, fails at once and holds nothing back; with them off, a 429
// fails at once too.
func TestPushBackOnlyHolds(t *testing.T) {
	other := map[string]error{
		"404": status.Error(codes.NotFound, "failed to pull and unpack image \"r.io/a:1\": r.io/a:1: not found"),
		"503": status.Error(codes.Unknown, "unexpected status from HEAD request to https://r.io/v2/a/manifests/1: 503 Service Unavailable"),
		"500": status.Error(codes.Unknown, "unexpected status from HEAD request to https://r.io/v2/a/manifests/1: 500 Internal Server Error"),
	}
	for name, err := range other {
		t.Run(name, func(t *testing.T) {
			g, _, _, _ := coolGovernor(t, Limits{}, CoolDown{InitialDelay: time.Minute, MaxDelay: time.Hour, RetryFor: time.Hour})
			checkFailsAtOnce(t, g, err)
		})
	}
	t.Run("cool-downs off", func(t *testing.T) {
		checkFailsAtOnce(t, New(Limits{}), tooMany("a"))
	})
}

// checkFailsAtOnce: a pull of r.io failing with err gives its caller err, and the next pull of
// r.io starts at once.
func checkFailsAtOnce(t *testing.T, g *Governor, err error) {
	t.Helper()
	b := newFakeBackend()
	done := goDo(t.Context(), g, newPull(t, "r.io/a:1", PriorityNormal), b.pull("a"))
	b.next(t).release <- err
	if r := wait(t, done); r.err != err { //nolint:errorlint // the very error the backend returned
		t.Errorf("caller got %v, want %v", r.err, err)
	}
	next := goDo(t.Context(), g, newPull(t, "r.io/b:1", PriorityNormal), b.pull("b"))
	b.next(t).release <- nil
	if r := wait(t, next); r.err != nil {
		t.Error(r.err)
	}
}

// TestConcurrentPushBacks: pulls under way when the registry first refuses are refused by the
// same limit: one cool-down of InitialDelay, not one per pull nor doubled by each; then one
// pull tries at a time, each try another pull's, and the registry's answer lets the others go.
// No pull is tried more than twice while the limit lasts.
func TestConcurrentPushBacks(t *testing.T) {
	g, fc, tr, _ := coolGovernor(t, Limits{}, CoolDown{InitialDelay: 2 * time.Second, MaxDelay: time.Minute, RetryFor: 5 * time.Minute})
	b := newFakeBackend()
	images := []string{"a", "b", "c"}
	done := map[string]<-chan result{}
	calls := map[string]*backendCall{}
	for _, name := range images {
		done[name] = goDo(t.Context(), g, newPull(t, "r.io/"+name+":1", PriorityNormal), b.pull(name))
		c := b.next(t)
		calls[c.image] = c
	}
	tries := map[string]int{"a": 1, "b": 1, "c": 1}
	fc.Step(10 * time.Millisecond)
	for _, name := range images {
		calls[name].release <- tooMany(name)
		tr.await(t, "pushed back", "r.io/"+name+":1")
	}
	within(t, "the cool-down", statusOf(t, g, "r.io/c:1").NextTry.Sub(fc.Now()), 1600*time.Millisecond, 2400*time.Millisecond)

	var probes []string
	for _, answer := range []error{tooMany("x"), nil} {
		tryAt(t, g, fc, "r.io/a:1")
		p := b.next(t)
		tries[p.image]++
		probes = append(probes, p.image)
		if s := g.Stats(); s.InFlight != 1 {
			t.Fatalf("%d pulls of the cooling registry in flight, want the probe alone", s.InFlight)
		}
		fc.Step(10 * time.Millisecond)
		p.release <- answer
		if answer != nil {
			tr.await(t, "pushed back", "r.io/"+p.image+":1")
		}
	}
	if probes[0] != "a" || probes[1] != "b" {
		t.Errorf("probes %v, want a (refused first) then b: each try another pull's", probes)
	}
	// b pulled: the registry answers again, a and c go at once.
	for range 2 {
		c := b.next(t)
		tries[c.image]++
		c.release <- nil
	}
	for name, ch := range done {
		if r := wait(t, ch); r.err != nil {
			t.Errorf("%s: %v", name, r.err)
		}
	}
	if tries["a"] != 3 || tries["b"] != 2 || tries["c"] != 2 {
		t.Errorf("backend calls per image %v, want a: 3 (the last after the limit), b: 2, c: 2", tries)
	}
}

// TestRegistryRate: a registry with a budget of 2 pulls per 10 s in bursts of 1 starts one
// pull, holds the next for 5 s (Waiting rate, with the moment of the next token), and other
// registries' pulls go meanwhile; the registry has a metric label of its own.
func TestRegistryRate(t *testing.T) {
	fc := testingclock.NewFakeClock(t0)
	g := New(Limits{PerRegistryRate: map[string]Rate{"r.io": {Pulls: 2, Interval: 10 * time.Second, Burst: 1}}}, withClock(fc))
	tr := trace(g)
	b := newFakeBackend()
	ctx := t.Context()
	first := goDo(ctx, g, newPull(t, "r.io/a:1", PriorityNormal), b.pull("a"))
	b.next(t).release <- nil
	if r := wait(t, first); r.err != nil {
		t.Fatal(r.err)
	}
	second := newPull(t, "r.io/b:1", PriorityNormal)
	secondDone := goDo(ctx, g, second, b.pull("b"))
	tr.await(t, "queued", second.Image)
	other := goDo(ctx, g, newPull(t, "other.io/c:1", PriorityNormal), b.pull("c"))
	c := b.next(t)
	if c.image != "c" {
		t.Fatalf("backend pulls %s, want other.io's c", c.image)
	}
	c.release <- nil
	if r := wait(t, other); r.err != nil {
		t.Fatal(r.err)
	}
	s := statusOf(t, g, second.Image)
	if s.Waiting != WaitingRate || !s.NextTry.Equal(t0.Add(5*time.Second)) || s.Rate.Pulls != 2 {
		t.Fatalf("b: %+v, want waiting for r.io's budget until %s", s, t0.Add(5*time.Second))
	}
	if note := queuedNote(pull{PullStatus: s}, fc.Now()); !strings.Contains(note, "the request budget of registry r.io is spent (imagePulls.perRegistryRate: 2 pulls per 10s, bursts of 1); next pull at 2026-12-08T10:00:05Z") {
		t.Errorf("PullQueued note %q does not name the budget and the next token", note)
	}
	if got := g.RegistryLabel("r.io"); got != "r.io" {
		t.Errorf("r.io's metric label %q, want its own", got)
	}
	fc.SetTime(s.NextTry)
	b.next(t).release <- nil
	if r := wait(t, secondDone); r.err != nil {
		t.Fatal(r.err)
	}
}

// TestCoolDownCallerLeaves: a caller that gives up while its pull waits for a cool-down
// leaves at once, and the pull with it; the registry's next pull is the probe.
func TestCoolDownCallerLeaves(t *testing.T) {
	g, fc, tr, _ := coolGovernor(t, Limits{}, CoolDown{InitialDelay: time.Second, MaxDelay: time.Minute, RetryFor: time.Hour})
	b := newFakeBackend()
	ctx, cancel := context.WithCancel(t.Context())
	a := newPull(t, "r.io/a:1", PriorityNormal)
	aDone := goDo(ctx, g, a, b.pull("a"))
	call := b.next(t)
	fc.Step(10 * time.Millisecond)
	call.release <- tooMany("a")
	tr.await(t, "pushed back", a.Image)
	cancel()
	if r := wait(t, aDone); !errors.Is(r.err, context.Canceled) {
		t.Fatalf("a: %v, want Canceled", r.err)
	}
	bp := newPull(t, "r.io/b:1", PriorityNormal)
	bDone := goDo(t.Context(), g, bp, b.pull("b"))
	tr.await(t, "queued", bp.Image)
	tryAt(t, g, fc, bp.Image)
	if c := b.next(t); c.image != "b" {
		t.Fatalf("backend pulls %s, want b", c.image)
	} else {
		c.release <- nil
	}
	if r := wait(t, bDone); r.err != nil {
		t.Fatal(r.err)
	}
	b.idle(t)
}

// TestCoolDownHoldsProfilePulls: a security profile's pull waits for the cool-down of its
// reference's registry as an image pull does, is told so (Waiting cool-down), and when the
// probe has pulled, goes; a profile pull the registry refuses is tried again within its call.
func TestCoolDownHoldsProfilePulls(t *testing.T) {
	g, fc, tr, _ := coolGovernor(t, Limits{}, CoolDown{InitialDelay: 2 * time.Second, MaxDelay: time.Minute, RetryFor: 5 * time.Minute})
	b := newFakeBackend()
	ctx := t.Context()
	a := newPull(t, "r.io/a:1", PriorityNormal)
	aDone := goDo(ctx, g, a, b.pull("a"))
	call := b.next(t)
	fc.Step(10 * time.Millisecond)
	call.release <- tooMany("a")
	tr.await(t, "pushed back", a.Image)

	const ref = "r.io/seccomp@sha256:b5b2b2c507a0944348e0303114d8d93aaaa081732b86451d9bce1f432a537bc7"
	p, err := NewProfilePull(&ProfileRequest{Image: &runtimeapi.ImageSpec{Image: ref}})
	if err != nil {
		t.Fatal(err)
	}
	profileCalls := 0
	profileDone := make(chan error, 1)
	go func() {
		_, err := g.DoProfile(ctx, p, func(ctx context.Context) ([]byte, error) {
			profileCalls++ // one call at a time: the governor runs a flight's calls in turn
			if profileCalls == 1 {
				return nil, tooMany("seccomp")
			}
			return []byte{}, nil
		})
		profileDone <- err
	}()
	tr.await(t, "queued", ref)
	if s := statusOf(t, g, ref); s.Waiting != WaitingCoolDown || s.Kind != KindSecurityProfile {
		t.Fatalf("the profile pull: %+v, want it held for r.io's cool-down", s)
	}
	tryAt(t, g, fc, a.Image)
	probe := b.next(t)
	probe.release <- nil // a's retry pulls: the registry answers again
	if r := wait(t, aDone); r.err != nil {
		t.Fatal(r.err)
	}
	// The profile pull went once the registry answered; refused, it waits for the next try.
	tr.await(t, "pushed back", ref)
	tryAt(t, g, fc, ref)
	select {
	case err := <-profileDone:
		if err != nil || profileCalls != 2 {
			t.Errorf("profile pull: %v after %d calls, want success on the second", err, profileCalls)
		}
	case <-time.After(testTimeout):
		t.Fatal("the profile pull got no answer")
	}
}

// scrapingRegisterer collects every collector in a goroutine of its own the moment it is
// registered, as a scrape that comes right then would.
type scrapingRegisterer struct {
	*prometheus.Registry
	scrapes *sync.WaitGroup
}

func (r scrapingRegisterer) MustRegister(cs ...prometheus.Collector) {
	r.Registry.MustRegister(cs...)
	for _, c := range cs {
		r.scrapes.Go(func() {
			ch := make(chan prometheus.Metric)
			go func() { c.Collect(ch); close(ch) }()
			for range ch {
			}
		})
	}
}

// TestMetricsScrapedWhileBuilt: a scrape may come as soon as the governor's metrics are
// registered, so New registers them once every option is applied. Registered by an option,
// the cool-downs collector read what the next options were still writing: the race detector
// reports it (the agent's tests scrape while the agent starts).
func TestMetricsScrapedWhileBuilt(t *testing.T) {
	reg := scrapingRegisterer{prometheus.NewRegistry(), &sync.WaitGroup{}}
	New(Limits{MaxParallel: 1, PerRegistry: map[string]int{"r.io": 1}, PerRegistryRate: map[string]Rate{"r.io": {Pulls: 1, Interval: time.Second, Burst: 1}}},
		WithRegisterer(reg), WithCoolDown(CoolDown{InitialDelay: time.Second, MaxDelay: time.Minute, RetryFor: time.Minute}))
	reg.scrapes.Wait()
	if n := testutil.CollectAndCount(reg, "podgate_image_pull_registry_cooling"); n != 2 {
		t.Errorf("podgate_image_pull_registry_cooling has %d series, want 2 (r.io, other)", n)
	}
}
