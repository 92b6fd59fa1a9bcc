package registry

import (
	"encoding/json"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

func sampleIntent(sandbox, hostIf string) AttachIntent {
	return AttachIntent{
		SandboxID: sandbox, Pod: PodRef{UID: types.UID("uid-" + sandbox), Name: sandbox, Namespace: "ns"}, NetNS: "/var/run/netns/cni-" + sandbox,
		ClaimNamespace: "ns", ClaimName: "net", ClaimUID: "claim-1", Driver: "net.example.com", Pool: "pool", Device: "dev-" + hostIf,
		HostInterface: hostIf, Config: InterfaceConfig{Name: "net1", Addresses: []string{"192.0.2.7/24"}},
	}
}

// fileVersion is the version the checkpoint file at path says.
func fileVersion(t *testing.T, path string) string {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var f checkpointFile
	if err := json.Unmarshal(raw, &f); err != nil {
		t.Fatal(err)
	}
	return f.Version
}

// reopen is a restart: a registry from what the checkpoint holds now.
func reopen(t *testing.T, cp *Checkpoint) *Registry {
	t.Helper()
	d, err := cp.ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	return NewRegistry(cp, d)
}

// TestAttachIntentIsDurableBeforeTheMove: an intent to attach a device is on disk when
// BeginAttach returns (a v3 file), and not recorded when it cannot be written; after a restart
// it is left, for the start-up to settle; once the sandbox's record takes the device up (Add),
// the intent is gone from the same write, and the file is v2 again.
func TestAttachIntentIsDurableBeforeTheMove(t *testing.T) {
	dir := t.TempDir()
	cp := NewCheckpoint(dir)
	reg := NewRegistry(cp, CheckpointData{})
	reg.SetWriteDelay(time.Hour) // only the writes that must be synchronous write
	in := sampleIntent("sb", "veth7")
	if err := reg.BeginAttach(in); err != nil {
		t.Fatal(err)
	}
	onDisk, err := cp.ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	if !sameJSON(t, onDisk.Attaching, []AttachIntent{in}) || fileVersion(t, cp.Path()) != CheckpointVersion {
		t.Fatalf("checkpoint when BeginAttach returned: %+v, version %s; want the intent, %s", onDisk.Attaching, fileVersion(t, cp.Path()), CheckpointVersion)
	}
	if left := reg.LeftAttaches(); len(left) != 0 {
		t.Errorf("an intent of a call under way is left: %+v", left)
	}

	restarted := reopen(t, cp)
	if left := restarted.LeftAttaches(); !sameJSON(t, left, []AttachIntent{in}) {
		t.Errorf("after a restart, left intents %+v, want %+v", left, in)
	}

	// The record stage: Add takes the device up and drops its intent in one write.
	rec := sampleRecord("sb")
	rec.Attached = []AttachedDevice{in.Attached(AttachedInterface{HostName: "veth7", PodName: "net1"})}
	if err := reg.Add(rec); err != nil {
		t.Fatal(err)
	}
	onDisk, err = cp.ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	if len(onDisk.Attaching) != 0 || len(onDisk.Sandboxes) != 1 || len(onDisk.Sandboxes[0].Attached) != 1 {
		t.Errorf("checkpoint when Add returned: %+v; want the record with its device and no intent", onDisk)
	}
	if v := fileVersion(t, cp.Path()); v != checkpointVersionV2 {
		t.Errorf("checkpoint without intents written as %s, want %s (which older podgates read)", v, checkpointVersionV2)
	}
	if got := reg.AttachIntents("sb"); len(got) != 0 {
		t.Errorf("intents after Add: %+v", got)
	}

	// The checkpoint cannot be written: no intent, and the caller must not move the device.
	if err := os.Remove(cp.Path()); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(cp.Path(), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := reg.BeginAttach(sampleIntent("sb2", "veth8")); err == nil || !strings.Contains(err.Error(), "pod registry") {
		t.Errorf("BeginAttach with the checkpoint not writable: %v, want its failure", err)
	}
	if reg.HasAttachIntent("sb2", "veth8") {
		t.Error("an intent counts although it is not on disk")
	}
	if err := os.Remove(cp.Path()); err != nil {
		t.Fatal(err)
	}
	reg.Flush()
}

// TestSettleAttach: a left intent whose device is in the pod becomes the sandbox's attached
// device in one write; one whose sandbox is not recorded changes nothing; EndAttach forgets one
// (in the background); an intent whose call ended without settling it is left.
func TestSettleAttach(t *testing.T) {
	dir := t.TempDir()
	cp := NewCheckpoint(dir)
	reg := NewRegistry(cp, CheckpointData{Sandboxes: []SandboxRecord{sampleRecord("sb")}})
	reg.SetWriteDelay(time.Hour)
	for _, in := range []AttachIntent{sampleIntent("sb", "veth7"), sampleIntent("gone", "veth8"), sampleIntent("sb", "veth9")} {
		if err := reg.BeginAttach(in); err != nil {
			t.Fatal(err)
		}
	}
	reg.LeaveAttaches("sb")
	left := reg.LeftAttaches()
	if len(left) != 2 || left[0].HostInterface != "veth7" || left[1].HostInterface != "veth9" {
		t.Fatalf("left after the call ended: %+v, want sb's two", left)
	}

	in := left[0]
	dev := in.Attached(AttachedInterface{HostName: "veth7", PodName: "net1", Addresses: in.Config.Addresses})
	if ok, err := reg.SettleAttach("sb", dev); !ok || err != nil {
		t.Fatalf("SettleAttach: %t, %v", ok, err)
	}
	onDisk, err := cp.ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	if len(onDisk.Sandboxes) != 1 || !sameJSON(t, onDisk.Sandboxes[0].Attached, []AttachedDevice{dev}) {
		t.Errorf("checkpoint after SettleAttach: sandboxes %+v, want sb with the device", onDisk.Sandboxes)
	}
	if got := slices.IndexFunc(onDisk.Attaching, func(a AttachIntent) bool { return a.HostInterface == "veth7" }); got >= 0 {
		t.Errorf("settled intent still on disk: %+v", onDisk.Attaching)
	}
	if rec, _ := reg.Sandbox("sb"); !sameJSON(t, rec.Attached, []AttachedDevice{dev}) {
		t.Errorf("record after SettleAttach: %+v", rec.Attached)
	}
	// Settling again replaces the device, not adds it.
	if ok, err := reg.SettleAttach("sb", dev); !ok || err != nil {
		t.Fatalf("SettleAttach again: %t, %v", ok, err)
	}
	if rec, _ := reg.Sandbox("sb"); len(rec.Attached) != 1 {
		t.Errorf("record after settling twice: %+v", rec.Attached)
	}

	gone := sampleIntent("gone", "veth8")
	if ok, err := reg.SettleAttach("gone", gone.Attached(AttachedInterface{HostName: "veth8", PodName: "net1"})); ok || err != nil {
		t.Errorf("SettleAttach of a sandbox not recorded: %t, %v; want false, nil", ok, err)
	}
	if !reg.HasAttachIntent("gone", "veth8") {
		t.Error("intent of a sandbox not recorded dropped by SettleAttach")
	}
	reg.EndAttach("gone", "veth8")
	reg.EndAttach("sb", "veth9")
	reg.Flush()
	if restarted := reopen(t, cp); len(restarted.LeftAttaches()) != 0 {
		t.Errorf("after EndAttach and a restart, left: %+v", restarted.LeftAttaches())
	}
}

// TestRecordGoneLeavesItsDevices: a record that goes while it holds attached devices (removed
// after a stop past podgate, or dropped by the rebuild because the runtime no longer has the
// sandbox) leaves them as intents, to be given back.
func TestRecordGoneLeavesItsDevices(t *testing.T) {
	for _, how := range []string{"removed", "rebuild"} {
		t.Run(how, func(t *testing.T) {
			reg := NewRegistry(nil, CheckpointData{})
			rec := sampleRecord("sb")
			in := sampleIntent("sb", "veth7")
			rec.Attached = []AttachedDevice{in.Attached(AttachedInterface{HostName: "veth7", PodName: "net1", Addresses: in.Config.Addresses})}
			if err := reg.Add(rec); err != nil {
				t.Fatal(err)
			}
			if how == "removed" {
				reg.Remove("sb")
			} else {
				reg.reconcile(nil, nil)
			}
			left := reg.LeftAttaches()
			in.NetNS = rec.NetNS
			in.Pod = rec.Pod
			if !sameJSON(t, left, []AttachIntent{in}) {
				t.Errorf("left intents %+v, want %+v", left, in)
			}
		})
	}
}
