package manager_test

// Who prepares a pod's claims (dra.prepare): podgate, or the kubelet beside it.

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/podgate/podgate/dra"
	"github.com/podgate/podgate/dra/dratest/rig"
	"github.com/podgate/podgate/dra/manager"
	"github.com/podgate/podgate/test/kubefake"
)

// fakeKubelet is the kubelet's PodResources socket as the manager asks it: it manages the
// pods in known ("namespace/name"); err, when set, is every answer (notListening: nobody
// listens on the socket). asks counts the questions.
type fakeKubelet struct {
	known        []string
	err          error
	notListening bool
	asks         atomic.Int32
}

var _ manager.KubeletPods = (*fakeKubelet)(nil)

func (k *fakeKubelet) KubeletKnowsPod(_ context.Context, namespace, name string) (bool, error) {
	k.asks.Add(1)
	if k.err != nil {
		return false, k.err
	}
	return slices.Contains(k.known, namespace+"/"+name), nil
}

func (k *fakeKubelet) NotListening(err error) bool { return k.notListening && err != nil }

// errNotListening is a kubelet's socket nobody listens on: a kubelet that died left it behind.
var errNotListening = errors.New("nobody listens on the socket (connection refused)")

// TestDRAPrepareModes: dra.prepare decides who prepares a pod's claims. Beside a kubelet that
// prepares (auto with a kubelet whose version prepares claims — agent's to tell from the Node,
// kubeletinfo's from the version — that manages the pod, or never) the driver sees no call
// from podgate, which still records the claim's devices from its allocation (for attach,
// network data and PodResources) and never unprepares it; otherwise podgate prepares before
// the sandbox, as always.
func TestDRAPrepareModes(t *testing.T) {
	for _, tt := range []struct {
		name     string
		mode     manager.Prepare
		prepares bool // the kubelet's version says it prepares claims (1.34 on)
		knows    bool // the kubelet's PodResources knows the pod
		socket   bool // a kubelet socket is there
		by       string
	}{
		{"always", manager.PrepareAlways, true, true, true, manager.PreparedByPodgate},
		{"never", manager.PrepareNever, false, false, false, manager.PreparedByKubelet},
		{"auto: kubelet 1.36 manages the pod", manager.PrepareAuto, true, true, true, manager.PreparedByKubelet},
		{"auto: kubelet does not know the pod (another CRI client)", manager.PrepareAuto, true, false, true, manager.PreparedByPodgate},
		{"auto: kubelet stopped", manager.PrepareAuto, true, true, false, manager.PreparedByPodgate},
		// An older kubelet, or one whose version is not known (no Node read).
		{"auto: kubelet 1.33 or version not known", manager.PrepareAuto, false, true, true, manager.PreparedByPodgate},
	} {
		t.Run(tt.name, func(t *testing.T) {
			pod := rig.Pod("1", "net")
			// The driver's slice names the device's host interface: its network data.
			slice := &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: "net-slice"}, Spec: resourceapi.ResourceSliceSpec{
				Driver: rig.Driver, NodeName: ptr.To(rig.Node), Pool: resourceapi.ResourcePool{Name: "pool", Generation: 1, ResourceSliceCount: 1},
				Devices: []resourceapi.Device{{Name: "dev-net", Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
					dra.DefaultInterfaceNameAttribute: {StringValue: ptr.To("eth7")},
				}}},
			}}
			kubelet := &fakeKubelet{}
			switch {
			case !tt.socket:
				kubelet.err = errors.New("no kubelet PodResources socket")
			case tt.knows:
				kubelet.known = []string{pod.Namespace + "/" + pod.Name}
			}
			var asked atomic.Int32 // pod starts that asked whether the kubelet prepares
			dr := newRigWith(t, 5*time.Second, func(dr *rig.Rig) []manager.Option {
				dr.HostIfs = dra.NewHostInterfaces(kubefake.Wrap(dr.Kube), rig.Node, "")
				return []manager.Option{manager.WithPrepare(tt.mode), manager.WithHostInterfaces(dr.HostIfs), manager.WithKubelet(kubelet),
					manager.WithKubeletPrepares(func(context.Context) bool { asked.Add(1); return tt.prepares })}
			}, pod, rig.Claim("net", pod), slice)
			hostIfsDone := make(chan struct{})
			go func() {
				defer close(hostIfsDone)
				dr.HostIfs.Run(t.Context())
			}()
			t.Cleanup(func() { <-hostIfsDone })

			id, err := dr.RunPod(t, pod)
			if err != nil {
				t.Fatal(err)
			}
			wantAsked := int32(0)
			if tt.mode == manager.PrepareAuto {
				wantAsked = 1 // only auto asks, once per pod start
			}
			if n := asked.Load(); n != wantAsked {
				t.Errorf("asked whether the kubelet prepares claims %d times, want %d", n, wantAsked)
			}
			wantCalls := []string{"prepare default/net"}
			if tt.by == manager.PreparedByKubelet {
				wantCalls = nil
			}
			if calls := dr.Driver.Calls(); !slices.Equal(calls, wantCalls) {
				t.Errorf("driver calls %v, want %v", calls, wantCalls)
			}
			c, ok := dr.ClaimStore.Claim("claim-net")
			if !ok || !c.Prepared || c.PreparedBy != tt.by || len(c.Devices) != 1 || c.Devices[0].Device != "dev-net" ||
				c.Devices[0].Network == nil || c.Devices[0].Network.HostInterface != "eth7" {
				t.Errorf("claim record %+v, want prepared by %s with device dev-net, host interface eth7", c, tt.by)
			}

			dr.RemoveSandbox(t, id)
			dr.DeletePod(t, pod)
			dr.Manager.Reconcile(t.Context())
			if tt.by == manager.PreparedByPodgate {
				wantCalls = append(wantCalls, "unprepare default/net")
			}
			if calls := dr.Driver.Calls(); !slices.Equal(calls, wantCalls) {
				t.Errorf("driver calls after the pod is gone %v, want %v", calls, wantCalls)
			}
			if _, ok := dr.ClaimStore.Claim("claim-net"); ok {
				t.Error("claim still recorded after its pod is gone")
			}
			// Nor remembered: a claim read after that is read from the API server.
			gets := dr.Gets()
			if _, err := dr.Claims.Claim(t.Context(), "default", "net"); err != nil {
				t.Fatal(err)
			}
			if dr.Gets() == gets {
				t.Error("claim still remembered by the resolver after its pod is gone")
			}
		})
	}
}

