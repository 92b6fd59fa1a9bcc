package progress

import (
	"strings"
	"time"
)

// StallRule says when a running pull is stalled: its rate, from containerd's content store,
// stays below MinBytesPerSecond over Window. The zero rule (MinBytesPerSecond 0) finds no
// stall.
type StallRule struct {
	// MinBytesPerSecond is the least rate a pull must keep over Window; 0: no stall is found.
	MinBytesPerSecond int64
	// Window is how long the rate must stay below MinBytesPerSecond.
	Window time.Duration
}

// On reports whether the rule finds stalls.
func (r StallRule) On() bool { return r.MinBytesPerSecond > 0 && r.Window > 0 }

// Stall is how a running pull stands against the StallRule.
type Stall struct {
	// Rate is the bytes per second over the longest span, up to the rule's window, whose rate
	// is below the rule's minimum; 0 when none is.
	Rate float64
	// For is that span: how long the pull has been below the minimum (at most the window).
	For time.Duration
	// Stalled: the rate stayed below the minimum over the whole window.
	Stalled bool
}

// Stalling reports whether the pull is below the minimum rate now.
func (s Stall) Stalling() bool { return s.For > 0 }

// stallWindow holds the readings of one pull's fetched bytes over a stall window: every reading
// in the last window and the newest one older than that, the window's base. It is fed by the
// tracker's polls, with their time, so it never reads a clock of its own.
type stallWindow struct {
	samples []sample
	// complete: every blob of the manifest was fetched; the pull unpacks, and is no longer
	// measured.
	complete bool
}

// add records a reading of done bytes at time at, and forgets the readings the window no
// longer needs. Fewer bytes than before (an ingest started again from the beginning) start the
// window afresh: what was counted of it is not there any more.
func (w *stallWindow) add(at time.Time, done int64, window time.Duration) {
	if n := len(w.samples); n > 0 && done < w.samples[n-1].done {
		w.samples = w.samples[:0]
	}
	w.samples = append(w.samples, sample{at: at, done: done})
	// Keep the newest reading at or before at-window as the base, drop the older ones.
	for len(w.samples) > 1 && !w.samples[1].at.After(at.Add(-window)) {
		w.samples = w.samples[1:]
	}
}

// judge measures the pull against rule as of the newest reading. unseen is what containerd
// may have received of the pull's blobs but not yet written to its content store (see
// Progress.Unseen): a span is below the minimum only when its bytes would be even with unseen
// counted, so a pull that keeps the minimum rate is never found stalled, however containerd
// buffers.
func (w *stallWindow) judge(rule StallRule, unseen int64) Stall {
	if !rule.On() || w.complete || len(w.samples) < 2 {
		return Stall{}
	}
	last := w.samples[len(w.samples)-1]
	minRate := float64(rule.MinBytesPerSecond)
	// The oldest reading from which the rate up to now is below the minimum gives the longest
	// span below it.
	for i, s := range w.samples[:len(w.samples)-1] {
		span := last.at.Sub(s.at)
		if span <= 0 {
			continue
		}
		if float64(last.done-s.done+unseen)/span.Seconds() >= minRate {
			continue
		}
		rate := float64(last.done-s.done) / span.Seconds()
		// Only the base (the first reading) can be older than the window: full coverage.
		stalled := i == 0 && span >= rule.Window
		return Stall{Rate: rate, For: min(span, rule.Window), Stalled: stalled}
	}
	return Stall{}
}

// ShortDuration writes d as the configuration does: "5m", not "5m0s"; "1h", not "1h0m0s".
func ShortDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}
