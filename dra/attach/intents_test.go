package attach

import (
	"context"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/apimachinery/pkg/types"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podgate/podgate/cri/registry"
	"github.com/podgate/podgate/dra"
	"github.com/podgate/podgate/test/testfs"
)

// sampleRecord is a started, verified sandbox record of pod "uid-"+id.
func sampleRecord(id string) registry.SandboxRecord {
	return registry.SandboxRecord{
		ID:        id,
		Pod:       registry.PodRef{UID: types.UID("uid-" + id), Name: id, Namespace: "ns"},
		Origin:    registry.OriginStarted,
		Ready:     true,
		CreatedAt: time.Date(2026, 11, 22, 3, 0, 0, 0, time.UTC),
		NetNS:     "/var/run/netns/cni-" + id,
		PID:       42,
		IPs:       []string{"10.88.0.7"},
	}
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
	return string(ja) == string(jb)
}

// checkpointVersionV2 is the format a checkpoint without intents is written as.
const checkpointVersionV2 = "podgate.dev/registry/v2"

// newIntents is a registry of cp holding d, with its attach intents.
func newIntents(t *testing.T, cp *registry.Checkpoint, d registry.CheckpointData) (*registry.Registry, *Intents) {
	t.Helper()
	reg := registry.NewRegistry(cp, d)
	in, err := NewIntents(reg)
	if err != nil {
		t.Fatal(err)
	}
	return reg, in
}

