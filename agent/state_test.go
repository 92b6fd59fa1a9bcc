package agent

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/podgate/podgate/cri/registry"
)

// What podgate wrote before the claims and the attach intents became their features' sections
// of the checkpoint: a v3 file, each data key as the registry encoded it then.
const (
	oldSandboxes = `[{"id":"sb-1","pod":{"uid":"uid-a","name":"a","namespace":"ns"},"origin":"started","ready":true,"createdAt":"2026-11-22T03:00:00Z",` +
		`"netns":"/var/run/netns/cni-1","pid":42,"ips":["10.88.0.7"],"sysctls":{"verification":"ok"},` +
		`"attached":[{"claimNamespace":"ns","claimName":"net","claimUID":"claim-net","driver":"net.example.com","pool":"pool","device":"dev-0",` +
		`"interface":{"hostName":"veth0","podName":"net1","mtu":1500,"up":true,"alias":"uplink","hardwareAddr":"02:00:00:00:00:01","addresses":["192.0.2.7/24"]},"published":true}]}]`
	oldClaims = `[{"uid":"claim-net","namespace":"ns","name":"net","drivers":["net.example.com"],"prepared":true,` +
		`"devices":[{"driver":"net.example.com","pool":"pool","device":"dev-0","requests":["nic"],"cdiDeviceIDs":["net.example.com/nic=dev-0"],` +
		`"network":{"hostInterface":"veth0","interfaceName":"net1","mtu":1400,"addresses":["192.0.2.7/24"]}},` +
		`{"driver":"net.example.com","pool":"pool","device":"dev-1"}],"preparedBy":"podgate","podUIDs":["uid-a","uid-b"]},` +
		`{"uid":"claim-old","namespace":"ns","name":"old","drivers":["net.example.com"],"prepared":false}]`
	oldDRAPods = `[{"pod":{"uid":"uid-a","name":"a","namespace":"ns"},"claims":[{"uid":"claim-net","podClaimName":"net"}],"containers":[{"name":"app","claims":["net"]},{"name":"side"}]},` +
		`{"pod":{"uid":"uid-b","name":"b","namespace":"ns","attempt":1},"claims":[{"uid":"claim-net","podClaimName":"nic"}]}]`
	oldAttaching = `[{"sandboxID":"sb-2","pod":{"uid":"uid-b","name":"b","namespace":"ns","attempt":1},"netns":"/var/run/netns/cni-2",` +
		`"claimNamespace":"ns","claimName":"net","claimUID":"claim-net","driver":"net.example.com","pool":"pool","device":"dev-1",` +
		`"hostInterface":"veth1","config":{"name":"net2","mtu":1400,"addresses":["192.0.2.8/24","2001:db8::8/64"]}}]`
	oldV3Data = `{"sandboxes":` + oldSandboxes + `,"claims":` + oldClaims + `,"draPods":` + oldDRAPods + `,"attaching":` + oldAttaching + `}`
)

