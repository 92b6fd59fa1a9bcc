package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"k8s.io/apimachinery/pkg/types"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podgate/podgate/test/testfs"
)

func sampleRecord(id string) SandboxRecord {
	return SandboxRecord{
		ID:        id,
		Pod:       PodRef{UID: types.UID("uid-" + id), Name: id, Namespace: "ns"},
		Origin:    OriginStarted,
		Ready:     true,
		CreatedAt: time.Date(2026, 11, 22, 3, 0, 0, 0, time.UTC),
		NetNS:     "/var/run/netns/cni-" + id,
		PID:       42,
		IPs:       []string{"10.88.0.7"},
		Sysctls: SysctlRecord{
			Asked:        map[string]string{"net.ipv4.tcp_keepalive_time": "600"},
			Applied:      map[string]string{"net.ipv4.tcp_keepalive_time": "600"},
			Verification: SysctlsOK,
		},
	}
}

func TestCheckpointRoundTrip(t *testing.T) {
	cp := NewCheckpoint(t.TempDir())
	if recs, err := cp.Read(); err != nil || recs != nil {
		t.Fatalf("missing checkpoint: %v, %v; want nothing and no error", recs, err)
	}
	want := CheckpointData{
		Sandboxes: []SandboxRecord{sampleRecord("a"), sampleRecord("b")},
		PodClaims: []PodClaims{{
			Pod: PodRef{UID: "uid-a", Name: "a", Namespace: "ns"},
			Claims: []ClaimRecord{{
				UID: "claim-uid", Namespace: "ns", Name: "net", PodClaimName: "net", Drivers: []string{"net.example"}, Prepared: true,
				Devices: []DeviceRecord{{Driver: "net.example", Pool: "node-a", Device: "nic0", Requests: []string{"nic"}, CDIDeviceIDs: []string{"net.example/nic=nic0"}}},
			}},
		}},
	}
	if err := cp.Write(want); err != nil {
		t.Fatal(err)
	}
	got, err := cp.ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	if !sameJSON(t, got, want) {
		t.Errorf("read back %+v, want %+v", got, want)
	}
	if fi, err := os.Stat(cp.Path()); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("checkpoint file %v %v, want mode 0600", fi, err)
	}
	if entries, _ := os.ReadDir(filepath.Dir(cp.Path())); len(entries) != 1 {
		t.Errorf("state dir holds %v, want the checkpoint alone (no temporary files)", entries)
	}
}

func sameRecords(t *testing.T, a, b []SandboxRecord) bool {
	t.Helper()
	return sameJSON(t, a, b)
}

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
	return bytes.Equal(ja, jb)
}

func TestCheckpointDamageIsAnError(t *testing.T) {
	for _, tc := range []struct {
		name   string
		damage func([]byte) []byte
		why    string
	}{
		{"flipped byte", func(b []byte) []byte { return bytes.Replace(b, []byte("10.88.0.7"), []byte("10.88.0.8"), 1) }, "checksum"},
		{"truncated", func(b []byte) []byte { return b[:len(b)/2] }, "unexpected end"},
		{"other version", func(b []byte) []byte {
			return bytes.Replace(b, []byte(CheckpointVersion), []byte("podgate.dev/registry/v9"), 1)
		}, "version"},
		{"not JSON", func([]byte) []byte { return []byte("\x00\x01garbage") }, "invalid character"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cp := NewCheckpoint(t.TempDir())
			if err := cp.Write(CheckpointData{Sandboxes: []SandboxRecord{sampleRecord("a")}}); err != nil {
				t.Fatal(err)
			}
			b, err := os.ReadFile(cp.Path())
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(cp.Path(), tc.damage(b), 0o600); err != nil {
				t.Fatal(err)
			}
			recs, err := cp.Read()
			if err == nil || !strings.Contains(err.Error(), cp.Path()) || !strings.Contains(err.Error(), tc.why) {
				t.Fatalf("Read: %v, %v; want an error naming %s and %q", recs, err, cp.Path(), tc.why)
			}
		})
	}
}

