package state

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"k8s.io/apimachinery/pkg/types"

	"github.com/podgate/podgate/cri/registry"
	"github.com/podgate/podgate/dra/manager"
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
// into the registry, the claim store, the attach records and the sysctl records with the same
// content (the intents left, a crash's), and is written back, as v3 still, with the same data
// keys and values.
func TestOldCheckpointLoadsIntoTheSections(t *testing.T) {
	dir := t.TempDir()
	path := writeOldCheckpoint(t, dir, registry.CheckpointVersion, oldV3Data)
	st := openTestState(t, dir)
	sysctls, _ := st.Sysctls.Sandbox("sb-1")
	for _, c := range []struct{ what, got, want string }{
		{"sandboxes", jsonOf(t, st.Sandboxes.Sandboxes()), `[{"id":"sb-1","pod":{"uid":"uid-a","name":"a","namespace":"ns"},"origin":"started","ready":true,"createdAt":"2026-11-22T03:00:00Z",` +
			`"netns":"/var/run/netns/cni-1","pid":42,"ips":["10.88.0.7"]}]`},
		{"sysctls", jsonOf(t, sysctls), `{"verification":"ok"}`},
		{"attached", jsonOf(t, st.Intents.Attached("sb-1")), `[{"claimNamespace":"ns","claimName":"net","claimUID":"claim-net","driver":"net.example.com","pool":"pool","device":"dev-0",` +
			`"interface":{"hostName":"veth0","podName":"net1","mtu":1500,"up":true,"alias":"uplink","hardwareAddr":"02:00:00:00:00:01","addresses":["192.0.2.7/24"]},"published":true}]`},
		{"claims", jsonOf(t, st.Claims.List()), oldClaims},
		{"draPods", jsonOf(t, st.Claims.Pods()), oldDRAPods},
		{"left intents", jsonOf(t, st.Intents.LeftAttaches()), oldAttaching},
	} {
		if c.got != c.want {
			t.Errorf("%s loaded as\n%s\nwant\n%s", c.what, c.got, c.want)
		}
	}
	if pc, ok := st.Claims.PodClaims("uid-b"); !ok || len(pc.Claims) != 1 || pc.Claims[0].PodClaimName != "nic" || !pc.Claims[0].Prepared {
		t.Errorf("pod b's claims through the registry: %+v %t", pc, ok)
	}

	st.Sandboxes.PersistSoon()
	st.Sandboxes.Flush()
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

// goldenDir holds checkpoint files written by podgate before each feature kept its own records
// (e099f42), and the program that wrote them.
const goldenDir = "testdata"

// goldenCases are the golden files: each one read by today's podgate, every section registered
// as start-up registers them, and written back, gives the second's bytes.
var goldenCases = []struct{ in, want string }{
	// v1 is migrated (the claims one record each): what e099f42 wrote after migrating it.
	{"v1.json", "v1-written.json"},
	{"v2.json", "v2.json"},
	{"v3.json", "v3.json"},
	// Keys of sandbox objects no podgate knows (a later one's) are carried.
	{"v3-sandbox-key.json", "v3-sandbox-key.json"},
}

// TestCheckpointGolden: the checkpoint's bytes do not change for the same state. Each golden
// file, loaded as start-up loads it and written back, is byte for byte what e099f42 wrote for
// that state: the sandboxes (sysctls of every verification result, attached devices with every
// interface field), the DRA claims, the attach intents, and the keys no podgate knows, top level
// and in sandbox objects. Written again by today's podgate, and so read by the release before
// it, which reads the golden files (TestCheckpointReadByThePreviousRelease).
func TestCheckpointGolden(t *testing.T) {
	for _, c := range goldenCases {
		t.Run(c.in, func(t *testing.T) {
			got := rewriteGolden(t, c.in)
			want, err := os.ReadFile(filepath.Join(goldenDir, c.want))
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("%s written back as\n%s\nwant (%s)\n%s", c.in, got, c.want, want)
			}
		})
	}
}