// TestDRAPrepareBesideADeadKubelet: with dra.prepare auto beside a kubelet 1.36 that died and
// left its PodResources socket behind (nobody listens on it), a pod start asks it once and,
// told that nobody listens, does not ask again or wait: podgate prepares the claims itself,
// before the sandbox, at every pod start. (podresources' tests hold its kubelet client to one
// refused call per question; agent's, the two wired together.)
func TestDRAPrepareBesideADeadKubelet(t *testing.T) {
	p1, p2 := rig.Pod("1", "net1"), rig.Pod("2", "net2")
	kubelet := &fakeKubelet{err: errNotListening, notListening: true}
	dr := newRigWith(t, 5*time.Second, func(*rig.Rig) []manager.Option {
		return []manager.Option{manager.WithPrepare(manager.PrepareAuto), manager.WithKubelet(kubelet), manager.WithKubeletPrepares(kubeletPrepares)}
	}, p1, p2, rig.Claim("net1", p1), rig.Claim("net2", p2))

	for i, start := range []struct {
		pod   *corev1.Pod
		claim string
	}{{p1, "net1"}, {p2, "net2"}} {
		pod, claim := start.pod, start.claim
		if _, err := dr.RunPod(t, pod); err != nil {
			t.Fatal(err)
		}
		if at := dr.AtRun(); at == nil || !slices.Contains(*at, "prepare default/"+claim) {
			t.Errorf("pod %d: driver calls when the runtime got the sandbox %v, want its claim prepared by podgate", i+1, at)
		}
		if c, ok := dr.ClaimStore.Claim(types.UID("claim-" + claim)); !ok || !c.Prepared || c.PreparedBy != manager.PreparedByPodgate {
			t.Errorf("pod %d: claim record %+v, want prepared by podgate", i+1, c)
		}
		if n := kubelet.asks.Load(); n != int32(i+1) {
			t.Errorf("after pod %d: the kubelet was asked %d times, want %d (once per pod start)", i+1, n, i+1)
		}
	}
	if n := rig.CounterValue(t, dr.Metrics, "podgate_dra_pod_claims_prepared_total", "by", manager.PreparedByPodgate); n != 2 {
		t.Errorf("pod_claims_prepared_total{by=podgate} = %v, want 2", n)
	}
}

// kubeletPrepares is a kubelet whose version prepares claims (1.34 on), for WithKubeletPrepares.
func kubeletPrepares(context.Context) bool { return true }
