package imagepull

// The request budgets of registries whose limit the operator knows (imagePulls.perRegistryRate):
// a token bucket per registry host, one token per backend pull.

import (
	"maps"
	"math"
	"time"

	"golang.org/x/time/rate"
)

// Rate is a registry's request budget: at most Pulls backend pulls every Interval, in bursts
// of at most Burst. It is a token bucket: it holds Burst tokens when full, gains one every
// Interval/Pulls, and each backend pull of the registry (a retry after a cool-down included)
// takes one. In any window of Interval the node starts at most Burst + Pulls pulls.
type Rate struct {
	Pulls    int
	Interval time.Duration
	Burst    int
}

// budgets are the token buckets of the registries with a Rate. Times are passed in, so that
// the governor's clock drives them.
type budgets struct {
	rates   map[string]Rate
	buckets map[string]*rate.Limiter
}

func newBudgets(rates map[string]Rate, now time.Time) budgets {
	b := budgets{rates: maps.Clone(rates), buckets: map[string]*rate.Limiter{}}
	for host, r := range rates {
		lim := rate.NewLimiter(rate.Every(r.Interval/time.Duration(r.Pulls)), r.Burst)
		lim.SetBurstAt(now, r.Burst) // full at start, whichever clock
		b.buckets[host] = lim
	}
	return b
}

// mayStart tells whether registry's budget has a token at now (a registry without one always
// has).
func (b budgets) mayStart(registry string, now time.Time) bool {
	lim := b.buckets[registry]
	return lim == nil || lim.TokensAt(now) >= 1
}

// take spends a token of registry's budget for a pull starting at now.
func (b budgets) take(registry string, now time.Time) {
	if lim := b.buckets[registry]; lim != nil {
		lim.AllowN(now, 1)
	}
}

// next is when registry's budget next has a token; zero when it has one at now (or no budget).
func (b budgets) next(registry string, now time.Time) time.Time {
	lim := b.buckets[registry]
	if lim == nil {
		return time.Time{}
	}
	missing := 1 - lim.TokensAt(now)
	if missing <= 0 {
		return time.Time{}
	}
	// Rounded up to a whole millisecond: at that moment the token is there, whatever the
	// rounding of the bucket's arithmetic.
	return now.Add(time.Duration(math.Ceil(missing/float64(lim.Limit())*1e3)) * time.Millisecond)
}