func TestAgentRefusesDamagedCheckpoint(t *testing.T) {
	dir := testfs.ShortDir(t)
	cfg := testConfig(dir, filepath.Join(dir, "missing.sock"))
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(cfg.StateDir, CheckpointFile)
	if err := os.WriteFile(path, []byte(`{"version":"`+CheckpointVersion+`","checksum":"sha256:00","data":[]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	err := New(cfg, "test").Run(t.Context())
	if err == nil || !strings.Contains(err.Error(), path) {
		t.Fatalf("Run: %v, want an error naming %s", err, path)
	}
	if _, serr := os.Stat(cfg.CRISocket); !os.IsNotExist(serr) {
		t.Errorf("CRI socket exists after a refused start-up: %v", serr)
	}
}

func TestRegistryConcurrentWritesKeepTheLast(t *testing.T) {
	reg := NewRegistry(NewCheckpoint(t.TempDir()), CheckpointData{})
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Go(func() {
			id := string(rune('a' + i))
			if err := reg.Add(sampleRecord(id)); err != nil {
				t.Error(err)
			}
			if i%2 == 0 {
				reg.Remove(id)
			}
		})
	}
	wg.Wait()
	reg.Flush()
	onDisk, err := reg.checkpoint.Read()
	if err != nil {
		t.Fatal(err)
	}
	if len(onDisk) != 10 || !sameRecords(t, onDisk, reg.Sandboxes()) {
		t.Errorf("checkpoint holds %d records, registry %d; want the same 10", len(onDisk), reg.Len())
	}
}

// waitRebuilt waits for a's registry to be rebuilt from the runtime.
func waitRebuilt(t *testing.T, a *Agent) {
	t.Helper()
	select {
	case <-a.rebuilt:
	case <-time.After(30 * time.Second):
		t.Fatal("registry not rebuilt within 30s")
	}
}

func TestRegistryRebuiltAfterRestart(t *testing.T) {
	dir := testfs.ShortDir(t)
	f, backend := startFakeRuntime(t, dir)
	cfg := testConfig(dir, backend)
	cfg.Sysctls.PodDefaults = map[string]string{"net.ipv4.tcp_keepalive_time": "600"}

	first := New(cfg, "test")
	stop := runAgentOf(t, first)
	waitRebuilt(t, first)
	client := criClient(t, cfg.CRISocket)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	var ids []string
	for _, name := range []string{"a", "b", "c"} {
		resp, err := client.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: podConfig(name)}, grpc.WaitForReady(true))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, resp.PodSandboxId)
	}
	if _, err := client.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: ids[2]}); err != nil {
		t.Fatal(err)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	before := first.sandboxes.Sandboxes()
	if len(before) != 3 {
		t.Fatalf("registry before the restart: %+v", before)
	}

	// Same runtime, same state: the registry is the same.
	second := New(cfg, "test")
	stop = runAgentOf(t, second)
	waitRebuilt(t, second)
	if after := second.sandboxes.Sandboxes(); !sameRecords(t, after, before) {
		t.Errorf("registry after the restart:\n%+v\nwant the one before:\n%+v", after, before)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}

	// While podgate is down, one sandbox goes and one comes, past podgate.
	if err := f.RuntimeService.RemovePodSandbox(ctx, ids[0]); err != nil {
		t.Fatal(err)
	}
	adoptedID, err := f.RuntimeService.RunPodSandbox(ctx, podConfig("d"), "")
	if err != nil {
		t.Fatal(err)
	}
	third := New(cfg, "test")
	stop = runAgentOf(t, third)
	defer stop() //nolint:errcheck // the assertions are on the registry
	waitRebuilt(t, third)
	after := third.sandboxes.Sandboxes()
	if len(after) != 3 {
		t.Fatalf("registry after changes past podgate: %+v", after)
	}
	if _, ok := third.sandboxes.Sandbox(ids[0]); ok {
		t.Errorf("sandbox %s removed past podgate is still recorded", ids[0])
	}
	kept, _ := third.sandboxes.Sandbox(ids[1])
	if kept.Origin != OriginStarted || kept.Sysctls.Applied["net.ipv4.tcp_keepalive_time"] != "600" {
		t.Errorf("sandbox podgate saw start lost what it knew: %+v", kept)
	}
	adopted, ok := third.sandboxes.Sandbox(adoptedID)
	if !ok || adopted.Origin != OriginAdopted || adopted.Sysctls.Verification != SysctlsUnverified || adopted.Pod.Name != "d" {
		t.Errorf("sandbox started past podgate: %+v, %v; want adopted, sysctls unverified", adopted, ok)
	}
	third.sandboxes.Flush()
	onDisk, err := NewCheckpoint(cfg.StateDir).Read()
	if err != nil || !sameRecords(t, onDisk, after) {
		t.Errorf("checkpoint %+v (%v), want the rebuilt registry", onDisk, err)
	}
}

func TestReconcileLeavesWhatThePipelineTouched(t *testing.T) {
	reg := NewRegistry(nil, CheckpointData{Sandboxes: []SandboxRecord{sampleRecord("known"), sampleRecord("gone")}})
	end := reg.beginRebuild()
	// While the rebuild lists the runtime, the pipeline records a new sandbox and removes
	// one it failed (which the runtime listing still shows).
	started := sampleRecord("new")
	if err := reg.Add(started); err != nil {
		t.Fatal(err)
	}
	reg.Remove("failed")
	seenKnown := sampleRecord("known")
	seenKnown.Origin, seenKnown.Ready, seenKnown.IPs = OriginAdopted, false, []string{"10.88.0.9"}
	seenFailed := sampleRecord("failed")
	seenFailed.Origin = OriginAdopted
	added, dropped := reg.reconcile([]SandboxRecord{seenKnown, seenFailed})
	end()
	if added != 0 || dropped != 1 {
		t.Errorf("reconcile added %d, dropped %d; want 0 and 1 (gone)", added, dropped)
	}
	var ids []string
	for _, r := range reg.Sandboxes() {
		ids = append(ids, r.ID)
	}
	if strings.Join(ids, ",") != "known,new" {
		t.Errorf("registry holds %v, want known and new", ids)
	}
	known, _ := reg.Sandbox("known")
	if known.Origin != OriginStarted || known.Ready || known.IPs[0] != "10.88.0.9" {
		t.Errorf("known sandbox %+v: want its origin kept and the runtime's state taken", known)
	}
}
