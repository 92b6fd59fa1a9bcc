package config

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"
)

// PullCoolDown is the imagePulls.coolDown section: how podgate treats a registry that pushes
// back (HTTP 429 Too Many Requests, or 503 with Retry-After). The registry cools down, its pulls
// wait in podgate's queue, and the pull that met the push-back is tried again when the
// cool-down ends, for up to RetryFor; then its callers get the registry's own error.
type PullCoolDown struct {
	// InitialDelay is a registry's first cool-down; it doubles with each push-back that
	// follows, with a jitter of ±20 %. Default 1s.
	InitialDelay Duration `json:"initialDelay,omitzero"`
	// MaxDelay caps a cool-down, a Retry-After the registry asks for included. Default 2m.
	MaxDelay Duration `json:"maxDelay,omitzero"`
	// RetryFor is the longest podgate holds and retries a pull for its registry's cool-down;
	// then the registry's error goes to the kubelet unchanged. Default 5m; 0 turns cool-downs
	// off (a push-back fails its pull, as without podgate).
	RetryFor *Duration `json:"retryFor,omitempty"`
}

// Defaults of imagePulls.coolDown: a first cool-down of a second, as short as the shortest
// limits (quay.io's per second, GHCR's retry-after of milliseconds) need, doubled up to two
// minutes between tries of a registry that goes on refusing; a pull held five minutes at most,
// as long as the kubelet's own image back-off at its longest, so that a limit of hours (Docker
// Hub's 6-hour window) ends in the registry's own error.
const (
	DefaultCoolDownInitialDelay = time.Second
	DefaultCoolDownMaxDelay     = 2 * time.Minute
	DefaultCoolDownRetryFor     = 5 * time.Minute
	// DefaultRegistryRateBurst is imagePulls.perRegistryRate's burst when unset: one pull at
	// a time at the rate, so that the node never goes over pulls per interval.
	DefaultRegistryRateBurst = 1
)

func (c *PullCoolDown) setDefaults() {
	if c.InitialDelay.Duration == 0 {
		c.InitialDelay.Duration = DefaultCoolDownInitialDelay
	}
	if c.MaxDelay.Duration == 0 {
		c.MaxDelay.Duration = DefaultCoolDownMaxDelay
	}
	if c.RetryFor == nil {
		c.RetryFor = &Duration{DefaultCoolDownRetryFor}
	}
}

// Durations is the section with its defaults (setDefaults sets them too; Durations also
// serves a section built in code); retryFor 0 means off. The section is valid.
func (c PullCoolDown) Durations() (initialDelay, maxDelay, retryFor time.Duration) {
	initialDelay, maxDelay, retryFor = DefaultCoolDownInitialDelay, DefaultCoolDownMaxDelay, DefaultCoolDownRetryFor
	if c.InitialDelay.Duration != 0 {
		initialDelay = c.InitialDelay.Duration
	}
	if c.MaxDelay.Duration != 0 {
		maxDelay = c.MaxDelay.Duration
	}
	if c.RetryFor != nil {
		retryFor = c.RetryFor.Duration
	}
	return initialDelay, maxDelay, retryFor
}

// minCoolDown is the shortest cool-down podgate waits: a registry's answer takes longer.
const minCoolDown = 100 * time.Millisecond

// validate checks the imagePulls.coolDown section.
func (c *PullCoolDown) validate() error {
	var errs []error
	initial, maxDelay := c.InitialDelay.Duration, c.MaxDelay.Duration
	if initial != 0 && initial < minCoolDown {
		errs = append(errs, fmt.Errorf("imagePulls.coolDown.initialDelay: %s: must be at least %s", initial, minCoolDown))
	}
	if maxDelay != 0 && maxDelay < minCoolDown {
		errs = append(errs, fmt.Errorf("imagePulls.coolDown.maxDelay: %s: must be at least %s", maxDelay, minCoolDown))
	}
	if initial, maxDelay, _ := c.Durations(); initial > maxDelay {
		errs = append(errs, fmt.Errorf("imagePulls.coolDown.maxDelay: %s: must not be below initialDelay %s", maxDelay, initial))
	}
	if c.RetryFor != nil && c.RetryFor.Duration < 0 {
		errs = append(errs, fmt.Errorf("imagePulls.coolDown.retryFor: %s: must not be negative (0 turns cool-downs off)", c.RetryFor.Duration))
	}
	return errors.Join(errs...)
}

// RegistryRate is a registry's request budget in imagePulls.perRegistryRate: at most Pulls
// pulls every Interval, in bursts of at most Burst (a token bucket). In any window of Interval
// the node starts at most Burst + Pulls pulls of the registry.
type RegistryRate struct {
	// Pulls is the pulls per Interval: the bucket gains a token every Interval/Pulls.
	Pulls int32 `json:"pulls"`
	// Interval is the window Pulls counts over. At least 1s.
	Interval Duration `json:"interval"`
	// Burst is the most pulls started at once, the bucket's size (full at start). Default 1.
	Burst *int32 `json:"burst,omitempty"`
}

// minRateInterval is the shortest interval of a registry's budget.
const minRateInterval = time.Second

// validateRates checks the values of imagePulls.perRegistryRate; its keys are registry hosts
// by the image-pull feature's rules, which agent.Validate checks.
func validateRates(rates map[string]RegistryRate) error {
	var errs []error
	for _, host := range slices.Sorted(maps.Keys(rates)) {
		r, key := rates[host], fmt.Sprintf("imagePulls.perRegistryRate[%q]", host)
		if r.Pulls <= 0 {
			errs = append(errs, fmt.Errorf("%s.pulls: must be positive, got %d", key, r.Pulls))
		}
		if r.Interval.Duration < minRateInterval {
			errs = append(errs, fmt.Errorf("%s.interval: %s: must be at least %s", key, r.Interval.Duration, minRateInterval))
		}
		if r.Burst != nil && *r.Burst <= 0 {
			errs = append(errs, fmt.Errorf("%s.burst: must be positive, got %d", key, *r.Burst))
		}
	}
	return errors.Join(errs...)
}
