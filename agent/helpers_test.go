package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"

	"github.com/podgate/podgate/agent/config"
	"github.com/podgate/podgate/agent/kube"
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

// kubeTimeout bounds each wait for the informer; reaching it fails the test.
const kubeTimeout = 30 * time.Second

// testPod is pod "pod-"+uid (UID "uid-"+uid) on node-a with the priority class given.
func testPod(uid, class string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "pod-" + uid, UID: types.UID("uid-" + uid)},
		Spec:       corev1.PodSpec{NodeName: "node-a", PriorityClassName: class},
	}
}

// startLookup runs a PodLookup for node-a on a fake API server holding pods, until the test
// ends, and waits for its informer's sync.
func startLookup(t *testing.T, pods ...runtime.Object) (*fake.Clientset, *kube.PodLookup) {
	t.Helper()
	client := fake.NewClientset(pods...)
	l, err := kube.NewPodLookup(kubefake.Wrap(client), "node-a")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { l.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	syncCtx, cancelSync := context.WithTimeout(ctx, kubeTimeout)
	defer cancelSync()
	if !cache.WaitForCacheSync(syncCtx.Done(), l.HasSynced) {
		t.Fatal("pod informer did not sync")
	}
	return client, l
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
