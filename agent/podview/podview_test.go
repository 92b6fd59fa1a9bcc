package podview

import (
	"encoding/json"
	"testing"
	"time"

	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/google/go-cmp/cmp"

	"github.com/podgate/podgate/agent/state"
	"github.com/podgate/podgate/cri/registry"
	"github.com/podgate/podgate/dra/attach"
	"github.com/podgate/podgate/dra/dratest/rig"
	"github.com/podgate/podgate/dra/manager"
	pb "github.com/podgate/podgate/podresources/api/v1alpha1"
	"github.com/podgate/podgate/sysctl"
)

// podChanges records what the registry tells of its pods' changes.
type podChanges struct {
	events []*pb.WatchEvent
}

func watchRegistry(r *registry.Registry) *podChanges {
	c := &podChanges{}
	r.OnPodChange(func(rev uint64, before, after *registry.PodState) {
		if ev := Event(rev, before, after); ev != nil {
			c.events = append(c.events, ev)
		}
	})
	return c
}

func (c *podChanges) types() []pb.WatchEvent_Type {
	var out []pb.WatchEvent_Type
	for _, ev := range c.events {
		out = append(out, ev.GetType())
	}
	return out
}

// TestRegistryPodChanges: the registry tells every change of a pod, in order, with the kind a
// watcher sees: added when its claims are recorded (before any sandbox), devices prepared,
// updated by its sandbox, removed once neither sandbox nor claims are left; a change that
// changes nothing visible is not told.
func TestRegistryPodChanges(t *testing.T) {
	st := memoryStateOf(t, registry.CheckpointData{})
	r, claims := st.Sandboxes, st.Claims
	changes := watchRegistry(r)

	rig.RecordPodClaims(t, claims, rig.WebClaims(false))
	rig.RecordPodClaims(t, claims, rig.WebClaims(true))
	rec := sampleRecord("web")
	rec.Pod = registry.PodRef{UID: "uid-web", Name: "web", Namespace: "ns"}
	if err := r.Add(rec); err != nil {
		t.Fatal(err)
	}
	r.Update(rec.ID, func(*registry.SandboxRecord) {}) // nothing changes
	r.Update(rec.ID, func(s *registry.SandboxRecord) { s.Ready = false })
	r.Remove(rec.ID)
	rig.ForgetPodClaims(t, claims, "uid-web")

	want := []pb.WatchEvent_Type{
		pb.WatchEvent_POD_ADDED, pb.WatchEvent_DEVICES_PREPARED, pb.WatchEvent_POD_UPDATED,
		pb.WatchEvent_POD_UPDATED, pb.WatchEvent_POD_UPDATED, pb.WatchEvent_POD_REMOVED,
	}
	if diff := cmp.Diff(want, changes.types()); diff != "" {
		t.Fatalf("event types (-want +got):\n%s", diff)
	}
	// Every change counts, the one that changes nothing visible (4) too.
	var revs []uint64
	for _, ev := range changes.events {
		revs = append(revs, ev.GetRevision())
	}
	if diff := cmp.Diff([]uint64{1, 2, 3, 5, 6, 7}, revs); diff != "" {
		t.Errorf("event revisions (-want +got):\n%s", diff)
	}
	if _, rev := r.Pods(); rev != 7 {
		t.Errorf("registry revision %d, want 7", rev)
	}
	if got := changes.events[3].GetPod().GetSandbox().GetState(); got != pb.Sandbox_NOT_READY {
		t.Errorf("after the stop the sandbox is %v, want NOT_READY", got)
	}
	removed := changes.events[5].GetPod()
	if removed.GetName() != "web" || len(removed.GetClaims()) != 1 {
		t.Errorf("POD_REMOVED carries %v, want the pod's last state with its claim", removed)
	}
}

// TestPodMessage: a pod's message shows its newest sandbox with its sysctls, and its claims'
// devices with their network data; an attached device shows what the pod got.
func TestPodMessage(t *testing.T) {
	old := sampleRecord("old")
	old.Pod = registry.PodRef{UID: "uid-web", Name: "web", Namespace: "ns"}
	old.Ready = false
	cur := sampleRecord("cur")
	cur.Pod = old.Pod
	cur.CreatedAt = old.CreatedAt.Add(time.Minute)
	// The features' records of the sandboxes, as the checkpoint holds them.
	st := memoryStateOf(t, registry.CheckpointData{
		Sandboxes: []registry.SandboxRecord{old, cur},
		SandboxFields: map[string]map[string]json.RawMessage{
			"old": {"sysctls": json.RawMessage(`{"verification":"mismatch"}`)},
			"cur": {
				"sysctls": json.RawMessage(`{"asked":{"net.ipv4.tcp_keepalive_time":"600"},"applied":{"net.ipv4.tcp_keepalive_time":"600"},"verification":"ok"}`),
				"attached": json.RawMessage(`[{"claimNamespace":"ns","claimName":"web-nic","claimUID":"claim-uid","driver":"net.example.com","pool":"node-a","device":"nic0",` +
					`"interface":{"hostName":"eth5","podName":"net1","hardwareAddr":"02:00:00:00:00:01","addresses":["192.0.2.10/24"]}}]`),
			},
		},
	})
	rig.RecordPodClaims(t, st.Claims, rig.WebClaims(true))
	pod, ok := st.Sandboxes.PodByName("ns", "web")
	if !ok {
		t.Fatal("pod web not known")
	}
	got := Message(&pod)
	want := &pb.Pod{
		Uid: "uid-web", Name: "web", Namespace: "ns",
		Sandbox: &pb.Sandbox{
			Id: "cur", State: pb.Sandbox_READY, Netns: cur.NetNS, Ips: cur.IPs, CreatedAt: timestamppb.New(cur.CreatedAt),
			Sysctls: &pb.Sysctls{Asked: map[string]string{"net.ipv4.tcp_keepalive_time": "600"}, Applied: map[string]string{"net.ipv4.tcp_keepalive_time": "600"}, Verification: sysctl.ResultOK},
		},
		Claims: []*pb.Claim{{
			Namespace: "ns", Name: "web-nic", Uid: "claim-uid", PodClaimName: "nic", Prepared: true,
			Devices: []*pb.Device{{
				Driver: "net.example.com", Pool: "node-a", Device: "nic0", Requests: []string{"nic"}, CdiDeviceIds: []string{"net.example.com/nic=nic0"},
				Network: &pb.NetworkData{HostInterface: "eth5", InterfaceName: "net1", Ips: []string{"192.0.2.10/24"}, Mtu: 1400, HardwareAddress: "02:00:00:00:00:01", Attached: true},
			}},
		}},
	}
	if diff := cmp.Diff(want, got, protocmp.Transform()); diff != "" {
		t.Errorf("podMessage (-want +got):\n%s", diff)
	}
}

// memoryStateOf is podgate's state in memory, holding d as if read from the checkpoint.
func memoryStateOf(t testing.TB, d registry.CheckpointData) *state.State {
	t.Helper()
	reg := registry.NewRegistry(nil, d)
	claims, err := manager.NewClaims(reg)
	if err != nil {
		t.Fatal(err)
	}
	intents, err := attach.NewIntents(reg)
	if err != nil {
		t.Fatal(err)
	}
	sysctls, err := sysctl.NewRecords(reg)
	if err != nil {
		t.Fatal(err)
	}
	return &state.State{Sandboxes: reg, Claims: claims, Intents: intents, Sysctls: sysctls}
}