// writeOldCheckpoint writes a checkpoint file of version holding data, as podgate wrote it.
func writeOldCheckpoint(t *testing.T, dir, version, data string) string {
	t.Helper()
	sum := sha256.Sum256([]byte(data))
	file, err := json.Marshal(map[string]any{"version": version, "checksum": "sha256:" + hex.EncodeToString(sum[:]), "data": json.RawMessage(data)})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, registry.CheckpointFile)
	if err := os.WriteFile(path, append(file, '\n'), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// jsonOf is v encoded as the checkpoint encodes it.
func jsonOf(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestOldCheckpointLoadsIntoTheSections: a v3 checkpoint written before the sections loads
// into the registry, the claim store and the attach intents with the same content (the intents
// left, a crash's), and is written back, as v3 still, with the same data keys and values.
func TestOldCheckpointLoadsIntoTheSections(t *testing.T) {
	dir := t.TempDir()
	path := writeOldCheckpoint(t, dir, registry.CheckpointVersion, oldV3Data)
	reg, claims, intents := restartState(t, dir)
	for _, c := range []struct{ what, got, want string }{
		{"sandboxes", jsonOf(t, reg.Sandboxes()), oldSandboxes},
		{"claims", jsonOf(t, claims.List()), oldClaims},
		{"draPods", jsonOf(t, claims.Pods()), oldDRAPods},
		{"left intents", jsonOf(t, intents.LeftAttaches()), oldAttaching},
	} {
		if c.got != c.want {
			t.Errorf("%s loaded as\n%s\nwant\n%s", c.what, c.got, c.want)
		}
	}
	if pc, ok := reg.PodClaims("uid-b"); !ok || len(pc.Claims) != 1 || pc.Claims[0].PodClaimName != "nic" || !pc.Claims[0].Prepared {
		t.Errorf("pod b's claims through the registry: %+v %t", pc, ok)
	}

	reg.PersistSoon()
	reg.Flush()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Version string                     `json:"version"`
		Data    map[string]json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(raw, &f); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"sandboxes": oldSandboxes, "claims": oldClaims, "draPods": oldDRAPods, "attaching": oldAttaching}
	if f.Version != registry.CheckpointVersion || len(f.Data) != len(want) {
		t.Errorf("rewritten as %s with keys %d, want %s with %d", f.Version, len(f.Data), registry.CheckpointVersion, len(want))
	}
	for k, v := range want {
		if string(f.Data[k]) != v {
			t.Errorf("rewritten %s:\n%s\nwant\n%s", k, f.Data[k], v)
		}
	}
}

// TestV1CheckpointLoadsIntoTheClaimStore: a v1 checkpoint (a copy of each claim in every pod
// using it) loads into the claim store migrated, and is written back as v2 without podClaims.
func TestV1CheckpointLoadsIntoTheClaimStore(t *testing.T) {
	dir := t.TempDir()
	v1 := `{"sandboxes":[],"podClaims":[` +
		`{"pod":{"uid":"uid-a","name":"a","namespace":"ns"},"claims":[{"uid":"claim-shared","namespace":"ns","name":"shared","podClaimName":"net","drivers":["net.example"],"prepared":true,"devices":[{"driver":"net.example","pool":"p","device":"nic0"}]}],"containers":[{"name":"app","claims":["net"]}]},` +
		`{"pod":{"uid":"uid-b","name":"b","namespace":"ns"},"claims":[{"uid":"claim-shared","namespace":"ns","name":"shared","podClaimName":"nic","drivers":["net.example"],"prepared":false}]}` +
		`]}`
	path := writeOldCheckpoint(t, dir, "podgate.dev/registry/v1", v1)
	reg, claims, intents := restartState(t, dir)
	wantClaims := `[{"uid":"claim-shared","namespace":"ns","name":"shared","drivers":["net.example"],"prepared":true,` +
		`"devices":[{"driver":"net.example","pool":"p","device":"nic0"}],"preparedBy":"podgate","podUIDs":["uid-a","uid-b"]}]`
	wantPods := `[{"pod":{"uid":"uid-a","name":"a","namespace":"ns"},"claims":[{"uid":"claim-shared","podClaimName":"net"}],"containers":[{"name":"app","claims":["net"]}]},` +
		`{"pod":{"uid":"uid-b","name":"b","namespace":"ns"},"claims":[{"uid":"claim-shared","podClaimName":"nic"}]}]`
	if got := jsonOf(t, claims.List()); got != wantClaims {
		t.Errorf("claims migrated as\n%s\nwant\n%s", got, wantClaims)
	}
	if got := jsonOf(t, claims.Pods()); got != wantPods {
		t.Errorf("pods migrated as\n%s\nwant\n%s", got, wantPods)
	}
	if left := intents.LeftAttaches(); len(left) != 0 {
		t.Errorf("intents from a v1 file: %+v", left)
	}
	reg.PersistSoon()
	reg.Flush()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Version string                     `json:"version"`
		Data    map[string]json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(raw, &f); err != nil {
		t.Fatal(err)
	}
	if f.Version != "podgate.dev/registry/v2" || string(f.Data["claims"]) != wantClaims || string(f.Data["draPods"]) != wantPods || f.Data["podClaims"] != nil {
		t.Errorf("rewritten as %s: %s", f.Version, raw)
	}
}
