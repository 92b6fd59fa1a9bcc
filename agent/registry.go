package agent

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// Where a registry entry comes from.
const (
	// OriginStarted: podgate saw the sandbox's RunPodSandbox and ran the pipeline on it.
	OriginStarted = "started"
	// OriginAdopted: podgate found the sandbox in the runtime at start-up without having seen it
	// start (podgate was installed on a running node, or the sandbox started while podgate was
	// down). What only the pipeline knows, such as the sysctl verification, is marked as unknown.
	OriginAdopted = "adopted"
)

// Sysctl verification results, as recorded per sandbox.
const (
	SysctlsNone       = "none"       // the sandbox has no sysctls: nothing to verify
	SysctlsPending    = "pending"    // the verification runs in the background
	SysctlsOK         = "ok"         // every sysctl held inside the pod
	SysctlsRepaired   = "repaired"   // mismatches were written inside the pod (verify: repair)
	SysctlsMismatch   = "mismatch"   // mismatches were left (verify: warn)
	SysctlsError      = "error"      // the sysctls could not be read back
	SysctlsUnverified = "unverified" // podgate did not see the sandbox start
)

// PodRef names the pod a sandbox belongs to, as the kubelet's sandbox metadata does.
type PodRef struct {
	UID       types.UID `json:"uid"`
	Name      string    `json:"name"`
	Namespace string    `json:"namespace"`
	Attempt   uint32    `json:"attempt,omitempty"`
}

// SysctlRecord is what the sysctl stages did for one sandbox.
type SysctlRecord struct {
	// Asked are the sysctls the pod asked for, as the kubelet sent them.
	Asked map[string]string `json:"asked,omitempty"`
	// Applied are the sysctls forwarded to the runtime: Asked plus the node defaults.
	Applied map[string]string `json:"applied,omitempty"`
	// Verification is the result of reading them back inside the pod (Sysctls* constants).
	Verification string `json:"verification"`
	// Mismatches lists what did not hold, as name="got" (want "value").
	Mismatches []string `json:"mismatches,omitempty"`
	// Error says why the sysctls could not be verified (Verification is error).
	Error string `json:"error,omitempty"`
}

// SandboxRecord is what podgate knows of one pod sandbox. Records are values: the registry
// hands out copies.
type SandboxRecord struct {
	ID             string `json:"id"`
	Pod            PodRef `json:"pod"`
	RuntimeHandler string `json:"runtimeHandler,omitempty"`
	// Origin is OriginStarted or OriginAdopted.
	Origin string `json:"origin"`
	// Ready is false once the sandbox was stopped.
	Ready     bool      `json:"ready"`
	CreatedAt time.Time `json:"createdAt"`
	// NetNS is the path of the pod's network namespace; empty for a host-network pod.
	NetNS string `json:"netns,omitempty"`
	// HostNetwork: the pod uses the node's network namespace.
	HostNetwork bool `json:"hostNetwork,omitempty"`
	// PID is the sandbox (pause) process; 0 when the runtime did not say.
	PID          int      `json:"pid,omitempty"`
	CgroupParent string   `json:"cgroupParent,omitempty"`
	IPs          []string `json:"ips,omitempty"`
	// Status is why the runtime-derived fields above are missing, when they are.
	Status  string       `json:"status,omitempty"`
	Sysctls SysctlRecord `json:"sysctls"`
}

func (r *SandboxRecord) clone() SandboxRecord {
	c := *r
	c.IPs = slices.Clone(r.IPs)
	c.Sysctls.Asked = maps.Clone(r.Sysctls.Asked)
	c.Sysctls.Applied = maps.Clone(r.Sysctls.Applied)
	c.Sysctls.Mismatches = slices.Clone(r.Sysctls.Mismatches)
	return c
}

// The registry's readers take one of these single-method views, so a feature depends on what
// it reads and nothing else. The PodResources service and the DRA step (in packages that do not
// import agent) get adapters built on them.

// SandboxGetter returns one sandbox's record.
type SandboxGetter interface {
	Sandbox(id string) (SandboxRecord, bool)
}

// SandboxLister returns every sandbox's record, sorted by creation time then ID.
type SandboxLister interface {
	Sandboxes() []SandboxRecord
}

// PodSandboxLister returns the records of one pod's sandboxes (a pod has more than one while
// the kubelet replaces a dead sandbox).
type PodSandboxLister interface {
	PodSandboxes(uid types.UID) []SandboxRecord
}

// Registry is podgate's pod registry: a record per pod sandbox, written by the sandbox
// pipeline, kept in a checkpoint in stateDir, and rebuilt from the runtime at start-up. It is
// safe for concurrent use.
type Registry struct {
	checkpoint *Checkpoint // nil: memory only (tests)

	mu      sync.Mutex
	entries map[string]*SandboxRecord
	// touched holds the IDs the pipeline added or removed while a rebuild from the runtime is
	// under way: the rebuild's older view of those must not win.
	touched    map[string]bool
	rebuilding int

	// persistMu orders checkpoint writes: each write takes its snapshot under it, so a later
	// change is never overwritten by an earlier snapshot.
	persistMu sync.Mutex
}

var (
	_ SandboxGetter    = (*Registry)(nil)
	_ SandboxLister    = (*Registry)(nil)
	_ PodSandboxLister = (*Registry)(nil)
)

// NewRegistry creates a registry that persists to cp (nil: memory only), holding the records
// already in it.
func NewRegistry(cp *Checkpoint, records []SandboxRecord) *Registry {
	r := &Registry{checkpoint: cp, entries: map[string]*SandboxRecord{}, touched: map[string]bool{}}
	for i := range records {
		rec := records[i].clone()
		r.entries[rec.ID] = &rec
	}
	return r
}

