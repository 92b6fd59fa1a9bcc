package registry

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"

	"k8s.io/apimachinery/pkg/types"
)

// Section is a feature's part of the checkpoint: the top-level data keys it owns, beside the
// sandboxes. A feature keeps its state and its rules; the registry writes what the section
// saves in each checkpoint, so that one file, written whole and atomically, holds the
// sandboxes and every feature's obligations consistently with each other.
type Section interface {
	// Keys are the data keys the section owns (e.g. "claims", "draPods", "podClaims"): the
	// registry hands it what the checkpoint held under them, and writes only what Save returns.
	Keys() []string
	// Save encodes the section's published state for a checkpoint whose sandboxes are
	// sandboxes. It is called with the registry's lock held and must not call the registry. It
	// returns the raw value per key (a key left out is not written) and the checkpoint format
	// version it needs (2 or 3: see CheckpointVersion).
	Save(sandboxes []SandboxRecord) (map[string]json.RawMessage, int, error)
}

// SandboxWatcher is a Section told of sandbox records as they are set and go, in the same
// change (called with the registry's lock held; it must not call the registry): what the
// record now holds or no longer holds may end or start an obligation of the section.
type SandboxWatcher interface {
	// SandboxSet is told of a record Add or UpdateDurable recorded, once it is published.
	SandboxSet(rec *SandboxRecord)
	// SandboxGone is told of a record that goes (Remove, or the runtime no longer has it).
	SandboxGone(rec *SandboxRecord)
}

// PodClaimsSource is the Section holding the pods' DRA claims: the registry builds each pod's
// state (PodState.Claims) from it, under its lock (it must not call the registry).
type PodClaimsSource interface {
	PodClaimsGetter
	// ClaimPods are the pods that have claims.
	ClaimPods() []PodRef
}

// SaveFunc is what Commit writes for the section being changed: its next state, encoded as
// Section.Save would.
type SaveFunc func(sandboxes []SandboxRecord) (map[string]json.RawMessage, int, error)

// Register adds a section. load is handed what the checkpoint held under the section's keys at
// start-up (a key absent from the file is absent from the map) and takes it up, all under the
// registry's lock: no write comes between the registration and the load, so none can save the
// section empty over what the file held. When load fails, nothing is registered and the error
// names the checkpoint as damaged; the keys' data is carried through writes unchanged, as is
// that of every key no section owns.
func (r *Registry) Register(s Section, load func(raw map[string]json.RawMessage) error) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	owned := map[string]json.RawMessage{}
	for _, k := range s.Keys() {
		if k == sandboxesKey {
			return fmt.Errorf("registry: a section cannot own %q", k)
		}
		if slices.ContainsFunc(r.sections, func(o Section) bool { return slices.Contains(o.Keys(), k) }) {
			return fmt.Errorf("registry: data key %q has a section already", k)
		}
		if v, ok := r.raw[k]; ok {
			owned[k] = v
		}
	}
	if err := load(owned); err != nil {
		if r.checkpoint != nil {
			return r.checkpoint.corrupt(err.Error())
		}
		return fmt.Errorf("registry: %w", err)
	}
	for _, k := range s.Keys() {
		delete(r.raw, k)
	}
	r.sections = append(r.sections, s)
	if w, ok := s.(SandboxWatcher); ok {
		r.watchers = append(r.watchers, w)
	}
	if src, ok := s.(PodClaimsSource); ok {
		r.claims = src
	}
	return nil
}

// Commit makes a change of section s durable, then visible: it writes the checkpoint with every
// section's published state but s's, for which next is saved; then, under the registry's lock,
// it calls publish (which makes the change the section's) and tells the change of each pod in
// touched, its state before read before publish. A failed write publishes nothing. Commits and
// checkpoint writes are serialised, so a later change is never overwritten by an earlier
// snapshot; a section serialises its own changes itself, so that none is built on a state
// another one is replacing.
func (r *Registry) Commit(s Section, next SaveFunc, publish func(), touched []types.UID) error {
	if r.checkpoint != nil {
		// Held until the change is published: a background write in between would snapshot
		// the section of before and overwrite this one.
		r.persistMu.Lock()
		defer r.persistMu.Unlock()
		r.mu.Lock()
		snap, err := r.snapshotLocked(nil, s, next)
		r.mu.Unlock()
		if err != nil {
			return err
		}
		if err := r.checkpoint.Write(snap); err != nil {
			return fmt.Errorf("pod registry: %w", err)
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	befores := make([]*PodState, len(touched))
	for i, uid := range touched {
		befores[i] = r.beforeLocked(uid)
	}
	publish()
	for i, uid := range touched {
		r.changedLocked(uid, befores[i])
	}
	return nil
}

// PersistSoon writes the checkpoint in the background (WriteDelay from now), for a section's
// change that need not be durable before it counts.
func (r *Registry) PersistSoon() { r.persistSoon() }

// sandboxesKey is the data key of the sandboxes, the registry's own.
const sandboxesKey = "sandboxes"

// snapshotLocked is what the checkpoint holds now, with rec in place of the record of its ID
// when rec is not nil, and next saved for section s when s is not nil.
func (r *Registry) snapshotLocked(rec *SandboxRecord, s Section, next SaveFunc) (CheckpointData, error) {
	if s != nil && !slices.Contains(r.sections, s) {
		return CheckpointData{}, errors.New("pod registry: commit of a section not registered")
	}
	d := CheckpointData{Sandboxes: r.sortedLocked(func(*SandboxRecord) bool { return true }), Sections: maps.Clone(r.raw), Version: checkpointV2}
	if rec != nil {
		d.Sandboxes = append(slices.DeleteFunc(d.Sandboxes, func(e SandboxRecord) bool { return e.ID == rec.ID }), rec.Clone())
		slices.SortFunc(d.Sandboxes, compareSandboxes)
	}
	if len(d.Sections) > 0 && r.loadedVersion > d.Version {
		d.Version = r.loadedVersion // data of a section this podgate lacks: its file's format
	}
	if d.Sections == nil {
		d.Sections = map[string]json.RawMessage{}
	}
	for _, sec := range r.sections {
		save := sec.Save
		if sec == s {
			save = next
		}
		vals, v, err := save(d.Sandboxes)
		if err != nil {
			return CheckpointData{}, fmt.Errorf("pod registry: %w", err)
		}
		for k, raw := range vals {
			if !slices.Contains(sec.Keys(), k) {
				return CheckpointData{}, fmt.Errorf("pod registry: section saved key %q it does not own", k)
			}
			d.Sections[k] = raw
		}
		d.Version = max(d.Version, v)
	}
	if d.Version > checkpointV3 {
		return CheckpointData{}, errors.New("pod registry: a section asks for a checkpoint format this podgate does not write")
	}
	return d, nil
}
