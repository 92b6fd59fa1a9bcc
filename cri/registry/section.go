package registry

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"

	"k8s.io/apimachinery/pkg/types"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Section is a feature's part of the checkpoint: the top-level data keys it owns, beside the
// sandboxes, and (SandboxFields) keys of each sandbox object. A feature keeps its records, their
// types and its rules; the registry writes what the section saves in each checkpoint, so that
// one file, written whole and atomically, holds the sandboxes and every feature's records and
// obligations consistently with each other.
type Section interface {
	// Keys are the top-level data keys the section owns (e.g. "claims", "draPods", "podClaims"):
	// the registry hands it what the checkpoint held under them, and writes only what Save
	// returns. A section that owns none returns none.
	Keys() []string
	// Save encodes the section's published state for a checkpoint whose sandboxes are
	// sandboxes. It is called with the registry's lock held and must not call the registry.
	Save(sandboxes []SandboxRecord) (Saved, error)
}

// SandboxFields is a Section that keeps a record per sandbox inside the sandbox's object of the
// checkpoint (e.g. "sysctls", "attached"), as podgate wrote them when the registry held them:
// the keys are written after the registry's own, in the order sandboxFieldOrder fixes.
type SandboxFields interface {
	Section
	// Fields are the keys of the sandbox objects the section owns; none of the registry's.
	Fields() []string
}

// Saved is what a Section writes in one checkpoint.
type Saved struct {
	// Keys are the raw values of its top-level keys; a key left out is not written.
	Keys map[string]json.RawMessage
	// Fields are the raw values of its sandbox keys, by sandbox ID then key; a key left out is
	// not written, and a sandbox the checkpoint does not hold is left out.
	Fields map[string]map[string]json.RawMessage
	// Version is the checkpoint format it needs: 2, or 3 (see CheckpointVersion). 0 is 2.
	Version int
}

// Loaded is what the checkpoint held for a section when it registered: a key absent from the
// file is absent here.
type Loaded struct {
	// Keys are its top-level keys' values.
	Keys map[string]json.RawMessage
	// Fields are its sandbox keys' values, by sandbox ID then key.
	Fields map[string]map[string]json.RawMessage
}

// The registry tells a section what it needs of the sandboxes' and containers' lives through
// these interfaces, which a Section implements as it needs them. They are called with the
// registry's lock held: they must not call the registry.

// SandboxWatcher is told of sandbox records as they are set and go, in the same change: what
// the record now holds or no longer holds may end or start an obligation of the section.
type SandboxWatcher interface {
	// SandboxSet is told of a record Add recorded, once it is published.
	SandboxSet(rec *SandboxRecord)
	// SandboxGone is told of a record that goes (Remove, or the runtime no longer has it).
	SandboxGone(rec *SandboxRecord)
}

// AdoptWatcher is told of each sandbox the start-up rebuild adopts (found in the runtime
// without podgate having seen it start), with the configuration the runtime holds for it (nil
// when its status could not be read): what the feature knows of a sandbox it did not see start.
type AdoptWatcher interface {
	SandboxAdopted(rec *SandboxRecord, cfg *runtimeapi.PodSandboxConfig)
}

// Obligations is a section whose records of a sandbox may be an obligation only the checkpoint
// keeps (devices podgate moved into the pod): Add records such a sandbox only once the
// checkpoint holds it with those records.
type Obligations interface {
	Obliged(sandboxID string) bool
}

// PodViewer is a section whose records the registry's readers see with each pod
// (PodState.Views), read under the registry's lock: a reader sees the sandboxes and every
// feature's records of them at the same revision, and the change function sees them before and
// after each change (ChangeSandbox, Commit). The feature exports the reader of its view (e.g.
// sysctl.InPod), so that its readers need nothing but the pod's state.
type PodViewer interface {
	// ViewKey names the view in PodState.Views: one of the section's own keys (Keys or
	// Fields), so that no two views share a name.
	ViewKey() string
	// PodView returns the section's records of the pod whose sandboxes are sandboxes, as a
	// value of its own type that nobody changes afterwards; nil when it has none.
	PodView(uid types.UID, sandboxes []SandboxRecord) any
}

