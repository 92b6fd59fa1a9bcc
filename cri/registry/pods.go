package registry

import (
	"slices"

	"k8s.io/apimachinery/pkg/types"
)

// PodState is everything the registry holds of one pod: its sandboxes, oldest first, and what
// the features that show their records with it (PodViewer) hold of it. A pod is known while it
// has sandboxes, or records a section keeps it by (PodKeeper: its DRA claims).
type PodState struct {
	UID       types.UID
	Sandboxes []SandboxRecord
	// Views are the features' records of the pod, by the name of their view (PodViewer.ViewKey),
	// each of that feature's own type (the feature exports its reader: e.g. sysctl.InPod); a
	// feature with none is absent.
	Views map[string]any
	// kept is the pod as a section that keeps it names it.
	kept PodRef
}

// View is the records the view of that name holds of the pod; nil when none.
func (p *PodState) View(key string) any { return p.Views[key] }

// Ref names the pod, from its newest sandbox or else the section that keeps it.
func (p *PodState) Ref() PodRef {
	if n := len(p.Sandboxes); n > 0 {
		return p.Sandboxes[n-1].Pod
	}
	if p.kept.UID != "" {
		return p.kept
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
	pods := make(map[types.UID]*PodState, len(r.entries))
	state := func(uid types.UID) *PodState {
		p, ok := pods[uid]
		if !ok {
			p = &PodState{UID: uid}
			pods[uid] = p
		}
		return p
	}
	for _, k := range r.keepers {
		for _, ref := range k.KeptPods() {
			state(ref.UID).kept = ref
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

// Pod returns the pod with this UID.
func (r *Registry) Pod(uid types.UID) (PodState, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	p := r.podStateLocked(uid)
	if p == nil {
		return PodState{}, false
	}
	return *p, true
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
	for _, k := range r.keepers {
		for _, p := range k.KeptPods() {
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
	kept := false
	for _, k := range r.keepers {
		if ref, ok := k.KeptPod(uid); ok {
			p.kept, kept = ref, true
		}
	}
	if len(p.Sandboxes) == 0 && !kept {
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
