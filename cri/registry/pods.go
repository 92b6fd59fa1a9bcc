package registry

import (
	"slices"

	"k8s.io/apimachinery/pkg/types"
)

// PodState is everything the registry holds of one pod: its sandboxes, oldest first, its DRA
// claims, and what the features that show their records with it (PodViewer) hold of it. A pod
// is known while it has sandboxes or claims.
type PodState struct {
	UID       types.UID
	Sandboxes []SandboxRecord
	// Claims is nil when podgate prepares no claims for the pod.
	Claims *PodClaims
	// Views are the features' records of the pod, by the name of their view (PodViewer.ViewKey),
	// each of that feature's own type (the feature exports its reader: e.g. sysctl.InPod); a
	// feature with none is absent.
	Views map[string]any
}

// View is the records the view of that name holds of the pod; nil when none.
func (p *PodState) View(key string) any { return p.Views[key] }

// Ref names the pod, from its newest sandbox or else its claims.
func (p *PodState) Ref() PodRef {
	if n := len(p.Sandboxes); n > 0 {
		return p.Sandboxes[n-1].Pod
	}
	if p.Claims != nil {
		return p.Claims.Pod
	}
	return PodRef{UID: p.UID}
}

// PodChangeFunc is told of every change of a pod in the registry, in order, under the
// registry's lock: it must be quick and must not call the registry. before or after is nil
// when the pod was or is no longer known. revision grows with every change.
type PodChangeFunc func(revision uint64, before, after *PodState)

// OnPodChange sets fn to be told of every change from now on.
func (r *Registry) OnPodChange(fn PodChangeFunc) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.onChange = fn
}

// Pods returns every known pod, ordered by UID, and the revision they were read at.
func (r *Registry) Pods() ([]PodState, uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	// One pass over the sandboxes, not one per pod: List asks for every pod of a full node.
	var claimPods []PodRef
	if r.claims != nil {
		claimPods = r.claims.ClaimPods()
	}
	pods := make(map[types.UID]*PodState, len(claimPods)+len(r.entries))
	state := func(uid types.UID) *PodState {
		p, ok := pods[uid]
		if !ok {
			p = &PodState{UID: uid}
			pods[uid] = p
		}
		return p
	}
	for _, ref := range claimPods {
		if c, ok := r.claims.PodClaims(ref.UID); ok {
			state(ref.UID).Claims = &c
		}
	}
	for _, e := range r.entries {
		p := state(e.Pod.UID)
		p.Sandboxes = append(p.Sandboxes, e.Clone())
	}
	out := make([]PodState, 0, len(pods))
	for _, p := range pods {
		slices.SortFunc(p.Sandboxes, compareSandboxes)
		p.Views = r.viewsLocked(p.UID, p.Sandboxes)
		out = append(out, *p)
	}
	slices.SortFunc(out, func(a, b PodState) int { return compareStrings(string(a.UID), string(b.UID)) })
	return out, r.revision
}

// PodByName returns the pod named namespace/name; of two pods of one name (one being
// deleted, its successor starting), the one whose newest sandbox is newer, or that has no
// sandbox yet.
func (r *Registry) PodByName(namespace, name string) (PodState, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var best *PodState
	consider := func(uid types.UID) {
		if best != nil && best.UID == uid {
			return
		}
		p := r.podStateLocked(uid)
		if best == nil || newerPod(p, best) {
			best = p
		}
	}
	if r.claims != nil {
		for _, p := range r.claims.ClaimPods() {
			if p.Namespace == namespace && p.Name == name {
				consider(p.UID)
			}
		}
	}
	for _, e := range r.entries {
		if e.Pod.Namespace == namespace && e.Pod.Name == name {
			consider(e.Pod.UID)
		}
	}
	if best == nil {
		return PodState{}, false
	}
	return *best, true
}

// newerPod: a pod without a sandbox yet is the newest; else the newest sandbox wins.
func newerPod(a, b *PodState) bool {
	switch {
	case len(a.Sandboxes) == 0:
		return len(b.Sandboxes) > 0
	case len(b.Sandboxes) == 0:
		return false
	}
	return a.Sandboxes[len(a.Sandboxes)-1].CreatedAt.After(b.Sandboxes[len(b.Sandboxes)-1].CreatedAt)
}

// podStateLocked builds the state of the pod with this UID; nil when it is not known.
func (r *Registry) podStateLocked(uid types.UID) *PodState {
	p := &PodState{UID: uid, Sandboxes: r.sortedLocked(func(e *SandboxRecord) bool { return e.Pod.UID == uid })}
	if c, ok := r.podClaimsLocked(uid); ok {
		p.Claims = &c
	}
	if len(p.Sandboxes) == 0 && p.Claims == nil {
		return nil
	}
	p.Views = r.viewsLocked(uid, p.Sandboxes)
	return p
}

// viewsLocked are the sections' views of the pod with these sandboxes; nil when none has one.
func (r *Registry) viewsLocked(uid types.UID, sandboxes []SandboxRecord) map[string]any {
	var out map[string]any
	for _, v := range r.viewers {
		if view := v.PodView(uid, sandboxes); view != nil {
			if out == nil {
				out = make(map[string]any, len(r.viewers))
			}
			out[v.ViewKey()] = view
		}
	}
	return out
}

// beforeLocked is the pod's state before a change, for the change function; nil when none
// is set (nothing to tell).
func (r *Registry) beforeLocked(uid types.UID) *PodState {
	if r.onChange == nil {
		return nil
	}
	return r.podStateLocked(uid)
}

// changedLocked records a change of the pod with this UID and tells the change function.
func (r *Registry) changedLocked(uid types.UID, before *PodState) {
	r.revision++
	if r.onChange != nil {
		r.onChange(r.revision, before, r.podStateLocked(uid))
	}
}

// PodClaims implements PodClaimsGetter with the claims' section (none: no pod has claims).
func (r *Registry) PodClaims(uid types.UID) (PodClaims, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.podClaimsLocked(uid)
}

func (r *Registry) podClaimsLocked(uid types.UID) (PodClaims, bool) {
	if r.claims == nil {
		return PodClaims{}, false
	}
	return r.claims.PodClaims(uid)
}
