package imagepull

import (
	"testing"
	"time"
)

// fixedRand returns r as the jitter's random number.
func fixedRand(r float64) func() float64 { return func() float64 { return r } }

var t0 = time.Date(2026, 12, 8, 10, 0, 0, 0, time.UTC)

// TestCoolDownBackOff: each push-back of a pull sent after the last one doubles the
// back-off, from InitialDelay up to MaxDelay; the jitter spreads each over ±20 %, and the cap
// holds whatever the jitter.
func TestCoolDownBackOff(t *testing.T) {
	c := CoolDown{InitialDelay: time.Second, MaxDelay: 10 * time.Second, RetryFor: time.Hour}
	for _, tt := range []struct {
		name string
		rand float64
		want []time.Duration // each cool-down, push-back by push-back
	}{
		{"no jitter", 0.5, []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 10 * time.Second, 10 * time.Second}},
		{"least", 0, []time.Duration{800 * time.Millisecond, 1600 * time.Millisecond, 3200 * time.Millisecond, 6400 * time.Millisecond, 8 * time.Second, 8 * time.Second}},
		{"more, capped", 0.75, []time.Duration{1100 * time.Millisecond, 2200 * time.Millisecond, 4400 * time.Millisecond, 8800 * time.Millisecond, 10 * time.Second, 10 * time.Second}},
		{"most, capped", 0.999999, []time.Duration{1199999600 * time.Nanosecond, 2399999200 * time.Nanosecond, 4799998400 * time.Nanosecond, 9599996800 * time.Nanosecond, 10 * time.Second, 10 * time.Second}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cd := newCoolDowns(c, fixedRand(tt.rand))
			now := t0
			for i, want := range tt.want {
				// The pull that tries the registry starts when the cool-down ends.
				started := now
				if !cd.mayStart("r.io", false, now) {
					t.Fatalf("push-back %d: a pull may not start at the end of the cool-down", i)
				}
				probe := cd.started("r.io", started)
				if i > 0 && probe == 0 {
					t.Errorf("push-back %d: the pull after the cool-down is not the probe", i)
				}
				now = now.Add(50 * time.Millisecond) // the registry's answer
				until := cd.pushedBack("r.io", started, now, pushBack{code: 429}, probe)
				if got := until.Sub(now); got.Round(100*time.Nanosecond) != want {
					t.Errorf("push-back %d: cool-down of %s, want %s", i, got, want)
				}
				if cd.mayStart("r.io", false, until.Add(-time.Nanosecond)) {
					t.Errorf("push-back %d: a pull may start before the cool-down ends", i)
				}
				now = until
			}
		})
	}
}

// TestCoolDownRetryAfter: a Retry-After longer than the back-off is waited out, without jitter,
// up to MaxDelay; a shorter one leaves the back-off as it is. A 503 with Retry-After counts as a
// 429.
func TestCoolDownRetryAfter(t *testing.T) {
	c := CoolDown{InitialDelay: time.Second, MaxDelay: time.Minute, RetryFor: time.Hour}
	for _, tt := range []struct {
		name       string
		retryAfter time.Duration
		want       time.Duration
	}{
		{"longer than the back-off", 30 * time.Second, 30 * time.Second},
		{"beyond the cap", 6 * time.Hour, time.Minute},
		{"shorter than the back-off", 300 * time.Millisecond, time.Second},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cd := newCoolDowns(c, fixedRand(0.5))
			if until := cd.pushedBack("r.io", t0, t0, pushBack{code: 503, retryAfter: tt.retryAfter}, 0); until.Sub(t0) != tt.want {
				t.Errorf("cool-down of %s, want %s", until.Sub(t0), tt.want)
			}
			if s := cd.state("r.io"); s.code != 503 || s.since != t0 {
				t.Errorf("state %+v, want code 503 since %s", s, t0)
			}
		})
	}
}

// TestCoolDownSameRefusal: pulls that were under way when the registry first pushed back are
// refused by the same limit; their push-backs do not lengthen the cool-down, though a longer
// Retry-After among them is honoured.
func TestCoolDownSameRefusal(t *testing.T) {
	cd := newCoolDowns(CoolDown{InitialDelay: time.Second, MaxDelay: time.Minute, RetryFor: time.Hour}, fixedRand(0.5))
	first := cd.pushedBack("r.io", t0, t0.Add(10*time.Millisecond), pushBack{code: 429}, 0)
	for i := range 3 {
		at := t0.Add(time.Duration(20+i) * time.Millisecond)
		if until := cd.pushedBack("r.io", t0.Add(-time.Second), at, pushBack{code: 429}, 0); !until.Equal(first) {
			t.Errorf("push-back %d of a pull sent before the first: cool-down until %s, want %s unchanged", i, until, first)
		}
	}
	if s := cd.state("r.io"); s.backOff != time.Second || s.pushBacks != 4 {
		t.Errorf("state %+v: want the initial back-off, 4 push-backs", s)
	}
	longer := cd.pushedBack("r.io", t0, t0.Add(30*time.Millisecond), pushBack{code: 429, retryAfter: 5 * time.Second}, 0)
	if want := t0.Add(30*time.Millisecond + 5*time.Second); !longer.Equal(want) {
		t.Errorf("the same refusal with Retry-After 5s: until %s, want %s", longer, want)
	}
}

