package manager

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"testing"

	"k8s.io/apimachinery/pkg/types"

	"github.com/podgate/podgate/cri/registry"
)

// v1Data is what podgate before claim-centric state wrote: a copy of the shared claim in each
// pod's record, prepared in one of them (the other pod's copy still says not prepared).
const v1Data = `{"sandboxes":[],"podClaims":[` +
	`{"pod":{"uid":"uid-a","name":"a","namespace":"ns"},"claims":[{"uid":"claim-shared","namespace":"ns","name":"shared","podClaimName":"net","drivers":["net.example"],"prepared":true,"devices":[{"driver":"net.example","pool":"p","device":"nic0"}]}],"containers":[{"name":"app","claims":["net"]}]},` +
	`{"pod":{"uid":"uid-b","name":"b","namespace":"ns"},"claims":[{"uid":"claim-shared","namespace":"ns","name":"shared","podClaimName":"nic","drivers":["net.example"],"prepared":false}]}` +
	`]}`

// TestV1CheckpointMigrated: a checkpoint of the format before one record per claim is read and
// migrated at start-up, not refused: one record for the shared claim, prepared, with both pods
// as its users, each pod keeping its own name for it; the next write is of the current format
// (v2, as it holds no attach intents).
func TestV1CheckpointMigrated(t *testing.T) {
	dir := t.TempDir()
	sum := sha256.Sum256([]byte(v1Data))
	file, err := json.Marshal(map[string]any{"version": "podgate.dev/registry/v1", "checksum": "sha256:" + hex.EncodeToString(sum[:]), "data": json.RawMessage(v1Data)})
	if err != nil {
		t.Fatal(err)
	}
	cp := registry.NewCheckpoint(dir)
	if err := os.WriteFile(cp.Path(), file, 0o600); err != nil {
		t.Fatal(err)
	}
	d, err := cp.ReadAll()
	if err != nil {
		t.Fatalf("v1 checkpoint refused: %v", err)
	}
	reg := registry.NewRegistry(cp, d)
	store, err := NewClaims(reg)
	if err != nil {
		t.Fatal(err)
	}
	claims := store.List()
	want := []ClaimInfo{{UID: "claim-shared", Namespace: "ns", Name: "shared", Drivers: []string{"net.example"}, Prepared: true,
		Devices: []DeviceRecord{{Driver: "net.example", Pool: "p", Device: "nic0"}}, PreparedBy: PreparedByPodgate, PodUIDs: []types.UID{"uid-a", "uid-b"}}}
	if !sameJSON(t, claims, want) {
		t.Errorf("migrated claims %+v, want %+v", claims, want)
	}
	b, ok := store.PodClaims("uid-b")
	if !ok || len(b.Claims) != 1 || b.Claims[0].PodClaimName != "nic" || !b.Claims[0].Prepared {
		t.Errorf("pod b's view %+v: want the shared claim, prepared, under its own name nic", b)
	}
	if a, _ := store.PodClaims("uid-a"); len(a.Containers) != 1 || a.Containers[0].Name != "app" {
		t.Errorf("pod a's containers %+v, want app", a.Containers)
	}
	wantPods := `[{"pod":{"uid":"uid-a","name":"a","namespace":"ns"},"claims":[{"uid":"claim-shared","podClaimName":"net"}],"containers":[{"name":"app","claims":["net"]}]},` +
		`{"pod":{"uid":"uid-b","name":"b","namespace":"ns"},"claims":[{"uid":"claim-shared","podClaimName":"nic"}]}]`
	if got, err := json.Marshal(store.Pods()); err != nil || string(got) != wantPods {
		t.Errorf("pods migrated as\n%s (%v)\nwant\n%s", got, err, wantPods)
	}
	reg.PersistSoon()
	reg.Flush()
	raw, err := os.ReadFile(cp.Path())
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Version string `json:"version"`
	}
	if err := json.Unmarshal(raw, &f); err != nil || f.Version != checkpointVersionV2 {
		t.Errorf("rewritten checkpoint of version %q (%v), want %q", f.Version, err, checkpointVersionV2)
	}
	again, err := cp.ReadAll()
	_, v1Kept := again.Sections[podClaimsKey]
	if err != nil || v1Kept || !sameJSON(t, onDiskClaims(t, again), want) {
		t.Errorf("rewritten checkpoint: %+v (%v), want the claims in the current format only", again, err)
	}
	if got := string(again.Sections["draPods"]); got != wantPods {
		t.Errorf("rewritten checkpoint's draPods\n%s\nwant\n%s", got, wantPods)
	}
}
