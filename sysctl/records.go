package sysctl

// The sysctl records: what the stages did for each sandbox, the feature's part of each sandbox
// object in the pod registry's checkpoint.

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"sync"

	"k8s.io/apimachinery/pkg/types"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podgate/podgate/cri/registry"
)

// Sysctl verification results, as recorded per sandbox (Record.Verification).
const (
	ResultNone       = "none"       // the sandbox has no sysctls: nothing to verify
	ResultPending    = "pending"    // the verification runs in the background
	ResultOK         = "ok"         // every sysctl held inside the pod
	ResultRepaired   = "repaired"   // mismatches were written inside the pod (verify: repair)
	ResultMismatch   = "mismatch"   // mismatches were left (verify: warn)
	ResultError      = "error"      // the sysctls could not be read back
	ResultUnverified = "unverified" // podgate did not see the sandbox start
)

// Record is what the sysctl stages did for one sandbox.
type Record struct {
	// Asked are the sysctls the pod asked for, as the kubelet sent them.
	Asked map[string]string `json:"asked,omitempty"`
	// Applied are the sysctls forwarded to the runtime: Asked plus the node defaults.
	Applied map[string]string `json:"applied,omitempty"`
	// Verification is the result of reading them back inside the pod (Result* constants).
	Verification string `json:"verification"`
	// Mismatches lists what did not hold, as name="got" (want "value").
	Mismatches []string `json:"mismatches,omitempty"`
	// Error says why the sysctls could not be verified (Verification is error).
	Error string `json:"error,omitempty"`
}

// Clone returns a deep copy of r.
func (r *Record) Clone() Record {
	c := *r
	c.Asked, c.Applied, c.Mismatches = maps.Clone(r.Asked), maps.Clone(r.Applied), slices.Clone(r.Mismatches)
	return c
}

// recordKey is the records' key in each sandbox object of the registry's checkpoint.
const recordKey = "sysctls"

// Records are the sysctl records of the sandboxes, by sandbox ID: the feature's section of the
// pod registry's checkpoint, a "sysctls" key in each sandbox object, written for every sandbox
// (a sandbox without a record has the empty one, as podgate always wrote it). The registry
// shows them with each pod (InPod reads them), tells them of sandboxes it adopts (what the
// runtime applied, unverified) and of those that go.
type Records struct {
	reg *registry.Registry
	// mu is taken after the registry's lock, never before.
	mu sync.Mutex
	m  map[string]*Record
}

var (
	_ registry.SandboxFields  = (*Records)(nil)
	_ registry.SandboxWatcher = (*Records)(nil)
	_ registry.AdoptWatcher   = (*Records)(nil)
	_ registry.PodViewer      = (*Records)(nil)
)

// NewRecords returns the sysctl records of reg, holding those reg's checkpoint held. Build it
// before anything writes the checkpoint. A record that does not decode is an error naming the
// checkpoint as damaged.
func NewRecords(reg *registry.Registry) (*Records, error) {
	r := &Records{reg: reg, m: map[string]*Record{}}
	if err := reg.Register(r, r.load); err != nil {
		return nil, err
	}
	return r, nil
}

func (r *Records) load(l registry.Loaded) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	for id, f := range l.Fields {
		raw, ok := f[recordKey]
		if !ok {
			continue
		}
		var rec Record
		if err := json.Unmarshal(raw, &rec); err != nil {
			return fmt.Errorf("sandbox %s %s: %w", id, recordKey, err)
		}
		r.m[id] = &rec
	}
	return nil
}

// Keys implements registry.Section: the records are in the sandbox objects only.
func (r *Records) Keys() []string { return nil }

// Fields implements registry.SandboxFields.
func (r *Records) Fields() []string { return []string{recordKey} }

// Save implements registry.Section: each sandbox's record, the empty one for a sandbox without.
func (r *Records) Save(sandboxes []registry.SandboxRecord) (registry.Saved, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := registry.Saved{Fields: make(map[string]map[string]json.RawMessage, len(sandboxes))}
	for i := range sandboxes {
		rec := r.m[sandboxes[i].ID]
		if rec == nil {
			rec = &Record{}
		}
		b, err := json.Marshal(rec)
		if err != nil {
			return registry.Saved{}, fmt.Errorf("sandbox %s %s: %w", sandboxes[i].ID, recordKey, err)
		}
		out.Fields[sandboxes[i].ID] = map[string]json.RawMessage{recordKey: b}
	}
	return out, nil
}

// SandboxSet implements registry.SandboxWatcher: the record is set by the stages already.
func (r *Records) SandboxSet(*registry.SandboxRecord) {}

// SandboxGone implements registry.SandboxWatcher: the record goes with its sandbox.
func (r *Records) SandboxGone(rec *registry.SandboxRecord) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.m, rec.ID)
}

// SandboxAdopted implements registry.AdoptWatcher: a sandbox podgate did not see start has the
// sysctls the runtime was given (what the pod itself asked for is lost with the call), not
// verified. A record the stages made already (the sandbox started while the rebuild listed the
// runtime) is theirs, and stays.
func (r *Records) SandboxAdopted(rec *registry.SandboxRecord, cfg *runtimeapi.PodSandboxConfig) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.m[rec.ID]; !ok {
		r.m[rec.ID] = &Record{Applied: maps.Clone(cfg.GetLinux().GetSysctls()), Verification: ResultUnverified}
	}
}

// ViewKey implements registry.PodViewer.
func (r *Records) ViewKey() string { return recordKey }

// PodView implements registry.PodViewer: the records of the pod's sandboxes, by sandbox ID
// (a map[string]Record; InPod reads it).
func (r *Records) PodView(_ types.UID, sandboxes []registry.SandboxRecord) any {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out map[string]Record
	for i := range sandboxes {
		if rec, ok := r.m[sandboxes[i].ID]; ok {
			if out == nil {
				out = make(map[string]Record, len(sandboxes))
			}
			out[sandboxes[i].ID] = rec.Clone()
		}
	}
	if out == nil {
		return nil
	}
	return out
}

// InPod returns the sysctl records of a pod's sandboxes, by sandbox ID, as the registry read
// them with the pod's state; none when the feature has none (or is not registered).
func InPod(st *registry.PodState) map[string]Record {
	v, _ := st.View(recordKey).(map[string]Record)
	return v
}

// Sandbox returns a copy of the sandbox's record.
func (r *Records) Sandbox(id string) (Record, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	rec, ok := r.m[id]
	if !ok {
		return Record{}, false
	}
	return rec.Clone(), true
}

// set records what the stages did for a sandbox RunPodSandbox is starting: it shows once the
// registry records the sandbox (or at once, when a rebuild adopted it meanwhile).
func (r *Records) set(id string, rec Record) {
	c := rec.Clone()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.m[id] = &c
}

// update changes a recorded sandbox's record with fn, its pod told of the change; the
// checkpoint follows in the background. A sandbox gone meanwhile is left alone.
func (r *Records) update(id string, fn func(*Record)) {
	r.reg.ChangeSandbox(id, func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		if rec, ok := r.m[id]; ok {
			fn(rec)
		}
	})
}

// forget drops the record of a sandbox whose RunPodSandbox failed after the stages made it.
func (r *Records) forget(id string) {
	drop := func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		delete(r.m, id)
	}
	if !r.reg.ChangeSandbox(id, drop) {
		drop() // not recorded: nobody sees it
	}
}
