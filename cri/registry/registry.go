package registry

import (
	"encoding/json"
	"errors"
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

// PodRef names the pod a sandbox belongs to, as the kubelet's sandbox metadata does.
type PodRef struct {
	UID       types.UID `json:"uid"`
	Name      string    `json:"name"`
	Namespace string    `json:"namespace"`
	Attempt   uint32    `json:"attempt,omitempty"`
}

// SandboxRecord is the registry's own record of one pod sandbox: its identity and lifecycle.
// What a feature did for the sandbox is the feature's record (its sysctls, the devices
// attached to it), kept in the feature's section. Records are values: the registry hands out
// copies.
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
	PID          int    `json:"pid,omitempty"`
	CgroupParent string `json:"cgroupParent,omitempty"`
	// CgroupsPath is the sandbox's linux.cgroupsPath in its runtime spec: its form says the
	// runtime's cgroup driver (systemd "slice:prefix:name", or a cgroupfs path).
	CgroupsPath string   `json:"cgroupsPath,omitempty"`
	IPs         []string `json:"ips,omitempty"`
	// Status is why the runtime-derived fields above are missing, when they are.
	Status string `json:"status,omitempty"`
}

// Clone returns a deep copy of r.
func (r *SandboxRecord) Clone() SandboxRecord {
	c := *r
	c.IPs = slices.Clone(r.IPs)
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
// pipeline, kept in a checkpoint in stateDir, and rebuilt from the runtime at start-up. The
// features keep their own records of the sandboxes and pods, as sections of the same
// checkpoint (Register). It is safe for concurrent use.
type Registry struct {
	checkpoint *Checkpoint // nil: memory only (tests)

	mu      sync.Mutex
	entries map[string]*SandboxRecord
	// containers are the sandboxes' containers, by ID. They are not in the checkpoint: the
	// runtime holds them, and the start-up rebuild reads them from it.
	containers map[string]*ContainerRecord
	// sections are the features' parts of the checkpoint (Register); raw holds the data keys
	// of the checkpoint read at start-up that no section took up, fields the keys of its
	// sandbox objects that no section took up (by sandbox ID, then key), both carried through
	// every write. loadedVersion is that file's format.
	sections      []Section
	raw           map[string]json.RawMessage
	fields        map[string]map[string]json.RawMessage
	loadedVersion int
	// The sections by what else they do (section.go): told of sandbox records set and gone,
	// of sandboxes adopted, of containers; asked whether a record is an obligation, for their
	// view of a pod, for the pods they keep.
	watchers    []SandboxWatcher
	adopters    []AdoptWatcher
	obligations []Obligations
	viewers     []PodViewer
	keepers     []PodKeeper
	ctrWatchers []ContainerWatcher
	// touched holds the IDs the pipeline added or removed while a rebuild from the runtime is
	// under way: the rebuild's older view of those must not win.
	touched    map[string]bool
	rebuilding int
	// revision counts the changes; onChange is told of each (OnPodChange).
	revision uint64
	onChange PodChangeFunc

	// persistMu orders checkpoint writes: each write takes its snapshot under it, so a later
	// change is never overwritten by an earlier snapshot. Lock order: a section's own change
	// lock (the claim store's), persistMu, mu, a section's own state lock (Save, watchers).
	persistMu sync.Mutex
	// writeQueued: a background write is due and has not taken its snapshot yet; changes made
	// meanwhile are in it. Guarded by mu.
	writeQueued bool
	// writeDelay is how long a queued write waits for more changes to join it; kick, closed by
	// Flush, ends the queued write's wait. Guarded by mu.
	writeDelay time.Duration
	kick       chan struct{}
	// lastWrite is when the last background write took its snapshot (WriteInterval). Guarded
	// by mu.
	lastWrite time.Time
	// writes counts the background writes queued or running, guarded by mu; written is
	// broadcast when one ends. (A WaitGroup would not do: Flush may wait while a change
	// queues a write.)
	writes  int
	written *sync.Cond
	// writeFailed is told of a background write that failed.
	writeFailed func(error)
}

var (
	_ SandboxGetter    = (*Registry)(nil)
	_ SandboxLister    = (*Registry)(nil)
	_ PodSandboxLister = (*Registry)(nil)
)

// Option configures a Registry.
type Option func(*Registry)

// WithWriteDelay sets how long a background write waits for more changes (WriteDelay unless
// set; 0: it starts at once, WriteInterval after the last one or not).
func WithWriteDelay(d time.Duration) Option { return func(r *Registry) { r.writeDelay = d } }

// WithWriteErrors tells fn of every background checkpoint write that failed (a log line and a
// metric).
func WithWriteErrors(fn func(error)) Option { return func(r *Registry) { r.writeFailed = fn } }

// WithPodChanges tells fn of every change of a pod (PodChangeFunc).
func WithPodChanges(fn PodChangeFunc) Option { return func(r *Registry) { r.onChange = fn } }

// NewRegistry creates a registry that persists to cp (nil: memory only), holding what it
// already holds: the sandboxes, and the sections' data for them to take up (Register). The
// sections register before anything writes the checkpoint; a key none takes up is carried
// through writes unchanged.
func NewRegistry(cp *Checkpoint, d CheckpointData, opts ...Option) *Registry {
	r := &Registry{
		checkpoint: cp, entries: map[string]*SandboxRecord{}, containers: map[string]*ContainerRecord{}, touched: map[string]bool{},
		raw: maps.Clone(d.Sections), fields: map[string]map[string]json.RawMessage{}, loadedVersion: d.Version,
		writeFailed: func(error) {}, writeDelay: WriteDelay,
	}
	for _, o := range opts {
		o(r)
	}
	r.written = sync.NewCond(&r.mu)
	for i := range d.Sandboxes {
		rec := d.Sandboxes[i].Clone()
		r.entries[rec.ID] = &rec
		if f := d.SandboxFields[rec.ID]; len(f) > 0 {
			r.fields[rec.ID] = maps.Clone(f)
		}
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
	return e.Clone(), true
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
	var out []SandboxRecord // most callers keep few: no room for every entry up front
	for _, e := range r.entries {
		if keep(e) {
			out = append(out, e.Clone())
		}
	}
	slices.SortFunc(out, compareSandboxes)
	return out
}

// compareSandboxes orders sandboxes by creation time, then ID.
func compareSandboxes(a, b SandboxRecord) int {
	if c := a.CreatedAt.Compare(b.CreatedAt); c != 0 {
		return c
	}
	return compareStrings(a.ID, b.ID)
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

// Add records a sandbox; the checkpoint follows in the background. A sandbox record is not an
// obligation: what a crash loses of it, the start-up rebuild finds again in the runtime (as
// adopted), so a pod start never waits for the disk, nor fails because of it.
//
// Unless a section's records of the sandbox are one (Obligations): DRA devices podgate
// attached to the pod, which nothing else finds after a crash — the rebuild adopts the sandbox
// without them, and its stop gives back only what its record holds, so a virtual interface
// would be destroyed with the pod's namespace and a physical one come back to the host under
// its pod name. Such a record counts only once the checkpoint holds it, as the DRA claims'
// changes do (Commit): Add returns after the write, and changes nothing when the write fails.
// The sections are told of the record (SandboxWatcher) once it is published: the attach
// section drops the intents the record's write replaced.
func (r *Registry) Add(rec SandboxRecord) error {
	if rec.ID == "" {
		return errors.New("registry: record without a sandbox ID")
	}
	c := rec.Clone()
	durable := r.checkpoint != nil && r.obliged(rec.ID)
	if durable {
		// Held until the record is published: a background write in between would snapshot
		// the registry of before and overwrite this one.
		r.persistMu.Lock()
		defer r.persistMu.Unlock()
		if err := r.writeWithLocked(c); err != nil {
			return err
		}
	}
	r.mu.Lock()
	if old, ok := r.entries[rec.ID]; ok && old.Pod.UID != rec.Pod.UID {
		before := r.beforeLocked(old.Pod.UID)
		delete(r.entries, rec.ID)
		r.changedLocked(old.Pod.UID, before)
	}
	before := r.beforeLocked(rec.Pod.UID)
	r.entries[rec.ID] = &c
	for _, w := range r.watchers {
		w.SandboxSet(&c)
	}
	r.touchLocked(rec.ID)
	r.changedLocked(rec.Pod.UID, before)
	r.mu.Unlock()
	if !durable {
		r.persistSoon()
	}
	return nil
}

// obliged reports whether a section's records of sandbox id are an obligation (see Add).
func (r *Registry) obliged(id string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.ContainsFunc(r.obligations, func(o Obligations) bool { return o.Obliged(id) })
}

// Update changes a sandbox's record with fn; the checkpoint follows in the background. It
// reports false when the sandbox is not (or no longer) recorded.
func (r *Registry) Update(id string, fn func(*SandboxRecord)) bool {
	r.mu.Lock()
	e, ok := r.entries[id]
	if ok {
		uid := e.Pod.UID
		before := r.beforeLocked(uid)
		fn(e)
		e.Pod.UID = uid // a sandbox never moves to another pod
		r.changedLocked(uid, before)
	}
	r.mu.Unlock()
	if ok {
		r.persistSoon()
	}
	return ok
}

// Remove forgets a sandbox, and what the checkpoint carries for it that no section owns; the
// checkpoint follows in the background. Forgetting an unknown sandbox is not an error: Stop
// and Remove are idempotent. The sections are told the record goes (SandboxWatcher): devices
// attached to it (the sandbox was stopped past podgate) become left attach intents, to be
// given back.
func (r *Registry) Remove(id string) {
	r.mu.Lock()
	e, ok := r.entries[id]
	if ok {
		before := r.beforeLocked(e.Pod.UID)
		r.dropLocked(e)
		r.changedLocked(e.Pod.UID, before)
	}
	r.dropContainersOfLocked(id)
	r.touchLocked(id)
	r.mu.Unlock()
	if ok {
		r.persistSoon()
	}
}

// dropLocked forgets rec, telling the sections it goes.
func (r *Registry) dropLocked(rec *SandboxRecord) {
	for _, w := range r.watchers {
		w.SandboxGone(rec)
	}
	delete(r.entries, rec.ID)
	delete(r.fields, rec.ID)
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
// what the registry already knew of each: a sandbox it knew keeps its origin with the
// runtime's view refreshed; one it did not know is added as adopted, the sections told of it
// with what the runtime holds of it (AdoptWatcher); one the runtime no longer has is dropped,
// the sections told it goes (the devices attached to it become left attach intents).
// Sandboxes the pipeline touched since beginRebuild are left as the pipeline made them. The
// containers are reconciled the same way with containers, and those of a sandbox that is gone
// go with it. It returns how many sandbox records it added and dropped.
func (r *Registry) reconcile(seen []runtimeSandbox, containers []runtimeContainer) (added, dropped int) {
	r.mu.Lock()
	// The pods it changes, with their states before, to tell the change function after.
	befores := map[types.UID]*PodState{}
	noteBefore := func(uid types.UID) {
		if _, ok := befores[uid]; !ok {
			befores[uid] = r.beforeLocked(uid)
		}
	}
	for _, e := range r.entries {
		noteBefore(e.Pod.UID)
	}
	for i := range seen {
		noteBefore(seen[i].Pod.UID)
	}
	inRuntime := make(map[string]bool, len(seen))
	for i := range seen {
		rec := seen[i].SandboxRecord
		inRuntime[rec.ID] = true
		if r.touched[rec.ID] {
			continue
		}
		if old, ok := r.entries[rec.ID]; ok {
			refreshed := old.Clone()
			refreshed.refreshFromRuntime(&rec)
			r.entries[rec.ID] = &refreshed
			continue
		}
		c := rec.Clone()
		r.entries[rec.ID] = &c
		for _, w := range r.adopters {
			w.SandboxAdopted(&c, seen[i].config)
		}
		added++
	}
	for id, e := range r.entries {
		if !inRuntime[id] && !r.touched[id] {
			r.dropLocked(e)
			dropped++
		}
	}
	r.reconcileContainersLocked(containers)
	uids := slices.Collect(maps.Keys(befores))
	slices.Sort(uids)
	for _, uid := range uids {
		r.changedLocked(uid, befores[uid])
	}
	r.mu.Unlock()
	r.persistSoon()
	return added, dropped
}

// refreshFromRuntime copies what the runtime reports from seen into r, readiness included.
func (r *SandboxRecord) refreshFromRuntime(seen *SandboxRecord) {
	r.Ready = seen.Ready
	r.FillFromRuntime(seen)
}

// FillFromRuntime copies what the runtime reports of the sandbox's make-up from seen into r:
// netns, pause PID, IPs, cgroup parent. Readiness is left alone: a status read while
// RunPodSandbox answered may land after the sandbox was stopped.
func (r *SandboxRecord) FillFromRuntime(seen *SandboxRecord) {
	r.NetNS, r.HostNetwork, r.PID = seen.NetNS, seen.HostNetwork, seen.PID
	r.CgroupParent, r.IPs, r.Status = seen.CgroupParent, slices.Clone(seen.IPs), seen.Status
	r.CgroupsPath = seen.CgroupsPath
	if r.RuntimeHandler == "" {
		r.RuntimeHandler = seen.RuntimeHandler
	}
}

// Len is the number of sandboxes recorded.
func (r *Registry) Len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.entries)
}