// rewriteGolden loads the golden file name as start-up does and returns what podgate writes of
// it.
func rewriteGolden(t *testing.T, name string) []byte {
	t.Helper()
	in, err := os.ReadFile(filepath.Join(goldenDir, name))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	path := filepath.Join(dir, registry.CheckpointFile)
	if err := os.WriteFile(path, in, 0o600); err != nil {
		t.Fatal(err)
	}
	st := openTestState(t, dir)
	st.Sandboxes.PersistSoon()
	st.Sandboxes.Flush()
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// The previous release's types of the checkpoint (e099f42's cri/registry and dra/attach),
// copied here as it had them: what a podgate put back after a downgrade decodes the file into.
// The claims' types (package manager's) are the same in both releases.
type (
	prevSandboxRecord struct {
		ID             string               `json:"id"`
		Pod            registry.PodRef      `json:"pod"`
		RuntimeHandler string               `json:"runtimeHandler,omitempty"`
		Origin         string               `json:"origin"`
		Ready          bool                 `json:"ready"`
		CreatedAt      time.Time            `json:"createdAt"`
		NetNS          string               `json:"netns,omitempty"`
		HostNetwork    bool                 `json:"hostNetwork,omitempty"`
		PID            int                  `json:"pid,omitempty"`
		CgroupParent   string               `json:"cgroupParent,omitempty"`
		CgroupsPath    string               `json:"cgroupsPath,omitempty"`
		IPs            []string             `json:"ips,omitempty"`
		Status         string               `json:"status,omitempty"`
		Sysctls        prevSysctlRecord     `json:"sysctls"`
		Attached       []prevAttachedDevice `json:"attached,omitempty"`
	}
	prevSysctlRecord struct {
		Asked        map[string]string `json:"asked,omitempty"`
		Applied      map[string]string `json:"applied,omitempty"`
		Verification string            `json:"verification"`
		Mismatches   []string          `json:"mismatches,omitempty"`
		Error        string            `json:"error,omitempty"`
	}
	prevAttachedDevice struct {
		ClaimNamespace string                `json:"claimNamespace"`
		ClaimName      string                `json:"claimName"`
		ClaimUID       types.UID             `json:"claimUID"`
		Driver         string                `json:"driver"`
		Pool           string                `json:"pool"`
		Device         string                `json:"device"`
		Interface      prevAttachedInterface `json:"interface"`
		Published      bool                  `json:"published,omitempty"`
	}
	prevAttachedInterface struct {
		HostName     string   `json:"hostName"`
		PodName      string   `json:"podName"`
		MTU          int      `json:"mtu,omitempty"`
		Up           bool     `json:"up,omitempty"`
		Alias        string   `json:"alias,omitempty"`
		HardwareAddr string   `json:"hardwareAddr,omitempty"`
		Addresses    []string `json:"addresses,omitempty"`
	}
	prevIntent struct {
		SandboxID      string          `json:"sandboxID"`
		Pod            registry.PodRef `json:"pod"`
		NetNS          string          `json:"netns"`
		ClaimNamespace string          `json:"claimNamespace"`
		ClaimName      string          `json:"claimName"`
		ClaimUID       types.UID       `json:"claimUID"`
		Driver         string          `json:"driver"`
		Pool           string          `json:"pool"`
		Device         string          `json:"device"`
		HostInterface  string          `json:"hostInterface"`
		Config         struct {
			Name      string   `json:"name,omitempty"`
			MTU       int      `json:"mtu,omitempty"`
			Addresses []string `json:"addresses,omitempty"`
		} `json:"config"`
	}
)

// prevCheckpoint is what the previous release reads of a checkpoint.
type prevCheckpoint struct {
	Sandboxes []prevSandboxRecord
	Claims    []manager.ClaimInfo
	DRAPods   []manager.PodDRA
	Attaching []prevIntent
}

// readAsPreviousRelease reads a checkpoint file as e099f42 reads it: a version it knows (v1 to
// v3), the checksum over the data, the sandboxes with their sysctls and attached devices, the
// claims and the attach intents.
func readAsPreviousRelease(t *testing.T, raw []byte) prevCheckpoint {
	t.Helper()
	var f struct {
		Version  string          `json:"version"`
		Checksum string          `json:"checksum"`
		Data     json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(raw, &f); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains([]string{"podgate.dev/registry/v1", "podgate.dev/registry/v2", "podgate.dev/registry/v3"}, f.Version) {
		t.Fatalf("version %q: the previous release refuses it", f.Version)
	}
	if sum := sha256.Sum256(f.Data); "sha256:"+hex.EncodeToString(sum[:]) != f.Checksum {
		t.Fatalf("checksum %s does not match the data: the previous release refuses it", f.Checksum)
	}
	var keys map[string]json.RawMessage
	if err := json.Unmarshal(f.Data, &keys); err != nil {
		t.Fatal(err)
	}
	var out prevCheckpoint
	for key, v := range map[string]any{"sandboxes": &out.Sandboxes, "claims": &out.Claims, "draPods": &out.DRAPods, "attaching": &out.Attaching} {
		if b, ok := keys[key]; ok {
			if err := json.Unmarshal(b, v); err != nil {
				t.Fatalf("%s: %v", key, err)
			}
		}
	}
	return out
}

// convert is v as the type of out, through their JSON.
func convert(t *testing.T, v, out any) {
	t.Helper()
	if err := json.Unmarshal([]byte(jsonOf(t, v)), out); err != nil {
		t.Fatal(err)
	}
}

// asPreviousRelease is what the previous release would hold for the state st: each sandbox
// record with the sysctl and attach features' records of it, the claims, the intents.
func asPreviousRelease(t *testing.T, st *State) prevCheckpoint {
	t.Helper()
	var out prevCheckpoint
	for _, rec := range st.Sandboxes.Sandboxes() {
		var p prevSandboxRecord
		convert(t, rec, &p)
		sysctls, _ := st.Sysctls.Sandbox(rec.ID)
		convert(t, sysctls, &p.Sysctls)
		if devs := st.Intents.Attached(rec.ID); len(devs) > 0 {
			convert(t, devs, &p.Attached)
		}
		out.Sandboxes = append(out.Sandboxes, p)
	}
	out.Claims, out.DRAPods = st.Claims.List(), st.Claims.Pods()
	if left := st.Intents.LeftAttaches(); len(left) > 0 {
		convert(t, left, &out.Attaching)
	}
	return out
}

// TestCheckpointReadByThePreviousRelease: a downgrade to the previous release reads what
// today's podgate writes, and finds there what today's podgate holds: each golden file written
// back by today's podgate, and the same state changed by it (a sandbox with attached devices
// gone, its devices left as intents, v3), decoded with the previous release's types, hold the
// sandboxes with their sysctls and attached devices, the claims and the intents that today's
// podgate reads from the same bytes.
func TestCheckpointReadByThePreviousRelease(t *testing.T) {
	for _, c := range goldenCases {
		t.Run(c.in, func(t *testing.T) {
			written := rewriteGolden(t, c.in)
			dir := t.TempDir()
			path := filepath.Join(dir, registry.CheckpointFile)
			if err := os.WriteFile(path, written, 0o600); err != nil {
				t.Fatal(err)
			}
			check := func(when string) {
				t.Helper()
				raw, err := os.ReadFile(path)
				if err != nil {
					t.Fatal(err)
				}
				got, want := readAsPreviousRelease(t, raw), asPreviousRelease(t, openTestState(t, dir))
				if d := cmp.Diff(want, got, cmpopts.EquateEmpty()); d != "" {
					t.Errorf("%s: the previous release reads (-today's podgate holds +read):\n%s", when, d)
				}
			}
			check("written back")
			st := openTestState(t, dir)
			st.Sandboxes.Remove("sb-ok")
			st.Sandboxes.Flush()
			check("after a change")
			if c.in != "v1.json" && len(readAsPreviousRelease(t, mustRead(t, path)).Attaching) == 0 {
				t.Error("sb-ok's attached devices were not left as intents: the change tests nothing")
			}
		})
	}
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// openTestState is podgate's state read from the checkpoint in stateDir, as start-up reads it.
func openTestState(t testing.TB, stateDir string) *State {
	t.Helper()
	st, err := Read(registry.NewCheckpoint(stateDir))
	if err != nil {
		t.Fatal(err)
	}
	return st
}
