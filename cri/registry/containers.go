package registry

import (
	"slices"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"k8s.io/apimachinery/pkg/types"
)

// Cgroup verification results of a container, as recorded (and the result label of
// podgate_resources_verifications_total).
const (
	CgroupPending    = "pending"    // created, not started: nothing to check yet
	CgroupUnverified = "unverified" // found running at start-up: checked at the next recheck
	CgroupOK         = "ok"
	CgroupMismatch   = "mismatch"
	CgroupError      = "error"
)

// ContainerRecord is what podgate knows of one container's resources. A container belongs to
// a sandbox and goes with it.
type ContainerRecord struct {
	ID, Name, SandboxID string
	PodUID              types.UID
	// Origin is OriginStarted (podgate saw CreateContainer) or OriginAdopted (found in the
	// runtime at start-up).
	Origin string
	// Asked is what the container's resources should be, as the runtime spec says them: the
	// CRI request's, or for an adopted container the runtime's own spec.
	Asked       *specs.LinuxResources
	CgroupsPath string
	Held        *CgroupHeld
	// Verification is one of the Cgroup* results; Mismatches and Error say more.
	Verification string
	Mismatches   []string
	Error        string
	VerifiedAt   time.Time
}

// Clone returns a copy of c that shares nothing with it but the read-only Asked and Held.
func (c *ContainerRecord) Clone() ContainerRecord {
	out := *c
	out.Mismatches = slices.Clone(c.Mismatches)
	return out
}

// AddContainer records a container. A container whose sandbox the registry does not hold is
// recorded too (its sandbox may be recorded just after, by the start-up rebuild), and goes
// when the rebuild finds neither.
func (r *Registry) AddContainer(c ContainerRecord) {
	cc := c.Clone()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.containers[c.ID] = &cc
	r.touchLocked(c.ID)
}

// Container returns a copy of a container's record.
func (r *Registry) Container(id string) (ContainerRecord, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	c, ok := r.containers[id]
	if !ok {
		return ContainerRecord{}, false
	}
	return c.Clone(), true
}

// UpdateContainer changes a container's record with fn; false when it is not recorded.
func (r *Registry) UpdateContainer(id string, fn func(*ContainerRecord)) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	c, ok := r.containers[id]
	if ok {
		fn(c)
	}
	return ok
}

// RemoveContainer forgets a container; an unknown one is not an error.
func (r *Registry) RemoveContainer(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.containers, id)
	r.touchLocked(id)
}

// Containers returns copies of the records of the containers fn keeps (all with nil), in no
// particular order.
func (r *Registry) Containers(keep func(*ContainerRecord) bool) []ContainerRecord {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []ContainerRecord
	for _, c := range r.containers {
		if keep == nil || keep(c) {
			out = append(out, c.Clone())
		}
	}
	return out
}

// PodContainers returns copies of the records of a pod's containers.
func (r *Registry) PodContainers(uid types.UID) []ContainerRecord {
	return r.Containers(func(c *ContainerRecord) bool { return c.PodUID == uid })
}

// ContainerCount is how many containers the registry holds.
func (r *Registry) ContainerCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.containers)
}

// dropContainersOfLocked forgets the containers of a sandbox that is gone.
func (r *Registry) dropContainersOfLocked(sandboxID string) {
	for id, c := range r.containers {
		if c.SandboxID == sandboxID {
			delete(r.containers, id)
		}
	}
}

// reconcileContainersLocked makes the registry's containers those the runtime listed (seen),
// keeping what it knew of each and leaving alone those the CRI calls touched since the rebuild
// began. It returns how many it added and dropped.
func (r *Registry) reconcileContainersLocked(seen []ContainerRecord) (added, dropped int) {
	inRuntime := make(map[string]bool, len(seen))
	for i := range seen {
		c := seen[i]
		inRuntime[c.ID] = true
		if r.touched[c.ID] {
			continue
		}
		if old, ok := r.containers[c.ID]; ok {
			if old.CgroupsPath == "" {
				old.CgroupsPath = c.CgroupsPath
			}
			continue
		}
		cc := c.Clone()
		r.containers[c.ID] = &cc
		added++
	}
	for id, c := range r.containers {
		if !inRuntime[id] && !r.touched[id] {
			delete(r.containers, id)
			dropped++
			continue
		}
		if _, ok := r.entries[c.SandboxID]; !ok && !r.touched[c.SandboxID] && !r.touched[id] {
			delete(r.containers, id) // its sandbox is gone
			dropped++
		}
	}
	return added, dropped
}
