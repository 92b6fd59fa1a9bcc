package registry

import (
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"k8s.io/apimachinery/pkg/types"
)

// ContainerRecord is the registry's record of one container: its identity, its sandbox, and
// its cgroup. What a feature knows of it (the resources it asks for, what its cgroup held) is
// the feature's own. A container belongs to a sandbox and goes with it.
type ContainerRecord struct {
	ID, Name, SandboxID string
	PodUID              types.UID
	// Origin is OriginStarted (podgate saw CreateContainer) or OriginAdopted (found in the
	// runtime at start-up).
	Origin string
	// CgroupsPath is the container's linux.cgroupsPath; empty until known.
	CgroupsPath string
}

// Clone returns a copy of c.
func (c *ContainerRecord) Clone() ContainerRecord { return *c }

// ContainerWatcher is a feature told of the containers the registry learns of from the runtime
// and of those it forgets, under the registry's lock (it must not call the registry): a
// feature keeps its own records of containers, and drops them with the registry's.
type ContainerWatcher interface {
	// ContainerAdopted is told of a container the start-up rebuild found in the runtime
	// without podgate having seen it created, with what the runtime says of it.
	ContainerAdopted(c *ContainerRecord, a AdoptedContainer)
	// ContainerGone is told of a container the registry forgets: removed, gone from the
	// runtime, or gone with its sandbox.
	ContainerGone(id string)
}

// AdoptedContainer is what the runtime says of a container the rebuild adopts.
type AdoptedContainer struct {
	// Created: the container is created and not started yet.
	Created bool
	// Resources are what its runtime spec asks for (linux.resources); nil when it asks none or
	// could not be read.
	Resources *specs.LinuxResources
	// Err says why its runtime spec could not be read; nil when it was.
	Err error
}

// runtimeContainer is a container as the rebuild found it in the runtime.
type runtimeContainer struct {
	ContainerRecord
	AdoptedContainer
}

// WatchContainers tells w of the containers adopted and gone from now on.
func (r *Registry) WatchContainers(w ContainerWatcher) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ctrWatchers = append(r.ctrWatchers, w)
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
	r.forgetContainerLocked(id)
	r.touchLocked(id)
}

// forgetContainerLocked forgets a container, telling the watchers.
func (r *Registry) forgetContainerLocked(id string) {
	if _, ok := r.containers[id]; !ok {
		return
	}
	delete(r.containers, id)
	for _, w := range r.ctrWatchers {
		w.ContainerGone(id)
	}
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
			r.forgetContainerLocked(id)
		}
	}
}

// reconcileContainersLocked makes the registry's containers those the runtime listed (seen),
// keeping what it knew of each and leaving alone those the CRI calls touched since the rebuild
// began; the watchers are told of those it adopts and drops. It returns how many it added and
// dropped.
func (r *Registry) reconcileContainersLocked(seen []runtimeContainer) (added, dropped int) {
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
		for _, w := range r.ctrWatchers {
			w.ContainerAdopted(&cc, c.AdoptedContainer)
		}
		added++
	}
	for id, c := range r.containers {
		if !inRuntime[id] && !r.touched[id] {
			r.forgetContainerLocked(id)
			dropped++
			continue
		}
		if _, ok := r.entries[c.SandboxID]; !ok && !r.touched[c.SandboxID] && !r.touched[id] {
			r.forgetContainerLocked(id) // its sandbox is gone
			dropped++
		}
	}
	return added, dropped
}
