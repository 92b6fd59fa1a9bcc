package registry

import (
	"slices"
	"testing"
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
	added, dropped := reg.reconcile([]SandboxRecord{sampleRecord("b")}, []ContainerRecord{{ID: "b1", SandboxID: "b"}})
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
	reg.reconcile([]SandboxRecord{sampleRecord("a")}, []ContainerRecord{{ID: "old", SandboxID: "a", Origin: OriginAdopted}})
	end()
	if got := containerIDs(reg); !slices.Equal(got, []string{"new"}) {
		t.Errorf("containers %v, want new only", got)
	}
	if c, _ := reg.Container("new"); c.Origin != OriginStarted {
		t.Errorf("new container's origin %q, want started", c.Origin)
	}
}
