package rig

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/podgate/podgate/cri/registry"
	"github.com/podgate/podgate/dra/attach"
	"github.com/podgate/podgate/dra/manager"
)

// Driver is the fake driver's name.
const Driver = "net.example.com"

// Node is the name of the rig's node.
const Node = "node-a"

// Pod is pod "pod-"+uid (UID "uid-"+uid) in default on Node with one claim per name, each
// naming a ResourceClaim of that name.
func Pod(uid string, claims ...string) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "pod-" + uid, UID: types.UID("uid-" + uid)},
		Spec:       corev1.PodSpec{NodeName: Node},
	}
	for _, c := range claims {
		p.Spec.ResourceClaims = append(p.Spec.ResourceClaims, corev1.PodResourceClaim{Name: c, ResourceClaimName: ptr.To(c)})
	}
	return p
}

// Claim is claim name in default (UID "claim-"+name), allocated to one device of Driver
// ("dev-"+name in pool "pool", for request "req"), reserved for pods.
func Claim(name string, pods ...*corev1.Pod) *resourceapi.ResourceClaim {
	c := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: types.UID("claim-" + name)},
		Status: resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{
			Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{
				{Request: "req", Driver: Driver, Pool: "pool", Device: "dev-" + name},
			}},
		}},
	}
	for _, p := range pods {
		c.Status.ReservedFor = append(c.Status.ReservedFor, resourceapi.ResourceClaimConsumerReference{Resource: "pods", Name: p.Name, UID: p.UID})
	}
	return c
}

// RecordPodClaims records pc in the claim store as the prepare stage does: the pod as a user
// of its claims (durable), then the devices of those it holds prepared.
func RecordPodClaims(t testing.TB, store *manager.Claims, pc manager.PodClaims) {
	t.Helper()
	uses := make([]manager.ClaimUse, len(pc.Claims))
	prepared := map[types.UID][]manager.DeviceRecord{}
	for i, c := range pc.Claims {
		uses[i] = manager.ClaimUse{UID: c.UID, Namespace: c.Namespace, Name: c.Name, PodClaimName: c.PodClaimName, Drivers: c.Drivers}
		if c.Prepared {
			prepared[c.UID] = c.Devices
		}
	}
	if err := store.UseClaims(pc.Pod, pc.Containers, uses); err != nil {
		t.Fatal(err)
	}
	if len(prepared) > 0 {
		if err := store.SetPrepared(prepared); err != nil {
			t.Fatal(err)
		}
	}
}

// ForgetPodClaims releases a pod's claims in the claim store and forgets those no pod uses, as
// the reconciler does once their drivers unprepared them.
func ForgetPodClaims(t testing.TB, store *manager.Claims, uid types.UID) {
	t.Helper()
	unused, err := store.ReleasePod(uid)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range unused {
		if err := store.ClaimUnprepared(c.UID); err != nil {
			t.Fatal(err)
		}
	}
}

// ReadState is podgate's state read from the checkpoint in stateDir, as the agent reads it at
// start-up: the pod registry with the DRA feature's sections, the claims and the attach
// intents.
func ReadState(t testing.TB, stateDir string) (*registry.Registry, *manager.Claims, *attach.Intents) {
	t.Helper()
	cp := registry.NewCheckpoint(stateDir)
	d, err := cp.ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	reg := registry.NewRegistry(cp, d)
	claims, err := manager.NewClaims(reg)
	if err != nil {
		t.Fatal(err)
	}
	intents, err := attach.NewIntents(reg)
	if err != nil {
		t.Fatal(err)
	}
	return reg, claims, intents
}

// Section decodes the checkpoint data's section key into out (left as it is when absent).
func Section(t testing.TB, d registry.CheckpointData, key string, out any) {
	t.Helper()
	if raw, ok := d.Sections[key]; ok {
		if err := json.Unmarshal(raw, out); err != nil {
			t.Fatalf("checkpoint section %s: %v", key, err)
		}
	}
}

// SameJSON reports whether a and b encode to the same JSON: what the checkpoint would hold.
func SameJSON(t testing.TB, a, b any) bool {
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

// CounterValue returns the value of the counter name{label=value} in reg, 0 when absent.
func CounterValue(t testing.TB, reg prometheus.Gatherer, name, label, value string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if hasLabel(m, label, value) {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

func hasLabel(m *dto.Metric, name, value string) bool {
	for _, lp := range m.GetLabel() {
		if lp.GetName() == name && lp.GetValue() == value {
			return true
		}
	}
	return false
}

// WebClaims is pod ns/web (UID uid-web) using one network claim, ns/web-nic, as "nic", with
// containers app and side; prepared, the claim holds device nic0 with its network interface.
func WebClaims(prepared bool) manager.PodClaims {
	pc := manager.PodClaims{
		Pod: registry.PodRef{UID: "uid-web", Name: "web", Namespace: "ns"},
		Claims: []manager.ClaimRecord{{
			UID: "claim-uid", Namespace: "ns", Name: "web-nic", PodClaimName: "nic", Drivers: []string{"net.example.com"},
		}},
		Containers: []manager.ContainerClaims{{Name: "app"}, {Name: "side"}},
	}
	if prepared {
		pc.Claims[0].Prepared = true
		pc.Claims[0].Devices = []manager.DeviceRecord{{
			Driver: "net.example.com", Pool: "node-a", Device: "nic0", Requests: []string{"nic"},
			CDIDeviceIDs: []string{"net.example.com/nic=nic0"},
			Network:      &manager.DeviceNetworkRecord{HostInterface: "eth5", InterfaceName: "net1", MTU: 1400, Addresses: []string{"192.0.2.10/24"}},
		}}
	}
	return pc
}