// Sandbox implements SandboxGetter.
func (r *Registry) Sandbox(id string) (SandboxRecord, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.entries[id]
	if !ok {
		return SandboxRecord{}, false
	}
	return e.clone(), true
}

// Sandboxes implements SandboxLister.
func (r *Registry) Sandboxes() []SandboxRecord {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.sortedLocked(func(*SandboxRecord) bool { return true })
}

// PodSandboxes implements PodSandboxLister.
func (r *Registry) PodSandboxes(uid types.UID) []SandboxRecord {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.sortedLocked(func(e *SandboxRecord) bool { return e.Pod.UID == uid })
}

func (r *Registry) sortedLocked(keep func(*SandboxRecord) bool) []SandboxRecord {
	out := make([]SandboxRecord, 0, len(r.entries))
	for _, e := range r.entries {
		if keep(e) {
			out = append(out, e.clone())
		}
	}
	slices.SortFunc(out, func(a, b SandboxRecord) int {
		if c := a.CreatedAt.Compare(b.CreatedAt); c != 0 {
			return c
		}
		return compareStrings(a.ID, b.ID)
	})
	return out
}

func compareStrings(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Add records a sandbox and persists the registry. On a persistence error the record is not
// kept: the caller undoes what it did for the sandbox.
func (r *Registry) Add(rec SandboxRecord) error {
	if rec.ID == "" {
		return errors.New("registry: record without a sandbox ID")
	}
	c := rec.clone()
	r.mu.Lock()
	prev := r.entries[rec.ID]
	r.entries[rec.ID] = &c
	r.touchLocked(rec.ID)
	r.mu.Unlock()
	if err := r.persist(); err != nil {
		r.mu.Lock()
		if prev != nil {
			r.entries[rec.ID] = prev
		} else {
			delete(r.entries, rec.ID)
		}
		r.mu.Unlock()
		return err
	}
	return nil
}

// Update changes a sandbox's record with fn and persists the registry. It reports false when
// the sandbox is not (or no longer) recorded.
func (r *Registry) Update(id string, fn func(*SandboxRecord)) (bool, error) {
	r.mu.Lock()
	e, ok := r.entries[id]
	if ok {
		fn(e)
	}
	r.mu.Unlock()
	if !ok {
		return false, nil
	}
	return true, r.persist()
}

// Remove forgets a sandbox and persists the registry. Forgetting an unknown sandbox is not an
// error: Stop and Remove are idempotent.
func (r *Registry) Remove(id string) error {
	r.mu.Lock()
	_, ok := r.entries[id]
	delete(r.entries, id)
	r.touchLocked(id)
	r.mu.Unlock()
	if !ok {
		return nil
	}
	return r.persist()
}

func (r *Registry) touchLocked(id string) {
	if r.rebuilding > 0 {
		r.touched[id] = true
	}
}

// beginRebuild marks the start of a rebuild from the runtime; the returned function ends it.
func (r *Registry) beginRebuild() (end func()) {
	r.mu.Lock()
	r.rebuilding++
	r.mu.Unlock()
	return func() {
		r.mu.Lock()
		if r.rebuilding--; r.rebuilding == 0 {
			clear(r.touched)
		}
		r.mu.Unlock()
	}
}

// reconcile makes the registry hold exactly the sandboxes the runtime listed (seen), keeping
// what the registry already knew of each: a sandbox it knew keeps its origin and pipeline
// results with the runtime's view refreshed; one it did not know is added as adopted; one the
// runtime no longer has is dropped. Sandboxes the pipeline touched since beginRebuild are left
// as the pipeline made them. It returns how many records it added and dropped.
func (r *Registry) reconcile(seen []SandboxRecord) (added, dropped int, err error) {
	r.mu.Lock()
	inRuntime := make(map[string]bool, len(seen))
	for i := range seen {
		rec := seen[i]
		inRuntime[rec.ID] = true
		if r.touched[rec.ID] {
			continue
		}
		if old, ok := r.entries[rec.ID]; ok {
			refreshed := old.clone()
			refreshed.refreshFromRuntime(&rec)
			r.entries[rec.ID] = &refreshed
			continue
		}
		c := rec.clone()
		r.entries[rec.ID] = &c
		added++
	}
	for id := range r.entries {
		if !inRuntime[id] && !r.touched[id] {
			delete(r.entries, id)
			dropped++
		}
	}
	r.mu.Unlock()
	return added, dropped, r.persist()
}

// refreshFromRuntime copies what the runtime reports from seen into r.
func (r *SandboxRecord) refreshFromRuntime(seen *SandboxRecord) {
	r.Ready = seen.Ready
	r.NetNS, r.HostNetwork, r.PID = seen.NetNS, seen.HostNetwork, seen.PID
	r.CgroupParent, r.IPs, r.Status = seen.CgroupParent, slices.Clone(seen.IPs), seen.Status
	if r.RuntimeHandler == "" {
		r.RuntimeHandler = seen.RuntimeHandler
	}
}

func (r *Registry) persist() error {
	if r.checkpoint == nil {
		return nil
	}
	r.persistMu.Lock()
	defer r.persistMu.Unlock()
	snap := r.Sandboxes()
	if err := r.checkpoint.Write(snap); err != nil {
		return fmt.Errorf("pod registry: %w", err)
	}
	return nil
}

// Len is the number of sandboxes recorded.
func (r *Registry) Len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.entries)
}
