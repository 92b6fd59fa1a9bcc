package manager_test

// The prepare stage and the reconciler, through a CRI server in front of a fake runtime, with a
// fake driver: claims prepared before the sandbox, refused sandboxes, unprepares once pods are
// gone, the obligation on disk.

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podgate/podgate/cri/registry"
	"github.com/podgate/podgate/dra/dratest/rig"
	"github.com/podgate/podgate/dra/manager"
)

// newRig is the DRA rig with driver calls bounded by callTimeout, the API server holding objs.
func newRig(t testing.TB, callTimeout time.Duration, objs ...runtime.Object) *rig.Rig {
	t.Helper()
	return rig.New(t, rig.Options{CallTimeout: callTimeout, Objects: objs})
}

// newRigWith is newRig with the manager's options of opts.
func newRigWith(t testing.TB, callTimeout time.Duration, opts func(*rig.Rig) []manager.Option, objs ...runtime.Object) *rig.Rig {
	t.Helper()
	return rig.New(t, rig.Options{CallTimeout: callTimeout, Objects: objs, Manager: opts})
}

func TestDRAPreparesBeforeForwarding(t *testing.T) {
	pod := rig.Pod("1", "net")
	dr := newRig(t, 5*time.Second, pod, rig.Claim("net", pod))
	id, err := dr.RunPod(t, pod)
	if err != nil {
		t.Fatal(err)
	}
	if at := dr.AtRun(); at == nil || !slices.Equal(*at, []string{"prepare default/net"}) {
		t.Errorf("driver calls when containerd got RunPodSandbox: %v, want the claim prepared", at)
	}
	if n := dr.Gets(); n != 1 {
		t.Errorf("%d API GETs for a pod with one claim, want 1", n)
	}
	want := []manager.ClaimRecord{{
		UID: "claim-net", Namespace: "default", Name: "net", PodClaimName: "net", Drivers: []string{rig.Driver}, Prepared: true,
		Devices: []manager.DeviceRecord{{Driver: rig.Driver, Pool: "pool", Device: "dev-net", Requests: []string{"req"}, CDIDeviceIDs: []string{"example.com/net=net"}}},
	}}
	got, ok := dr.ClaimStore.PodClaims(pod.UID)
	if !ok || !rig.SameJSON(t, got.Claims, want) {
		t.Errorf("registry: %+v, want %+v", got, want)
	}
	// On disk at once (the claim's change is written before anyone sees it): one record per
	// claim with its users, and the pod's use of it.
	onDisk, err := registry.NewCheckpoint(dr.StateDir).ReadAll()
	wantInfo := []manager.ClaimInfo{{UID: "claim-net", Namespace: "default", Name: "net", Drivers: []string{rig.Driver}, Prepared: true,
		Devices: want[0].Devices, PreparedBy: manager.PreparedByPodgate, PodUIDs: []types.UID{pod.UID}}}
	var onDiskClaims []manager.ClaimInfo
	var onDiskPods []manager.PodDRA
	rig.Section(t, onDisk, "claims", &onDiskClaims)
	rig.Section(t, onDisk, "draPods", &onDiskPods)
	if err != nil || !rig.SameJSON(t, onDiskClaims, wantInfo) || len(onDiskPods) != 1 || onDiskPods[0].Pod.UID != pod.UID {
		t.Errorf("checkpoint: claims %+v, pods %+v (%v); want %+v used by %s", onDiskClaims, onDiskPods, err, wantInfo, pod.UID)
	}

	// The kubelet re-creates the pod's sandbox: nothing is asked again.
	dr.RemoveSandbox(t, id)
	if _, err := dr.RunPod(t, pod); err != nil {
		t.Fatal(err)
	}
	if calls := dr.Driver.Calls(); len(calls) != 1 || dr.Gets() != 1 {
		t.Errorf("second sandbox: driver calls %v, API GETs %d; want no new call", calls, dr.Gets())
	}
}

func TestDRAPodWithoutClaimsCostsNothing(t *testing.T) {
	pod := rig.Pod("1")
	dr := newRig(t, 5*time.Second, pod)
	if _, err := dr.RunPod(t, pod); err != nil {
		t.Fatal(err)
	}
	if n, calls := dr.Gets(), dr.Driver.Calls(); n != 0 || len(calls) != 0 {
		t.Errorf("pod without claims: %d API GETs, driver calls %v; want none", n, calls)
	}
	if _, ok := dr.ClaimStore.PodClaims(pod.UID); ok {
		t.Error("a pod without claims has a claims record")
	}
}

