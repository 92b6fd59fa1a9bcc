package agent

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/podgate/podgate/agent/config"
	"github.com/podgate/podgate/agent/registry"
	"github.com/podgate/podgate/test/kubefake"
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
		Sysctls: registry.SysctlRecord{
			Asked:        map[string]string{"net.ipv4.tcp_keepalive_time": "600"},
			Applied:      map[string]string{"net.ipv4.tcp_keepalive_time": "600"},
			Verification: registry.SysctlsOK,
		},
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
	return bytes.Equal(ja, jb)
}

// runAgentWithAPI runs an agent of cfg on the fake API server client until the test ends, and
// waits for its pod informer's sync.
func runAgentWithAPI(t *testing.T, cfg *config.Configuration, client *fake.Clientset) *Agent {
	t.Helper()
	a := New(cfg, "test")
	a.api = kubefake.Wrap(client)
	stop := runAgentOf(t, a)
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	waitGauge(t, a, "podgate_kube_pod_informer_synced", 1)
	return a
}

// recordPodClaims records pc in reg as the DRA stage does: the pod as a user of its claims
// (durable), then the devices of those it holds prepared.
func recordPodClaims(t testing.TB, reg *registry.Registry, pc registry.PodClaims) {
	t.Helper()
	uses := make([]registry.ClaimUse, len(pc.Claims))
	prepared := map[types.UID][]registry.DeviceRecord{}
	for i, c := range pc.Claims {
		uses[i] = registry.ClaimUse{UID: c.UID, Namespace: c.Namespace, Name: c.Name, PodClaimName: c.PodClaimName, Drivers: c.Drivers}
		if c.Prepared {
			prepared[c.UID] = c.Devices
		}
	}
	if err := reg.UseClaims(pc.Pod, pc.Containers, uses); err != nil {
		t.Fatal(err)
	}
	if len(prepared) > 0 {
		if err := reg.SetPrepared(prepared); err != nil {
			t.Fatal(err)
		}
	}
}

// forgetPodClaims releases a pod's claims in reg and forgets those no pod uses, as the DRA
// reconciler does once their drivers unprepared them.
func forgetPodClaims(t testing.TB, reg *registry.Registry, uid types.UID) {
	t.Helper()
	unused, err := reg.ReleasePod(uid)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range unused {
		if err := reg.ClaimUnprepared(c.UID); err != nil {
			t.Fatal(err)
		}
	}
}
