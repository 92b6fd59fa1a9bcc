package resources

import (
	"slices"
	"sync"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/podgate/podgate/cri/registry"
	"github.com/podgate/podgate/podresources/cgroup"
)

// Cgroup verification results of a container or a pod cgroup, as recorded (and the result
// label of podgate_resources_verifications_total).
const (
	ResultPending    = "pending"    // created, not started: nothing to check yet
	ResultUnverified = "unverified" // found running at start-up: checked at the next recheck
	ResultOK         = "ok"
	ResultMismatch   = "mismatch"
	ResultError      = "error"
)

// container is what the feature knows of one container's resources: what they should be and
// the last verification of its cgroup. The pod registry holds the container itself (its
// sandbox, its cgroups path), and tells the feature when it goes.
type container struct {
	// asked is what the container's resources should be, as the runtime spec says them: the
	// CRI request's, or for an adopted container the runtime's own spec. Never changed in
	// place: replaced whole.
	asked *specs.LinuxResources
	// held is what its cgroup held at the last verification; never changed in place.
	held *cgroup.Held
	// verification is one of the Result* constants; mismatches and err say more.
	verification string
	mismatches   []string
	err          string
	verifiedAt   time.Time
}

// containers are the feature's records of the containers, by ID, memory only (the runtime
// holds the containers, and the start-up rebuild reads them back). The registry tells them of
// the containers it adopts and forgets.
type containers struct {
	// mu is taken after the registry's lock, never before.
	mu sync.Mutex
	m  map[string]*container
}

var _ registry.ContainerWatcher = (*containers)(nil)

func newContainers() *containers { return &containers{m: map[string]*container{}} }

// ContainerAdopted implements registry.ContainerWatcher: a container found at start-up asks what
// its runtime spec says; a running one is verified at the next recheck, a created one once it
// starts. A record the CRI hooks made already (the container was created while the rebuild
// listed the runtime) is theirs, and stays.
func (cs *containers) ContainerAdopted(c *registry.ContainerRecord, a registry.AdoptedContainer) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if _, ok := cs.m[c.ID]; ok {
		return
	}
	e := &container{asked: a.Resources, verification: ResultUnverified}
	if a.Created {
		e.verification = ResultPending
	}
	if a.Err != nil {
		e.err = a.Err.Error()
	}
	cs.m[c.ID] = e
}

// ContainerGone implements registry.ContainerWatcher.
func (cs *containers) ContainerGone(id string) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	delete(cs.m, id)
}

// set records a container the hooks learnt of (created, or resized before the rebuild).
func (cs *containers) set(id string, e container) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	cs.m[id] = &e
}

// get returns a copy of the container's record.
func (cs *containers) get(id string) (container, bool) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	e, ok := cs.m[id]
	if !ok {
		return container{}, false
	}
	c := *e
	c.mismatches = slices.Clone(e.mismatches)
	return c, true
}

// update changes the container's record with fn; false when it has none.
func (cs *containers) update(id string, fn func(*container)) bool {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	e, ok := cs.m[id]
	if ok {
		fn(e)
	}
	return ok
}

// started are the containers checked once already or found running at start-up: those a
// recheck reads again.
func (cs *containers) started() []string {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	var ids []string
	for id, e := range cs.m {
		if e.verification != ResultPending {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids
}