// TestCoolDownOneProbe: once the cool-down ends, one pull tries the registry; the others wait
// for its answer, or for probeGrace, after which the registry is taken as open. A pull whose
// hold ran out may try a registry still cooling, but not beside a probe.
func TestCoolDownOneProbe(t *testing.T) {
	cd := newCoolDowns(CoolDown{InitialDelay: time.Second, MaxDelay: time.Minute, RetryFor: time.Hour}, fixedRand(0.5))
	until := cd.pushedBack("r.io", t0, t0, pushBack{code: 429}, 0)
	if cd.mayStart("r.io", false, t0) || !cd.mayStart("other.io", false, t0) {
		t.Fatal("while r.io cools: its pulls must wait, other registries' must not")
	}
	if !cd.mayStart("r.io", true, t0) {
		t.Error("a pull whose hold ran out may not try the cooling registry")
	}
	if !cd.state("r.io").cooling(t0) || cd.state("r.io").cooling(until) {
		t.Error("cooling() does not end with the cool-down")
	}
	probe := cd.started("r.io", until)
	if probe == 0 {
		t.Fatal("the first pull after the cool-down is not the probe")
	}
	for _, at := range []time.Time{until, until.Add(probeGrace - time.Nanosecond)} {
		if cd.mayStart("r.io", false, at) || cd.mayStart("r.io", true, at) {
			t.Errorf("%s after the probe's start: a second pull may try the registry", at.Sub(until))
		}
		if !cd.state("r.io").cooling(at) {
			t.Errorf("%s after the probe's start: not cooling", at.Sub(until))
		}
	}
	if !cd.mayStart("r.io", false, until.Add(probeGrace)) || cd.started("r.io", until.Add(probeGrace)) != 0 {
		t.Error("after probeGrace the registry is not open, or a second probe is counted")
	}
	if got := cd.wake("r.io", until); !got.Equal(until.Add(probeGrace)) {
		t.Errorf("wake while the probe runs = %s, want the end of its grace", got)
	}

	// The probe's answer ends the cool-down; a probe cancelled passes its turn on.
	cd.answered("r.io", until, probe)
	if cd.state("r.io") != nil {
		t.Error("the probe's answer did not end the cool-down")
	}
	until = cd.pushedBack("r.io", t0, t0, pushBack{code: 429}, 0)
	cd.abandoned("r.io", cd.started("r.io", until))
	if !cd.mayStart("r.io", false, until) || cd.started("r.io", until) == 0 {
		t.Error("a cancelled probe's turn did not pass to the next pull")
	}
}

// TestCoolDownRefusalAfterGrace: a probe past its grace opens the registry; a pull started
// then and refused puts the registry in a longer cool-down, which holds its pulls though the
// old probe still runs; when the old probe ends at last, it does not end the newer probe's turn.
func TestCoolDownRefusalAfterGrace(t *testing.T) {
	cd := newCoolDowns(CoolDown{InitialDelay: time.Second, MaxDelay: time.Minute, RetryFor: time.Hour}, fixedRand(0.5))
	until := cd.pushedBack("r.io", t0, t0, pushBack{code: 429}, 0)
	old := cd.started("r.io", until)
	open := until.Add(probeGrace)
	if !cd.mayStart("r.io", false, open) || cd.started("r.io", open) != 0 {
		t.Fatal("a probe past its grace does not open the registry")
	}
	again := cd.pushedBack("r.io", open, open.Add(time.Millisecond), pushBack{code: 429}, 0)
	if want := open.Add(time.Millisecond + 2*time.Second); !again.Equal(want) {
		t.Errorf("refused after the grace: cool-down until %s, want %s (doubled)", again, want)
	}
	if cd.mayStart("r.io", false, again.Add(-time.Nanosecond)) {
		t.Error("the old probe, still running, opens the registry cooling again")
	}
	newer := cd.started("r.io", again)
	if newer == 0 || newer == old {
		t.Fatalf("probe numbers %d then %d, want a new one", old, newer)
	}
	cd.answered("r.io", until, old) // the old probe, sent before the last refusal, ends well
	if s := cd.state("r.io"); s == nil || s.probeID != newer {
		t.Errorf("the old probe's end changed the registry's state to %+v; want the newer probe out", s)
	}
}

// TestCoolDownAnsweredBeforePushBack: a pull sent before the last push-back that ends well
// says nothing of the registry now; one sent after it ends the cool-down.
func TestCoolDownAnsweredBeforePushBack(t *testing.T) {
	cd := newCoolDowns(CoolDown{InitialDelay: time.Second, MaxDelay: time.Minute, RetryFor: time.Hour}, fixedRand(0.5))
	cd.pushedBack("r.io", t0, t0.Add(time.Second), pushBack{code: 429}, 0)
	cd.answered("r.io", t0, 0)
	if cd.state("r.io") == nil {
		t.Fatal("a pull sent before the push-back ended the cool-down")
	}
	cd.answered("r.io", t0.Add(time.Second), 0)
	if cd.state("r.io") != nil {
		t.Error("a pull sent after the push-back did not end the cool-down")
	}
}

// TestCoolDownForget: a cool-down that ended long ago, with no pull to try the registry, is
// forgotten: the registry's next push-back starts from InitialDelay again.
func TestCoolDownForget(t *testing.T) {
	cd := newCoolDowns(CoolDown{InitialDelay: time.Second, MaxDelay: 10 * time.Second, RetryFor: time.Hour}, fixedRand(0.5))
	until := cd.pushedBack("r.io", t0, t0, pushBack{code: 429}, 0)
	cd.forget(until.Add(20 * time.Second))
	if cd.state("r.io") == nil {
		t.Fatal("forgotten at 2 × MaxDelay after its end; want only past it")
	}
	cd.forget(until.Add(20*time.Second + time.Nanosecond))
	if cd.state("r.io") != nil {
		t.Error("not forgotten past 2 × MaxDelay after its end")
	}
}