// PodKeeper is a PodViewer whose records make a pod known even without a sandbox (the DRA
// claims, prepared before the sandbox exists): the registry's readers see such a pod.
type PodKeeper interface {
	PodViewer
	// KeptPods are the pods the section holds records of.
	KeptPods() []PodRef
	// KeptPod reports whether the section holds records of the pod with this UID, and names it.
	KeptPod(uid types.UID) (PodRef, bool)
}

// SaveFunc is what Commit writes for the section being changed: its next state, encoded as
// Section.Save would.
type SaveFunc func(sandboxes []SandboxRecord) (Saved, error)

// Register adds a section. load is handed what the checkpoint held under the section's keys
// and sandbox keys at start-up, and takes it up, all under the registry's lock: no write comes
// between the registration and the load, so none can save the section empty over what the file
// held. When load fails, nothing is registered and the error names the checkpoint as damaged;
// the keys' data is carried through writes unchanged, as is that of every key no section owns.
func (r *Registry) Register(s Section, load func(Loaded) error) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.checkOwnerLocked(s); err != nil {
		return err
	}
	owned := Loaded{Keys: map[string]json.RawMessage{}, Fields: map[string]map[string]json.RawMessage{}}
	for _, k := range s.Keys() {
		if v, ok := r.raw[k]; ok {
			owned.Keys[k] = v
		}
	}
	fields := fieldsOf(s)
	for id, f := range r.fields {
		for _, k := range fields {
			if v, ok := f[k]; ok {
				if owned.Fields[id] == nil {
					owned.Fields[id] = map[string]json.RawMessage{}
				}
				owned.Fields[id][k] = v
			}
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
	for id, f := range r.fields {
		for _, k := range fields {
			delete(f, k)
		}
		if len(f) == 0 {
			delete(r.fields, id)
		}
	}
	r.addLocked(s)
	return nil
}

// checkOwnerLocked refuses a section that would own a key the registry or another section owns.
func (r *Registry) checkOwnerLocked(s Section) error {
	for _, k := range s.Keys() {
		if k == sandboxesKey {
			return fmt.Errorf("registry: a section cannot own %q", k)
		}
		if slices.ContainsFunc(r.sections, func(o Section) bool { return slices.Contains(o.Keys(), k) }) {
			return fmt.Errorf("registry: data key %q has a section already", k)
		}
	}
	for _, k := range fieldsOf(s) {
		if slices.Contains(recordKeys(), k) {
			return fmt.Errorf("registry: a section cannot own the sandbox key %q, the registry's", k)
		}
		if slices.ContainsFunc(r.sections, func(o Section) bool { return slices.Contains(fieldsOf(o), k) }) {
			return fmt.Errorf("registry: sandbox key %q has a section already", k)
		}
	}
	if v, ok := s.(PodViewer); ok && !slices.Contains(s.Keys(), v.ViewKey()) && !slices.Contains(fieldsOf(s), v.ViewKey()) {
		return fmt.Errorf("registry: view %q is not one of its section's keys", v.ViewKey())
	}
	return nil
}

// addLocked adds a registered section to the lists of what it does.
func (r *Registry) addLocked(s Section) {
	r.sections = append(r.sections, s)
	if w, ok := s.(SandboxWatcher); ok {
		r.watchers = append(r.watchers, w)
	}
	if w, ok := s.(AdoptWatcher); ok {
		r.adopters = append(r.adopters, w)
	}
	if o, ok := s.(Obligations); ok {
		r.obligations = append(r.obligations, o)
	}
	if v, ok := s.(PodViewer); ok {
		r.viewers = append(r.viewers, v)
	}
	if k, ok := s.(PodKeeper); ok {
		r.keepers = append(r.keepers, k)
	}
}

// fieldsOf are the sandbox keys s owns.
func fieldsOf(s Section) []string {
	if f, ok := s.(SandboxFields); ok {
		return f.Fields()
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
		if err := r.writeCommitLocked(s, next, ""); err != nil {
			return err
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

// CommitSandbox is Commit for a change of section s's records of one sandbox (a device
// recorded as attached to it): it reports false, writing and publishing nothing, when the
// registry does not hold the sandbox, and publishes only if it still holds it once the write is
// done (Remove may take it meanwhile, telling the section). The sandbox's pod is told of the
// change.
func (r *Registry) CommitSandbox(s Section, id string, next SaveFunc, publish func()) (bool, error) {
	if r.checkpoint != nil {
		r.persistMu.Lock()
		defer r.persistMu.Unlock()
		if err := r.writeCommitLocked(s, next, id); err != nil {
			if errors.Is(err, errNotRecorded) {
				return false, nil
			}
			return false, err
		}
	}
	return r.changeSandbox(id, publish), nil
}

// errNotRecorded: the sandbox a change is of is not recorded.
var errNotRecorded = errors.New("sandbox not recorded")

// writeCommitLocked writes the checkpoint with next saved for section s; when sandbox is not
// empty, only while the registry holds that sandbox (errNotRecorded). persistMu is held.
func (r *Registry) writeCommitLocked(s Section, next SaveFunc, sandbox string) error {
	r.mu.Lock()
	if _, ok := r.entries[sandbox]; sandbox != "" && !ok {
		r.mu.Unlock()
		return errNotRecorded
	}
	snap, err := r.snapshotLocked(nil, s, next)
	r.mu.Unlock()
	if err != nil {
		return err
	}
	if err := r.checkpoint.Write(snap); err != nil {
		return fmt.Errorf("pod registry: %w", err)
	}
	return nil
}

// ChangeSandbox makes a change of a section's records of one sandbox visible, for a change
// that need not be durable before it counts (a sysctl verification's result, a device given
// back): under the registry's lock it calls publish and tells the change of the sandbox's pod,
// its state before read before publish; the checkpoint follows in the background. It reports
// false, calling nothing, when the registry does not hold the sandbox.
func (r *Registry) ChangeSandbox(id string, publish func()) bool {
	ok := r.changeSandbox(id, publish)
	if ok {
		r.persistSoon()
	}
	return ok
}

// changeSandbox publishes a change of a section's records of a recorded sandbox (see
// ChangeSandbox), without writing.
func (r *Registry) changeSandbox(id string, publish func()) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.entries[id]
	if ok {
		before := r.beforeLocked(e.Pod.UID)
		publish()
		r.changedLocked(e.Pod.UID, before)
	}
	return ok
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
	d.SandboxFields = make(map[string]map[string]json.RawMessage, len(d.Sandboxes))
	for i := range d.Sandboxes {
		d.SandboxFields[d.Sandboxes[i].ID] = maps.Clone(r.fields[d.Sandboxes[i].ID])
	}
	if (len(d.Sections) > 0 || len(r.fields) > 0) && r.loadedVersion > d.Version {
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
		saved, err := save(d.Sandboxes)
		if err != nil {
			return CheckpointData{}, fmt.Errorf("pod registry: %w", err)
		}
		if err := d.add(sec, saved); err != nil {
			return CheckpointData{}, err
		}
	}
	if d.Version > checkpointV3 {
		return CheckpointData{}, errors.New("pod registry: a section asks for a checkpoint format this podgate does not write")
	}
	return d, nil
}

// add puts what section sec saved into the snapshot d.
func (d *CheckpointData) add(sec Section, saved Saved) error {
	for k, raw := range saved.Keys {
		if !slices.Contains(sec.Keys(), k) {
			return fmt.Errorf("pod registry: section saved key %q it does not own", k)
		}
		d.Sections[k] = raw
	}
	for id, fields := range saved.Fields {
		for k, raw := range fields {
			if !slices.Contains(fieldsOf(sec), k) {
				return fmt.Errorf("pod registry: section saved sandbox key %q it does not own", k)
			}
			f, ok := d.SandboxFields[id]
			if !ok {
				continue // not a sandbox of this checkpoint
			}
			if f == nil {
				f = map[string]json.RawMessage{}
				d.SandboxFields[id] = f
			}
			f[k] = raw
		}
	}
	d.Version = max(d.Version, saved.Version)
	return nil
}
