package imagepull

// What the governor holds, as its readers see it: each pull's state (queued and why, running),
// by pod or all of them, and the counts behind the queue metrics.

import (
	"slices"
	"strings"
	"time"

	"k8s.io/klog/v2"
)

// Waiting says why a queued pull has not started.
type Waiting string

// Why a pull waits.
const (
	// WaitingNode: the node-wide cap (imagePulls.maxParallel) is reached.
	WaitingNode Waiting = "node"
	// WaitingRegistry: the cap of the pull's registry (imagePulls.perRegistry) is reached.
	WaitingRegistry Waiting = "registry"
)

// PullStatus is one caller's pull as it is now.
type PullStatus struct {
	// Image and Registry are the pull's, as in [Pull].
	Image, Registry string
	// Kind says what the pull fetches, as in [Pull].
	Kind Kind
	// Pod and PodUID name the caller's pod; empty when the call named none.
	Pod    klog.ObjectRef
	PodUID string
	// Priority is the backend pull's priority in the queue.
	Priority Priority
	// Since is when the caller asked; Started when the backend pull started (zero while it
	// waits).
	Since, Started time.Time
	// Position is the backend pull's 1-based place in the queue while it waits, 0 once it runs.
	Position int
	// Waiting says which cap holds it while it waits.
	Waiting Waiting
	// Queued counts the backend pulls waiting; InFlight those running on the node, and
	// RegistryInFlight those of this pull's registry.
	Queued, InFlight, RegistryInFlight int
	// MaxParallel and RegistryCap are the caps that apply (0: none).
	MaxParallel, RegistryCap int
	// Shared: the caller joined a pull another caller made; SharedWith names that caller's pod.
	Shared     bool
	SharedWith klog.ObjectRef
	// Waiters counts the callers sharing the backend pull, this one included.
	Waiters int
	// CoolDownStatus is what holds it besides the caps (Waiting WaitingCoolDown, WaitingRate).
	CoolDownStatus
}

// Pulls returns every caller's pull, oldest first (then by image and pod).
func (g *Governor) Pulls() []PullStatus {
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []PullStatus
	for _, ws := range g.pods {
		for w := range ws {
			out = append(out, g.status(w))
		}
	}
	for w := range g.anonymous {
		out = append(out, g.status(w))
	}
	sortStatuses(out)
	return out
}

// PodPulls returns the pulls the callers for the pod with this UID wait for, oldest first.
func (g *Governor) PodPulls(uid string) []PullStatus {
	g.mu.Lock()
	defer g.mu.Unlock()
	ws := g.pods[uid]
	if len(ws) == 0 {
		return nil
	}
	out := make([]PullStatus, 0, len(ws))
	for w := range ws {
		out = append(out, g.status(w))
	}
	sortStatuses(out)
	return out
}

// status describes w's pull. g.mu is held.
func (g *Governor) status(w *waiter) PullStatus {
	f := w.flight
	s := PullStatus{
		Image: w.pull.Image, Registry: w.pull.Registry, Kind: w.pull.Kind, Pod: w.pull.Pod, PodUID: w.pull.PodUID,
		Priority: f.prio, Since: w.arrived, Started: f.started,
		Queued: g.queue.len, InFlight: g.inFlight, RegistryInFlight: g.regInFlight[f.registry],
		MaxParallel: g.limits.MaxParallel, RegistryCap: g.limits.PerRegistry[f.registry],
		Shared: !w.leads, Waiters: f.waiters,
	}
	if !w.leads {
		s.SharedWith = f.pod
	}
	if f.elem != nil {
		s.Position = g.queue.position(f)
		s.Waiting = WaitingRegistry
		if g.limits.MaxParallel > 0 && g.inFlight >= g.limits.MaxParallel {
			s.Waiting = WaitingNode
		}
		g.held(f, &s)
	}
	return s
}

func sortStatuses(s []PullStatus) {
	slices.SortFunc(s, func(a, b PullStatus) int {
		if c := a.Since.Compare(b.Since); c != 0 {
			return c
		}
		if c := strings.Compare(a.Image, b.Image); c != 0 {
			return c
		}
		return strings.Compare(a.Pod.String(), b.Pod.String())
	})
}

// Running returns the backend pulls running now, one per flight.
func (g *Governor) Running() []PullStatus {
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []PullStatus
	for _, f := range g.flights {
		if !f.started.IsZero() {
			out = append(out, PullStatus{Image: f.image, Registry: f.registry, Kind: f.key.kind, Pod: f.pod, Priority: f.prio, Started: f.started, Waiters: f.waiters})
		}
	}
	sortStatuses(out)
	return out
}

// Stats is a snapshot of the governor's state, for tests and debugging.
type Stats struct {
	// Queued counts flights waiting for a slot; InFlight flights running.
	Queued, InFlight int
	// Waiters counts the callers waiting for those flights.
	Waiters int
}

// Stats returns a snapshot of the governor's state.
func (g *Governor) Stats() Stats {
	g.mu.Lock()
	defer g.mu.Unlock()
	s := Stats{Queued: g.queue.len, InFlight: g.inFlight}
	for _, f := range g.flights {
		s.Waiters += f.waiters
	}
	return s
}
