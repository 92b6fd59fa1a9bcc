package imagepull

// The registries in a cool-down: which may start a pull, and for how long a registry that
// pushed back stays closed.

import (
	"math/rand/v2"
	"time"
)

// CoolDown says how the governor treats a registry that pushes back (HTTP 429 Too Many
// Requests, or 503 with a Retry-After): the registry cools down, no pull of it starts until the
// cool-down ends, then one pull tries it (the probe) while the others wait for its answer. The
// pull that met the push-back waits in the queue and is tried again, for up to RetryFor; then
// its callers get the registry's error unchanged.
type CoolDown struct {
	// InitialDelay is the first cool-down of a registry; each push-back of a pull that started
	// after the last one doubles it, with a jitter of ±coolDownJitter.
	InitialDelay time.Duration
	// MaxDelay caps a cool-down, a Retry-After the registry asks for included: the registry is
	// asked again at least this often while pulls wait for it.
	MaxDelay time.Duration
	// RetryFor is the longest a pull is held for a cool-down: from the push-back it met, or
	// from when the cool-down began to hold it. 0 turns cool-downs off: a push-back fails its
	// pull, as any other error.
	RetryFor time.Duration
}

// On tells whether c holds and retries pulls at all.
func (c CoolDown) On() bool { return c.RetryFor > 0 }

// coolDownJitter spreads a back-off over ±20 % of it, so that the nodes behind one address
// that met one limit at once do not all ask again at the same moment.
const coolDownJitter = 0.2

// probeGrace is how long a probe may run before the registry is taken as open again, when the
// probe has neither failed nor finished. A registry refuses within its first answers:
// containerd asks up to five times at once on a 429, each a round trip, after a token request
// and a TLS handshake, all within a few seconds of the start even from far away. A probe still
// running after that is fetching layers, which can take minutes; the other pulls need not wait
// for its end.
const probeGrace = 10 * time.Second

// coolDowns are the registries in a cool-down. It is not safe for concurrent use: the
// governor calls it under its lock.
type coolDowns struct {
	CoolDown
	// rand returns a number in [0, 1), for the jitter.
	rand func() float64
	reg  map[string]*coolState
	// probes numbers the probes, from 1.
	probes uint64
}

// coolState is one registry's cool-down.
type coolState struct {
	// since is the first push-back of this cool-down; until is when the next pull may try the
	// registry.
	since, until time.Time
	// pushedAt is the last push-back that lengthened the cool-down: a push-back of a pull
	// that started before it is the same refusal and does not lengthen it again.
	pushedAt time.Time
	// backOff is the last back-off, before its jitter: the next one is twice it.
	backOff time.Duration
	// probe is when the pull trying the registry after the cool-down started, probeID which
	// probe it is; zero when none runs.
	probe   time.Time
	probeID uint64
	// code is the last push-back's HTTP status; pushBacks counts the push-backs.
	code, pushBacks int
}

func newCoolDowns(c CoolDown, random func() float64) *coolDowns {
	if random == nil {
		random = rand.Float64
	}
	return &coolDowns{CoolDown: c, rand: random, reg: map[string]*coolState{}}
}

// mayStart tells whether a pull of registry may start at now: the registry is not cooling, or
// its cool-down has ended (or the pull's hold has run out: holdOver) and no other pull is
// trying it.
func (c *coolDowns) mayStart(registry string, holdOver bool, now time.Time) bool {
	s := c.reg[registry]
	switch {
	case s == nil:
		return true
	case !s.probe.IsZero():
		return !now.Before(s.probe.Add(probeGrace)) // taken as open
	}
	return holdOver || !now.Before(s.until)
}

// started records that a pull of registry started at now, and returns its probe's number when
// it is the registry's probe, the pull that tries a registry whose cool-down has ended; 0 when
// it is not.
func (c *coolDowns) started(registry string, now time.Time) uint64 {
	s := c.reg[registry]
	if s == nil || !s.probe.IsZero() {
		return 0
	}
	c.probes++
	s.probe, s.probeID = now, c.probes
	return s.probeID
}

