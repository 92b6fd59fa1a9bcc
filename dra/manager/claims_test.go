package manager

import (
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/podgate/podgate/cri/registry"
)

// checkpointVersionV2 is the format a checkpoint without attach intents is written as.
const checkpointVersionV2 = "podgate.dev/registry/v2"

// sameJSON reports whether a and b encode to the same JSON: what the checkpoint would hold.
func sameJSON(t *testing.T, a, b any) bool {
	t.Helper()
	ja, err := json.Marshal(a)
	if err != nil {
		t.Fatal(err)
	}
	jb, err := json.Marshal(b)
	if err != nil {
		t.Fatal(err)
	}
	return string(ja) == string(jb)
}

// onDiskClaims are the claims the checkpoint data d holds.
func onDiskClaims(t *testing.T, d registry.CheckpointData) []ClaimInfo {
	t.Helper()
	var out []ClaimInfo
	if raw, ok := d.Sections[claimsKey]; ok {
		if err := json.Unmarshal(raw, &out); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

func sampleRecord(id string) registry.SandboxRecord {
	return registry.SandboxRecord{
		ID: id, Pod: registry.PodRef{UID: types.UID("uid-" + id), Name: id, Namespace: "ns"}, Origin: registry.OriginStarted, Ready: true,
		CreatedAt: time.Date(2026, 11, 22, 3, 0, 0, 0, time.UTC),
	}
}

// newClaims is a registry of cp (nil: memory only) holding d, with its claim store.
func newClaims(t *testing.T, cp *registry.Checkpoint, d registry.CheckpointData) (*registry.Registry, *Claims) {
	t.Helper()
	reg := registry.NewRegistry(cp, d)
	c, err := NewClaims(reg)
	if err != nil {
		t.Fatal(err)
	}
	return reg, c
}

// A change of the DRA claims does not wait for the background write as the sandboxes' changes
// do: it is on disk when UseClaims returns, with the sandboxes recorded so far.
func TestClaimChangeIsWrittenAtOnce(t *testing.T) {
	cp := registry.NewCheckpoint(t.TempDir())
	reg, store := newClaims(t, cp, registry.CheckpointData{})
	reg.SetWriteDelay(time.Hour) // never runs out during the test: only Flush writes
	for _, id := range []string{"a", "b"} {
		if err := reg.Add(sampleRecord(id)); err != nil { // queued, not written
			t.Fatal(err)
		}
	}
	pod := registry.PodRef{UID: "uid-b", Name: "b", Namespace: "ns"}
	if err := store.UseClaims(pod, nil, []ClaimUse{{UID: "claim-1", Namespace: "ns", Name: "c", PodClaimName: "net", Drivers: []string{"d.example.com"}}}); err != nil {
		t.Fatal(err)
	}
	d, err := cp.ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	if len(onDiskClaims(t, d)) != 1 || len(d.Sandboxes) != 2 {
		t.Fatalf("checkpoint when UseClaims returned: %d claims, %d sandboxes; want the claim and both sandboxes", len(onDiskClaims(t, d)), len(d.Sandboxes))
	}
	reg.Flush() // the queued write still runs, with nothing new; Flush ends it
}

// TestClaimChangeNotWrittenChangesNothing: a change the checkpoint cannot hold is refused, and
// neither the store nor the registry's pod views see it.
func TestClaimChangeNotWrittenChangesNothing(t *testing.T) {
	cp := registry.NewCheckpoint(t.TempDir())
	reg, store := newClaims(t, cp, registry.CheckpointData{})
	var told int
	reg.OnPodChange(func(uint64, *registry.PodState, *registry.PodState) { told++ })
	if err := os.Mkdir(cp.Path(), 0o700); err != nil {
		t.Fatal(err)
	}
	pod := registry.PodRef{UID: "uid-a", Name: "a", Namespace: "ns"}
	err := store.UseClaims(pod, nil, []ClaimUse{{UID: "claim-1", Namespace: "ns", Name: "c", PodClaimName: "net", Drivers: []string{"d.example.com"}}})
	if err == nil || !strings.Contains(err.Error(), "pod registry") {
		t.Fatalf("UseClaims with the checkpoint not writable: %v, want its failure", err)
	}
	if _, ok := store.Claim("claim-1"); ok {
		t.Error("a claim counts although it is not on disk")
	}
	if _, ok := reg.Pod("uid-a"); ok || told != 0 {
		t.Errorf("the registry shows the pod's claims (%t) or told %d changes; want neither", ok, told)
	}
}

// TestClaimChangeTellsThePods: a change tells the change of each pod whose view it changed,
// with its state before and after, the claims built from the store.
func TestClaimChangeTellsThePods(t *testing.T) {
	reg, store := newClaims(t, nil, registry.CheckpointData{})
	type change struct{ before, after *registry.PodState }
	var changes []change
	reg.OnPodChange(func(_ uint64, before, after *registry.PodState) { changes = append(changes, change{before, after}) })
	use := []ClaimUse{{UID: "claim-1", Namespace: "ns", Name: "c", PodClaimName: "net", Drivers: []string{"d.example.com"}}}
	for _, uid := range []types.UID{"uid-a", "uid-b"} {
		if err := store.UseClaims(registry.PodRef{UID: uid, Name: string(uid), Namespace: "ns"}, nil, use); err != nil {
			t.Fatal(err)
		}
	}
	changes = nil
	if err := store.SetPrepared(map[types.UID][]DeviceRecord{"claim-1": {{Driver: "d.example.com", Pool: "p", Device: "nic0"}}}); err != nil {
		t.Fatal(err)
	}
	if len(changes) != 2 {
		t.Fatalf("changes told: %d, want both pods sharing the claim", len(changes))
	}
	for _, c := range changes {
		if pc, ok := inPod(c.before); !ok || pc.Claims[0].Prepared {
			t.Errorf("before: %+v, want the claim not prepared", c.before)
		}
		if pc, ok := inPod(c.after); !ok || !pc.Claims[0].Prepared {
			t.Errorf("after: %+v, want the claim prepared", c.after)
		}
	}
	pods, _ := reg.Pods()
	claimed := 0
	for i := range pods {
		if _, ok := InPod(&pods[i]); ok {
			claimed++
		}
	}
	if len(pods) != 2 || claimed != 2 {
		t.Errorf("Pods: %+v, want both with their claims", pods)
	}
	if p, ok := reg.PodByName("ns", "uid-b"); !ok || p.UID != "uid-b" || p.Ref().Name != "uid-b" {
		t.Errorf("PodByName: %+v %t, want uid-b with its claims", p, ok)
	} else if _, claimed := InPod(&p); !claimed {
		t.Errorf("PodByName: %+v %t, want uid-b with its claims", p, ok)
	}
}

// TestClaimsSectionDamaged: a claims section that does not decode stops start-up with an error
// naming the checkpoint.
func TestClaimsSectionDamaged(t *testing.T) {
	cp := registry.NewCheckpoint(t.TempDir())
	reg := registry.NewRegistry(cp, registry.CheckpointData{Sections: map[string]json.RawMessage{claimsKey: json.RawMessage(`{"not":"a list"}`)}})
	if _, err := NewClaims(reg); err == nil || !strings.Contains(err.Error(), cp.Path()) || !strings.Contains(err.Error(), "damaged") {
		t.Errorf("NewClaims: %v, want an error naming %s as damaged", err, cp.Path())
	}
}

// inPod is the pod's view of its claims in st; false when st is nil or has none.
func inPod(st *registry.PodState) (PodClaims, bool) {
	if st == nil {
		return PodClaims{}, false
	}
	return InPod(st)
}