func TestDRARefusesSandbox(t *testing.T) {
	pod := rig.Pod("1", "net")
	other := rig.Pod("2")
	unallocated := rig.Claim("net", pod)
	unallocated.Status.Allocation = nil
	for _, tc := range []struct {
		name  string
		claim *resourceapi.ResourceClaim
		setup func(*rig.Rig)
		code  codes.Code
		says  []string
	}{
		{name: "not allocated", claim: unallocated, code: codes.FailedPrecondition, says: []string{"default/pod-1", "default/net", "not allocated"}},
		{name: "reserved for another pod", claim: rig.Claim("net", other), code: codes.FailedPrecondition, says: []string{"default/pod-1", "default/net", "not reserved for this pod"}},
		{name: "driver gone", claim: rig.Claim("net", pod), setup: func(dr *rig.Rig) {
			changed := dr.Drivers.Changed()
			dr.Driver.Stop()
			<-changed
		}, code: codes.Unavailable, says: []string{"default/pod-1", "default/net", rig.Driver, "not registered"}},
		{name: "driver fails the claim", claim: rig.Claim("net", pod), setup: func(dr *rig.Rig) {
			dr.Driver.FailClaim("default", "net", "no such NIC")
		}, code: codes.Unavailable, says: []string{"default/pod-1", "default/net", rig.Driver, "no such NIC"}},
		{name: "driver too slow", claim: rig.Claim("net", pod), setup: func(dr *rig.Rig) {
			dr.Driver.SetHook(func(ctx context.Context, _ string) error {
				<-ctx.Done() // answers only when podgate gave up
				return ctx.Err()
			})
		}, code: codes.Unavailable, says: []string{"default/net", rig.Driver}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dr := newRig(t, 200*time.Millisecond, pod, other, tc.claim)
			if tc.setup != nil {
				tc.setup(dr)
			}
			_, err := dr.RunPod(t, pod)
			st := status.Convert(err)
			if st.Code() != tc.code {
				t.Fatalf("RunPodSandbox: %v, want %v", err, tc.code)
			}
			for _, s := range tc.says {
				if !strings.Contains(st.Message(), s) {
					t.Errorf("error %q does not say %q", st.Message(), s)
				}
			}
			if dr.AtRun() != nil {
				t.Error("the sandbox reached the runtime")
			}
			if got := dr.RuntimeSandboxes(t); len(got) != 0 {
				t.Errorf("runtime holds %v", got)
			}
		})
	}
}

// The obligation to unprepare must be on disk before a driver is called: when it cannot be
// written, no driver is called and the sandbox is refused.
func TestDRANoDriverCallWithoutTheObligationOnDisk(t *testing.T) {
	pod := rig.Pod("1", "net")
	dr := newRig(t, 5*time.Second, pod, rig.Claim("net", pod))
	if err := os.Mkdir(filepath.Join(dr.StateDir, registry.CheckpointFile), 0o700); err != nil {
		t.Fatal(err)
	}
	_, err := dr.RunPod(t, pod)
	if err == nil || !strings.Contains(err.Error(), "pod registry") {
		t.Fatalf("RunPodSandbox: %v, want the checkpoint's failure", err)
	}
	if calls := dr.Driver.Calls(); len(calls) != 0 || dr.AtRun() != nil {
		t.Errorf("driver calls %v, runtime reached %v; want neither", calls, dr.AtRun() != nil)
	}
	if _, ok := dr.ClaimStore.PodClaims(pod.UID); ok {
		t.Error("claims recorded in memory although not on disk")
	}
}

func TestDRAUnprepareOnceThePodIsGone(t *testing.T) {
	pod := rig.Pod("1", "net")
	dr := newRig(t, 5*time.Second, pod, rig.Claim("net", pod))
	id, err := dr.RunPod(t, pod)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	// Deleted in the API server, but its sandbox is still there: nothing is released.
	dr.DeletePod(t, pod)
	dr.Manager.Reconcile(ctx)
	if calls := dr.Driver.Calls(); slices.Contains(calls, "unprepare default/net") {
		t.Fatalf("unprepared while the pod still has a sandbox: %v", calls)
	}
	// Stopped: a deleted pod's stopped sandbox never runs again, whenever the kubelet's
	// garbage collection removes it.
	if _, err := dr.Client.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: id}); err != nil {
		t.Fatal(err)
	}
	dr.Manager.Reconcile(ctx)
	if _, err := dr.Client.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: id}); err != nil {
		t.Fatal(err)
	}
	dr.Manager.Reconcile(ctx) // a second look finds nothing more to do
	if calls := dr.Driver.Calls(); !slices.Equal(calls, []string{"prepare default/net", "unprepare default/net"}) {
		t.Errorf("driver calls %v, want one prepare and one unprepare", calls)
	}
	if _, ok := dr.ClaimStore.PodClaims(pod.UID); ok {
		t.Error("claims record kept after the unprepare")
	}
	dr.Registry.Flush()
	if onDisk, _ := registry.NewCheckpoint(dr.StateDir).ReadAll(); len(onDisk.Sections["podClaims"]) != 0 || len(onDisk.Sections["draPods"]) != 0 {
		t.Errorf("checkpoint keeps %s %s", onDisk.Sections["podClaims"], onDisk.Sections["draPods"])
	}
}