// probeEnded forgets the probe numbered probe, if it is s's.
func (s *coolState) probeEnded(probe uint64) {
	if probe != 0 && s.probeID == probe {
		s.probe, s.probeID = time.Time{}, 0
	}
}

// pushedBack records that the registry refused a pull that started at started (the probe
// numbered probe, or 0), and returns the end of the registry's cool-down. The first push-back
// starts a cool-down of InitialDelay; each push-back of a pull that started after the last
// one's doubles the back-off, up to MaxDelay, and the registry is cooling again whatever probe
// runs; a Retry-After longer than the back-off is waited out instead, up to MaxDelay.
func (c *coolDowns) pushedBack(registry string, started, now time.Time, pb pushBack, probe uint64) time.Time {
	s := c.reg[registry]
	if s != nil {
		s.probeEnded(probe)
	}
	switch {
	case s == nil:
		s = &coolState{since: now, backOff: c.InitialDelay}
		c.reg[registry] = s
	case started.Before(s.pushedAt):
		// Sent before the last push-back: the same refusal. A longer wait it asks for is
		// honoured all the same.
		s.pushBacks++
		s.code = pb.code
		s.until = laterOf(s.until, now.Add(min(pb.retryAfter, c.MaxDelay)))
		return s.until
	default:
		s.backOff = min(2*s.backOff, c.MaxDelay)
		s.probe, s.probeID = time.Time{}, 0 // a probe past its grace no longer opens the registry
	}
	s.pushBacks++
	s.code, s.pushedAt = pb.code, now
	wait := time.Duration(float64(s.backOff) * (1 - coolDownJitter + 2*coolDownJitter*c.rand()))
	s.until = now.Add(min(max(wait, pb.retryAfter), c.MaxDelay))
	return s.until
}

// answered records that a pull of registry that started at started ended without a push-back
// (it succeeded, or failed for another reason): when it started after the last push-back, the
// registry answered it, and its cool-down ends.
func (c *coolDowns) answered(registry string, started time.Time, probe uint64) {
	s := c.reg[registry]
	if s == nil {
		return
	}
	s.probeEnded(probe)
	if !started.Before(s.pushedAt) {
		delete(c.reg, registry)
	}
}

// abandoned records that a pull of registry ended without an answer from the registry
// (cancelled); a probe's turn passes to the next pull.
func (c *coolDowns) abandoned(registry string, probe uint64) {
	if s := c.reg[registry]; s != nil {
		s.probeEnded(probe)
	}
}

// state is registry's cool-down, nil when it has none.
func (c *coolDowns) state(registry string) *coolState { return c.reg[registry] }

// cooling tells whether registry's cool-down holds its pulls at now: it has not ended, or a
// probe of it runs within probeGrace.
func (s *coolState) cooling(now time.Time) bool {
	if s == nil {
		return false
	}
	if !s.probe.IsZero() {
		return now.Before(s.probe.Add(probeGrace))
	}
	return now.Before(s.until)
}

// wake is the next moment after now at which registry's cool-down may let a pull start: its
// end, or the end of a probe's grace; zero when it has none, or it is past.
func (c *coolDowns) wake(registry string, now time.Time) time.Time {
	s := c.reg[registry]
	switch {
	case s == nil:
		return time.Time{}
	case !s.probe.IsZero():
		return afterOrZero(s.probe.Add(probeGrace), now)
	}
	return afterOrZero(s.until, now)
}

// forget drops the cool-downs that ended long ago without a pull to try them (2 × MaxDelay):
// the registry's next pull goes as any other, and its next push-back starts from InitialDelay.
func (c *coolDowns) forget(now time.Time) {
	for registry, s := range c.reg {
		if s.probe.IsZero() && now.Sub(s.until) > 2*c.MaxDelay {
			delete(c.reg, registry)
		}
	}
}

// afterOrZero is t when it is after now, else zero.
func afterOrZero(t, now time.Time) time.Time {
	if t.After(now) {
		return t
	}
	return time.Time{}
}

// earliest is the earlier of two times, zero standing for none.
func earliest(a, b time.Time) time.Time {
	switch {
	case a.IsZero():
		return b
	case b.IsZero() || a.Before(b):
		return a
	}
	return b
}

// laterOf is the later of two times.
func laterOf(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
