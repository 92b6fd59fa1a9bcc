package resources

import (
	"errors"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/podgate/podgate/cri/registry"
	pb "github.com/podgate/podgate/podresources/api/v1alpha1"
)

// TestContainerRecordsFollowTheRegistry: the feature's records of containers the rebuild
// adopts say what their runtime spec asks (a running one unverified, a created one pending, one
// whose spec could not be read with why), a record the hooks made stays, the PodResources
// extension shows them, and a record goes when the registry forgets its container, removed or
// gone with its sandbox.
func TestContainerRecordsFollowTheRegistry(t *testing.T) {
	reg := registry.NewRegistry(nil, registry.CheckpointData{Sandboxes: []registry.SandboxRecord{{ID: "sb", Pod: registry.PodRef{UID: "uid-p", Name: "p", Namespace: "ns"}}}})
	s := New(Config{MemoryThrottlingFactor: 0.9}, v2Node, reg, nil, prometheus.NewRegistry())
	limit := int64(64 << 20)
	asked := &specs.LinuxResources{Memory: &specs.LinuxMemory{Limit: &limit}}
	for id, a := range map[string]registry.AdoptedContainer{
		"running": {Resources: asked},
		"created": {Created: true, Resources: asked},
		"unread":  {Err: errors.New("container status: deadline exceeded")},
	} {
		c := registry.ContainerRecord{ID: id, Name: id, SandboxID: "sb", PodUID: "uid-p", Origin: registry.OriginAdopted}
		reg.AddContainer(c)
		s.records.ContainerAdopted(&c, a)
	}
	s.records.set("hooked", container{verification: ResultOK})
	s.records.ContainerAdopted(&registry.ContainerRecord{ID: "hooked"}, registry.AdoptedContainer{})
	if e, _ := s.records.get("hooked"); e.verification != ResultOK {
		t.Errorf("a record the hooks made was replaced on adoption: %+v", e)
	}

	p := &pb.Pod{Uid: "uid-p", Sandbox: &pb.Sandbox{Id: "sb"}}
	s.Describe(p)
	got := map[string]*pb.Container{}
	for _, c := range p.GetContainers() {
		got[c.GetId()] = c
	}
	for id, want := range map[string]string{"running": ResultUnverified, "created": ResultPending, "unread": ResultUnverified} {
		if c := got[id]; c.GetVerification() != want || (id != "unread" && c.GetAsked().GetMemoryMax() != limit) {
			t.Errorf("%s shown as %v, want %s asking its spec's limit", id, c, want)
		}
	}
	if c := got["unread"]; c.GetError() == "" || c.GetAsked() != nil {
		t.Errorf("container whose spec was not read shown as %v, want why, nothing asked", c)
	}
	if started := s.records.started(); len(started) != 3 { // running, unread, hooked
		t.Errorf("rechecked: %v, want the three not pending", started)
	}

	reg.RemoveContainer("running")
	reg.Remove("sb")
	for _, id := range []string{"running", "created", "unread"} {
		if _, ok := s.records.get(id); ok {
			t.Errorf("record of %s stays after the registry forgot it", id)
		}
	}
}