func TestDRASharedClaimUnpreparedByTheLastPod(t *testing.T) {
	p1, p2 := rig.Pod("1", "shared"), rig.Pod("2", "shared")
	dr := newRig(t, 5*time.Second, p1, p2, rig.Claim("shared", p1, p2))
	ctx := t.Context()
	for _, p := range []*corev1.Pod{p1, p2} {
		id, err := dr.RunPod(t, p)
		if err != nil {
			t.Fatal(err)
		}
		dr.RemoveSandbox(t, id)
	}
	dr.DeletePod(t, p1)
	dr.Manager.Reconcile(ctx)
	if calls := dr.Driver.Calls(); slices.Contains(calls, "unprepare default/shared") {
		t.Fatalf("shared claim unprepared while another pod holds it: %v", calls)
	}
	dr.DeletePod(t, p2)
	dr.Manager.Reconcile(ctx)
	if calls := dr.Driver.Calls(); !slices.Equal(calls, []string{"prepare default/shared", "unprepare default/shared"}) {
		t.Errorf("driver calls %v, want one prepare (the second pod found it prepared) and one unprepare", calls)
	}
}

func TestDRAObligationSurvivesACrash(t *testing.T) {
	// A podgate that crashed between recording the claim and calling the driver left this
	// checkpoint; the pod is gone since.
	pod := rig.Pod("1", "net")
	dr := newRig(t, 5*time.Second)
	rig.RecordPodClaims(t, dr.ClaimStore, manager.PodClaims{
		Pod:    registry.PodRef{UID: pod.UID, Name: pod.Name, Namespace: pod.Namespace},
		Claims: []manager.ClaimRecord{{UID: "claim-net", Namespace: "default", Name: "net", PodClaimName: "net", Drivers: []string{rig.Driver}}},
	})
	restarted, store, _ := rig.ReadState(t, dr.StateDir)
	d := manager.New(dr.Pods, dr.Drivers, dr.Claims, store, restarted, dr.RuntimeClient, prometheus.NewRegistry())
	d.Reconcile(t.Context())
	if calls := dr.Driver.Calls(); !slices.Equal(calls, []string{"unprepare default/net"}) {
		t.Errorf("driver calls %v, want the recorded claim unprepared", calls)
	}
	if _, ok := store.PodClaims(pod.UID); ok {
		t.Error("obligation kept after the unprepare")
	}
}

func TestDRAUnprepareRetriedWhileTheDriverFails(t *testing.T) {
	pod := rig.Pod("1", "net")
	var now time.Time // zero: the wall clock
	clock := manager.WithClock(func() time.Time {
		if now.IsZero() {
			return time.Now()
		}
		return now
	})
	dr := newRigWith(t, 5*time.Second, func(*rig.Rig) []manager.Option { return []manager.Option{clock} }, pod, rig.Claim("net", pod))
	id, err := dr.RunPod(t, pod)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	dr.RemoveSandbox(t, id)
	dr.DeletePod(t, pod)
	now = time.Now()
	dr.Driver.SetHook(func(context.Context, string) error { return errors.New("device busy") })
	dr.Manager.Reconcile(ctx)
	if c, ok := dr.ClaimStore.Claim("claim-net"); !ok || len(c.PodUIDs) != 0 {
		t.Fatalf("claim record %+v (%v): want it kept, used by no pod, since the unprepare failed", c, ok)
	}
	dr.Driver.SetHook(nil)
	// Within the backoff nothing is tried; after it, the release is.
	dr.Manager.Reconcile(ctx)
	if n := strings.Count(strings.Join(dr.Driver.Calls(), ","), "unprepare"); n != 1 {
		t.Fatalf("%d unprepare calls within the backoff, want 1 (the failed one)", n)
	}
	now = now.Add(manager.RetryInitial)
	dr.Manager.Reconcile(ctx)
	if _, ok := dr.ClaimStore.Claim("claim-net"); ok {
		t.Error("obligation kept after a successful retry")
	}
	if n := rig.CounterValue(t, dr.Metrics, "podgate_dra_claims_released_total", "how", "unprepared"); n != 1 {
		t.Errorf("claims_released_total{how=unprepared} = %v, want 1", n)
	}
}
