package registry

import (
	"slices"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

func containerIDs(r *Registry) []string {
	var ids []string
	for _, c := range r.Containers(nil) {
		ids = append(ids, c.ID)
	}
	slices.Sort(ids)
	return ids
}

// TestContainersGoWithTheirSandbox: a sandbox's containers go when it is removed, and when the
// rebuild finds it gone from the runtime, however it went.
func TestContainersGoWithTheirSandbox(t *testing.T) {
	reg := NewRegistry(nil, CheckpointData{Sandboxes: []SandboxRecord{sampleRecord("a"), sampleRecord("b"), sampleRecord("c")}})
	for _, c := range []ContainerRecord{{ID: "a1", SandboxID: "a"}, {ID: "a2", SandboxID: "a"}, {ID: "b1", SandboxID: "b"}, {ID: "c1", SandboxID: "c"}} {
		reg.AddContainer(c)
	}
	reg.Remove("a")
	if got := containerIDs(reg); !slices.Equal(got, []string{"b1", "c1"}) {
		t.Errorf("after removing sandbox a: containers %v, want b1 c1", got)
	}
	// The runtime lost sandbox c (removed straight at containerd) and container b1's listing
	// still shows it.
	added, dropped := reg.reconcile(inRuntime(sampleRecord("b")), []runtimeContainer{{ContainerRecord: ContainerRecord{ID: "b1", SandboxID: "b"}}})
	if added != 0 || dropped != 1 {
		t.Errorf("reconcile added %d, dropped %d sandboxes; want 0, 1", added, dropped)
	}
	if got := containerIDs(reg); !slices.Equal(got, []string{"b1"}) {
		t.Errorf("after the rebuild: containers %v, want b1", got)
	}
}

// TestReconcileKeepsContainersTheCallsTouched: a container created while the rebuild lists the
// runtime is not dropped by the rebuild's older listing, and one removed meanwhile not re-added.
func TestReconcileKeepsContainersTheCallsTouched(t *testing.T) {
	reg := NewRegistry(nil, CheckpointData{Sandboxes: []SandboxRecord{sampleRecord("a")}})
	reg.AddContainer(ContainerRecord{ID: "old", SandboxID: "a"})
	end := reg.beginRebuild()
	reg.AddContainer(ContainerRecord{ID: "new", SandboxID: "a", Origin: OriginStarted})
	reg.RemoveContainer("old")
	reg.reconcile(inRuntime(sampleRecord("a")), []runtimeContainer{{ContainerRecord: ContainerRecord{ID: "old", SandboxID: "a", Origin: OriginAdopted}}})
	end()
	if got := containerIDs(reg); !slices.Equal(got, []string{"new"}) {
		t.Errorf("containers %v, want new only", got)
	}
	if c, _ := reg.Container("new"); c.Origin != OriginStarted {
		t.Errorf("new container's origin %q, want started", c.Origin)
	}
}

// ctrWatcher records what the registry tells it of containers.
type ctrWatcher struct {
	adopted map[string]AdoptedContainer
	gone    []string
}

func (w *ctrWatcher) ContainerAdopted(c *ContainerRecord, a AdoptedContainer) { w.adopted[c.ID] = a }
func (w *ctrWatcher) ContainerGone(id string)                                 { w.gone = append(w.gone, id) }

// TestContainerWatchersTold: a container watcher is told of each container the rebuild adopts,
// with what the runtime says of it, and of each container the registry forgets, however.
func TestContainerWatchersTold(t *testing.T) {
	reg := NewRegistry(nil, CheckpointData{Sandboxes: []SandboxRecord{sampleRecord("a"), sampleRecord("b")}})
	w := &ctrWatcher{adopted: map[string]AdoptedContainer{}}
	reg.WatchContainers(w)
	reg.AddContainer(ContainerRecord{ID: "a1", SandboxID: "a", Origin: OriginStarted})
	reg.AddContainer(ContainerRecord{ID: "gone", SandboxID: "b", Origin: OriginStarted})
	limit := int64(64 << 20)
	seen := []runtimeContainer{
		{ContainerRecord: ContainerRecord{ID: "a1", SandboxID: "a"}},
		{ContainerRecord: ContainerRecord{ID: "b1", SandboxID: "b", Origin: OriginAdopted},
			AdoptedContainer: AdoptedContainer{Created: true, Resources: &specs.LinuxResources{Memory: &specs.LinuxMemory{Limit: &limit}}}},
	}
	reg.reconcile(inRuntime(sampleRecord("a"), sampleRecord("b")), seen)
	if len(w.adopted) != 1 || !w.adopted["b1"].Created || *w.adopted["b1"].Resources.Memory.Limit != limit {
		t.Errorf("told of adopted %+v, want b1 created with its resources", w.adopted)
	}
	reg.RemoveContainer("a1")
	reg.Remove("b")
	if slices.Sort(w.gone); !slices.Equal(w.gone, []string{"a1", "b1", "gone"}) {
		t.Errorf("told gone %v, want gone (not in the runtime), a1 (removed), b1 (with its sandbox)", w.gone)
	}
}
