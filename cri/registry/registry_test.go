package registry

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
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
	}
}

func TestCheckpointRoundTrip(t *testing.T) {
	cp := NewCheckpoint(t.TempDir())
	if recs, err := cp.Read(); err != nil || recs != nil {
		t.Fatalf("missing checkpoint: %v, %v; want nothing and no error", recs, err)
	}
	want := CheckpointData{
		Sandboxes: []SandboxRecord{sampleRecord("a"), sampleRecord("b")},
		Sections: map[string]json.RawMessage{
			"claims": json.RawMessage(`[{"uid":"claim-uid","namespace":"ns","name":"net","drivers":["net.example"],"prepared":true,` +
				`"devices":[{"driver":"net.example","pool":"node-a","device":"nic0","requests":["nic"],"cdiDeviceIDs":["net.example/nic=nic0"]}],"podUIDs":["uid-a"]}]`),
			"draPods": json.RawMessage(`[{"pod":{"uid":"uid-a","name":"a","namespace":"ns"},"claims":[{"uid":"claim-uid","podClaimName":"net"}]}]`),
		},
		Version: checkpointV2,
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
			return bytes.Replace(b, []byte(checkpointVersionV2), []byte("podgate.dev/registry/v9"), 1)
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
	added, dropped := reg.reconcile(inRuntime(seenKnown, seenFailed), nil)
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

// A sandbox's changes wait WriteDelay and reach the disk in one write; Flush writes them at
// once.
func TestSandboxWritesWaitAndCoalesce(t *testing.T) {
	reg := NewRegistry(NewCheckpoint(t.TempDir()), CheckpointData{})
	reg.SetWriteDelay(time.Hour) // never runs out during the test: only Flush writes
	if err := reg.Add(sampleRecord("a")); err != nil {
		t.Fatal(err)
	}
	reg.Update("a", func(r *SandboxRecord) { r.IPs = []string{"10.88.0.8"} })
	reg.Update("a", func(r *SandboxRecord) { r.Status = "status read late" })
	if _, err := os.Stat(reg.checkpoint.Path()); !os.IsNotExist(err) {
		t.Fatalf("checkpoint written before its delay: %v", err)
	}
	reg.Flush()
	onDisk, err := reg.checkpoint.Read()
	if err != nil {
		t.Fatal(err)
	}
	if len(onDisk) != 1 || onDisk[0].IPs[0] != "10.88.0.8" || onDisk[0].Status != "status read late" {
		t.Fatalf("checkpoint after Flush: %+v; want sandbox a with both updates", onDisk)
	}
	// The next background write waits WriteInterval from this one.
	before := time.Now()
	reg.mu.Lock()
	reg.writeDelay = WriteDelay
	next := reg.delayLocked(before)
	reg.mu.Unlock()
	if next <= WriteDelay || next > WriteInterval {
		t.Errorf("next background write after %s, want WriteInterval (%s) from the last one", next, WriteInterval)
	}

	// A change of the DRA claims, written at once, is package manager's TestClaimChangeIsWrittenAtOnce.
}

// Flush ends a write queued while it waits for another one.
func TestFlushWritesWhatIsQueuedMeanwhile(t *testing.T) {
	reg := NewRegistry(NewCheckpoint(t.TempDir()), CheckpointData{})
	reg.SetWriteDelay(time.Hour)
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			if err := reg.Add(sampleRecord(string(rune('a' + i)))); err != nil {
				t.Error(err)
			}
			reg.Flush()
		})
	}
	wg.Wait()
	reg.Flush()
	onDisk, err := reg.checkpoint.Read()
	if err != nil {
		t.Fatal(err)
	}
	if len(onDisk) != 8 {
		t.Errorf("checkpoint holds %d records, want 8", len(onDisk))
	}
}

// inRuntime are records as the runtime reports them to a rebuild.
func inRuntime(recs ...SandboxRecord) []runtimeSandbox {
	out := make([]runtimeSandbox, len(recs))
	for i := range recs {
		out[i] = runtimeSandbox{SandboxRecord: recs[i]}
	}
	return out
}

// Background writes start WriteDelay after the change that queued them, and WriteInterval at
// least after the last one began; a delay of 0 writes at once.
func TestWriteDelayInterval(t *testing.T) {
	reg := NewRegistry(nil, CheckpointData{})
	now := time.Now()
	for _, tc := range []struct {
		name      string
		delay     time.Duration
		lastWrite time.Time
		want      time.Duration
	}{
		{"first write", WriteDelay, time.Time{}, WriteDelay},
		{"right after a write", WriteDelay, now, WriteInterval},
		{"halfway", WriteDelay, now.Add(-WriteInterval / 2), WriteInterval / 2},
		{"long after", WriteDelay, now.Add(-time.Hour), WriteDelay},
		{"no delay", 0, now, 0},
	} {
		reg.mu.Lock()
		reg.writeDelay, reg.lastWrite = tc.delay, tc.lastWrite
		got := reg.delayLocked(now)
		reg.mu.Unlock()
		if got != tc.want {
			t.Errorf("%s: delay %s, want %s", tc.name, got, tc.want)
		}
	}
}