// onDiskIntents are the intents the checkpoint data d holds.
func onDiskIntents(t *testing.T, d registry.CheckpointData) []Intent {
	t.Helper()
	var out []Intent
	if raw, ok := d.Sections["attaching"]; ok {
		if err := json.Unmarshal(raw, &out); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

func sampleIntent(sandbox, hostIf string) Intent {
	return Intent{
		SandboxID: sandbox, Pod: registry.PodRef{UID: types.UID("uid-" + sandbox), Name: sandbox, Namespace: "ns"}, NetNS: "/var/run/netns/cni-" + sandbox,
		ClaimNamespace: "ns", ClaimName: "net", ClaimUID: "claim-1", Driver: "net.example.com", Pool: "pool", Device: "dev-" + hostIf,
		HostInterface: hostIf, Config: dra.InterfaceConfig{Name: "net1", Addresses: []string{"192.0.2.7/24"}},
	}
}

// readAll is what the checkpoint holds.
func readAll(t *testing.T, cp *registry.Checkpoint) registry.CheckpointData {
	t.Helper()
	d, err := cp.ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// onDiskAttached are the devices the checkpoint data d holds as attached to the sandbox.
func onDiskAttached(t *testing.T, d registry.CheckpointData, sandboxID string) []Device {
	t.Helper()
	var out []Device
	if raw, ok := d.SandboxFields[sandboxID]["attached"]; ok {
		if err := json.Unmarshal(raw, &out); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// fileVersion is the version the checkpoint file at path says.
func fileVersion(t *testing.T, path string) string {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Version string `json:"version"`
	}
	if err := json.Unmarshal(raw, &f); err != nil {
		t.Fatal(err)
	}
	return f.Version
}

// reopen is a restart: a registry from what the checkpoint holds now, and its intents.
func reopen(t *testing.T, cp *registry.Checkpoint) *Intents {
	t.Helper()
	d, err := cp.ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	_, in := newIntents(t, cp, d)
	return in
}

// TestAttachIntentIsDurableBeforeTheMove: an intent to attach a device is on disk when
// BeginAttach returns (a v3 file), and not recorded when it cannot be written; after a restart
// it is left, for the start-up to settle; once the sandbox's record takes the device up (Add),
// the intent is gone from the same write, and the file is v2 again.
func TestAttachIntentIsDurableBeforeTheMove(t *testing.T) {
	dir := t.TempDir()
	cp := registry.NewCheckpoint(dir)
	reg, intents := newIntents(t, cp, registry.CheckpointData{})
	reg.SetWriteDelay(time.Hour) // only the writes that must be synchronous write
	in := sampleIntent("sb", "veth7")
	if err := intents.BeginAttach(in); err != nil {
		t.Fatal(err)
	}
	onDisk, err := cp.ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	if !sameJSON(t, onDiskIntents(t, onDisk), []Intent{in}) || fileVersion(t, cp.Path()) != registry.CheckpointVersion {
		t.Fatalf("checkpoint when BeginAttach returned: %+v, version %s; want the intent, %s", onDiskIntents(t, onDisk), fileVersion(t, cp.Path()), registry.CheckpointVersion)
	}
	if left := intents.LeftAttaches(); len(left) != 0 {
		t.Errorf("an intent of a call under way is left: %+v", left)
	}

	restarted := reopen(t, cp)
	if left := restarted.LeftAttaches(); !sameJSON(t, left, []Intent{in}) {
		t.Errorf("after a restart, left intents %+v, want %+v", left, in)
	}

	// The attach stage records the device as attached to the sandbox, not written yet: the
	// sandbox is not recorded.
	intents.setAttached("sb", []Device{in.Attached(dra.Attached{HostName: "veth7", PodName: "net1"})})
	reg.PersistSoon()
	reg.Flush()
	if onDisk := readAll(t, cp); !sameJSON(t, onDiskIntents(t, onDisk), []Intent{in}) || len(onDisk.SandboxFields) != 0 {
		t.Errorf("checkpoint before the sandbox is recorded: %+v; want the intent alone", onDisk)
	}
	// The record stage: Add writes the sandbox with its device and drops its intent in one
	// write.
	if err := reg.Add(sampleRecord("sb")); err != nil {
		t.Fatal(err)
	}
	onDisk = readAll(t, cp)
	if len(onDiskIntents(t, onDisk)) != 0 || len(onDisk.Sandboxes) != 1 || len(onDiskAttached(t, onDisk, "sb")) != 1 {
		t.Errorf("checkpoint when Add returned: %+v; want the record with its device and no intent", onDisk)
	}
	if v := fileVersion(t, cp.Path()); v != checkpointVersionV2 {
		t.Errorf("checkpoint without intents written as %s, want %s (which older podgates read)", v, checkpointVersionV2)
	}
	if got := intents.AttachIntents("sb"); len(got) != 0 {
		t.Errorf("intents after Add: %+v", got)
	}

	// The checkpoint cannot be written: no intent, and the caller must not move the device.
	if err := os.Remove(cp.Path()); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(cp.Path(), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := intents.BeginAttach(sampleIntent("sb2", "veth8")); err == nil || !strings.Contains(err.Error(), "pod registry") {
		t.Errorf("BeginAttach with the checkpoint not writable: %v, want its failure", err)
	}
	if intents.HasAttachIntent("sb2", "veth8") {
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
	cp := registry.NewCheckpoint(dir)
	reg, intents := newIntents(t, cp, registry.CheckpointData{Sandboxes: []registry.SandboxRecord{sampleRecord("sb")}})
	reg.SetWriteDelay(time.Hour)
	for _, in := range []Intent{sampleIntent("sb", "veth7"), sampleIntent("gone", "veth8"), sampleIntent("sb", "veth9")} {
		if err := intents.BeginAttach(in); err != nil {
			t.Fatal(err)
		}
	}
	intents.LeaveAttaches("sb")
	left := intents.LeftAttaches()
	if len(left) != 2 || left[0].HostInterface != "veth7" || left[1].HostInterface != "veth9" {
		t.Fatalf("left after the call ended: %+v, want sb's two", left)
	}

	in := left[0]
	dev := in.Attached(dra.Attached{HostName: "veth7", PodName: "net1", Addresses: in.Config.Addresses})
	if ok, err := intents.SettleAttach("sb", dev); !ok || err != nil {
		t.Fatalf("SettleAttach: %t, %v", ok, err)
	}
	onDisk := readAll(t, cp)
	if len(onDisk.Sandboxes) != 1 || !sameJSON(t, onDiskAttached(t, onDisk, "sb"), []Device{dev}) {
		t.Errorf("checkpoint after SettleAttach: sandboxes %+v %s, want sb with the device", onDisk.Sandboxes, onDisk.SandboxFields)
	}
	if got := slices.IndexFunc(onDiskIntents(t, onDisk), func(a Intent) bool { return a.HostInterface == "veth7" }); got >= 0 {
		t.Errorf("settled intent still on disk: %+v", onDiskIntents(t, onDisk))
	}
	if got := intents.Attached("sb"); !sameJSON(t, got, []Device{dev}) {
		t.Errorf("devices attached to sb after SettleAttach: %+v", got)
	}
	// Settling again replaces the device, not adds it.
	if ok, err := intents.SettleAttach("sb", dev); !ok || err != nil {
		t.Fatalf("SettleAttach again: %t, %v", ok, err)
	}
	if got := intents.Attached("sb"); len(got) != 1 {
		t.Errorf("devices attached to sb after settling twice: %+v", got)
	}

	gone := sampleIntent("gone", "veth8")
	if ok, err := intents.SettleAttach("gone", gone.Attached(dra.Attached{HostName: "veth8", PodName: "net1"})); ok || err != nil {
		t.Errorf("SettleAttach of a sandbox not recorded: %t, %v; want false, nil", ok, err)
	}
	if !intents.HasAttachIntent("gone", "veth8") {
		t.Error("intent of a sandbox not recorded dropped by SettleAttach")
	}
	intents.EndAttach("gone", "veth8")
	intents.EndAttach("sb", "veth9")
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
			reg, intents := newIntents(t, nil, registry.CheckpointData{})
			rec := sampleRecord("sb")
			in := sampleIntent("sb", "veth7")
			intents.setAttached("sb", []Device{in.Attached(dra.Attached{HostName: "veth7", PodName: "net1", Addresses: in.Config.Addresses})})
			if err := reg.Add(rec); err != nil {
				t.Fatal(err)
			}
			if how == "removed" {
				reg.Remove("sb")
			} else {
				rebuildFromEmptyRuntime(t, reg)
			}
			left := intents.LeftAttaches()
			in.NetNS = rec.NetNS
			in.Pod = rec.Pod
			if !sameJSON(t, left, []Intent{in}) {
				t.Errorf("left intents %+v, want %+v", left, in)
			}
			if got := intents.Attached("sb"); len(got) != 0 {
				t.Errorf("devices still attached to the sandbox gone: %+v", got)
			}
		})
	}
}

// emptyRuntime is a runtime with no sandbox and no container.
type emptyRuntime struct {
	runtimeapi.UnimplementedRuntimeServiceServer
}

func (emptyRuntime) ListPodSandbox(context.Context, *runtimeapi.ListPodSandboxRequest) (*runtimeapi.ListPodSandboxResponse, error) {
	return &runtimeapi.ListPodSandboxResponse{}, nil
}

func (emptyRuntime) ListContainers(context.Context, *runtimeapi.ListContainersRequest) (*runtimeapi.ListContainersResponse, error) {
	return &runtimeapi.ListContainersResponse{}, nil
}

// rebuildFromEmptyRuntime rebuilds reg from a runtime, served on a unix socket, that has no
// sandbox any more.
func rebuildFromEmptyRuntime(t *testing.T, reg *registry.Registry) {
	t.Helper()
	sock := filepath.Join(testfs.ShortDir(t), "rt.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	runtimeapi.RegisterRuntimeServiceServer(srv, emptyRuntime{})
	go srv.Serve(l) //nolint:errcheck // returns once stopped
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if _, _, dropped, err := reg.Rebuild(t.Context(), runtimeapi.NewRuntimeServiceClient(conn)); err != nil || dropped != 1 {
		t.Fatalf("Rebuild: dropped %d, %v; want the sandbox dropped", dropped, err)
	}
}

// TestAttachedDevicesShownWithThePod: the devices attached to a sandbox are an obligation (the
// sandbox is written before it counts), show with its pod from the record's publication on,
// and a give back is a change of the pod, told with the devices before and after, and written
// in the background; the devices of a call that failed before its sandbox was recorded are
// forgotten.
func TestAttachedDevicesShownWithThePod(t *testing.T) {
	cp := registry.NewCheckpoint(t.TempDir())
	reg, intents := newIntents(t, cp, registry.CheckpointData{})
	reg.SetWriteDelay(time.Hour)
	var told [][2]int // devices attached to sb before and after each change
	reg.OnPodChange(func(_ uint64, before, after *registry.PodState) {
		count := func(st *registry.PodState) int {
			if st == nil {
				return -1
			}
			return len(InPod(st)["sb"])
		}
		told = append(told, [2]int{count(before), count(after)})
	})
	in7, in8 := sampleIntent("sb", "veth7"), sampleIntent("sb", "veth8")
	devs := []Device{in7.Attached(dra.Attached{HostName: "veth7", PodName: "net1"}), in8.Attached(dra.Attached{HostName: "veth8", PodName: "net2"})}
	intents.setAttached("sb", devs)
	if !intents.Obliged("sb") || intents.Obliged("other") {
		t.Errorf("obliged: sb %t, other %t; want sb only", intents.Obliged("sb"), intents.Obliged("other"))
	}
	if err := reg.Add(sampleRecord("sb")); err != nil {
		t.Fatal(err)
	}
	if got := onDiskAttached(t, readAll(t, cp), "sb"); !sameJSON(t, got, devs) {
		t.Errorf("checkpoint when Add returned holds %+v, want both devices", got)
	}
	intents.keepAttached("sb", devs[:1])
	intents.keepAttached("sb", nil)
	if d := cmp.Diff([][2]int{{-1, 2}, {2, 1}, {1, 0}}, told); d != "" {
		t.Errorf("changes told (-want +got):\n%s", d)
	}
	if intents.Obliged("sb") {
		t.Error("a sandbox whose devices were all given back is still an obligation")
	}
	reg.Flush()
	if d := readAll(t, cp); d.SandboxFields["sb"]["attached"] != nil {
		t.Errorf("checkpoint after the give backs holds %s", d.SandboxFields["sb"]["attached"])
	}

	intents.setAttached("failed", devs)
	intents.forgetAttached("failed")
	if got := intents.Attached("failed"); len(got) != 0 {
		t.Errorf("devices of a failed call still recorded: %+v", got)
	}
}
