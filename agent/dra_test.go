package agent

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/utils/ptr"

	"github.com/podgate/podgate/agent/kube"
	"github.com/podgate/podgate/cri/registry"
	"github.com/podgate/podgate/dra"
	"github.com/podgate/podgate/dra/attach"
	"github.com/podgate/podgate/dra/dratest"
	"github.com/podgate/podgate/dra/manager"
	"github.com/podgate/podgate/test/kubefake"
)

const testDriver = "net.example.com"

// draPod is a pod of node-a with one claim per name, each naming a ResourceClaim of that name.
func draPod(uid string, claims ...string) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "pod-" + uid, UID: types.UID("uid-" + uid)},
		Spec:       corev1.PodSpec{NodeName: "node-a"},
	}
	for _, c := range claims {
		p.Spec.ResourceClaims = append(p.Spec.ResourceClaims, corev1.PodResourceClaim{Name: c, ResourceClaimName: ptr.To(c)})
	}
	return p
}

// draClaim is a claim allocated to one device of testDriver, reserved for pods.
func draClaim(name string, pods ...*corev1.Pod) *resourceapi.ResourceClaim {
	c := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: types.UID("claim-" + name)},
		Status: resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{
			Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{
				{Request: "req", Driver: testDriver, Pool: "pool", Device: "dev-" + name},
			}},
		}},
	}
	for _, p := range pods {
		c.Status.ReservedFor = append(c.Status.ReservedFor, resourceapi.ResourceClaimConsumerReference{Resource: "pods", Name: p.Name, UID: p.UID})
	}
	return c
}

// draRig is the pipeline rig with DRA on: a fake API server, a fake driver registered in a
// real plugin registry directory, the DRA manager and attacher.
type draRig struct {
	*pipelineRig
	kube   *fake.Clientset
	driver *dratest.Driver
	dra    *manager.Manager
	attach *attach.Attacher
	// What the manager was built from.
	pods    *kube.PodLookup
	drivers *dra.Drivers
	claims  *dra.ClaimResolver
	// hostIfs, when a test's options make it, finds the devices' host interfaces.
	hostIfs *dra.HostInterfaces
	// kubelet is the kubelet dra.prepare auto asks; nil: none.
	kubelet manager.KubeletPods
	// gets counts the API server's GETs (pods and claims); atRun is the driver's calls when
	// the runtime's RunPodSandbox began.
	gets  atomic.Int32
	atRun atomic.Pointer[[]string]
}

// draOptions vary the DRA rig: the pipeline rig's options (its onRun and dra are the DRA
// rig's), and what the DRA manager and attacher are built with.
type draOptions struct {
	rigOptions
	// manager returns more options of the manager, built with the rig's fake API server.
	manager func(dr *draRig) []manager.Option
	// attach returns the attacher's options; nil: dra.attach empty.
	attach func(dr *draRig) []attach.Option
}

func newDRARig(t testing.TB, callTimeout time.Duration, objs ...runtime.Object) *draRig {
	t.Helper()
	return newDRARigWith(t, callTimeout, draOptions{}, objs...)
}

// newDRARigWith is newDRARig with options o.
func newDRARigWith(t testing.TB, callTimeout time.Duration, o draOptions, objs ...runtime.Object) *draRig {
	t.Helper()
	dr := &draRig{kube: fake.NewClientset(objs...)}
	dr.kube.PrependReactor("get", "*", func(k8stesting.Action) (bool, runtime.Object, error) {
		dr.gets.Add(1)
		return false, nil, nil
	})
	o.onRun = func() {
		calls := dr.driver.Calls()
		dr.atRun.Store(&calls)
	}
	o.dra = func(r *pipelineRig) (*manager.Manager, *attach.Attacher) {
		regDir, plugDir := filepath.Join(r.dir, "reg"), filepath.Join(r.dir, "plug")
		for _, d := range []string{regDir, plugDir} {
			if err := os.Mkdir(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		dr.driver = dratest.Start(t, regDir, plugDir, testDriver)
		pods, err := kube.NewPodLookup(kubefake.Wrap(dr.kube), "node-a")
		if err != nil {
			t.Fatal(err)
		}
		drivers := dra.NewDrivers(dra.WithPluginRegistryDir(regDir), dra.WithCallTimeout(callTimeout))
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{}, 2)
		go func() { pods.Run(ctx); done <- struct{}{} }()
		go func() { _ = drivers.Run(ctx); done <- struct{}{} }()
		t.Cleanup(func() { cancel(); <-done; <-done; drivers.Close() })
		wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
		defer wcancel()
		if _, err := drivers.WaitFor(wctx, testDriver); err != nil {
			t.Fatal(err)
		}
		if !cache.WaitForCacheSync(wctx.Done(), pods.HasSynced) {
			t.Fatal("pod informer did not sync")
		}
		dr.pipelineRig = r
		dr.pods, dr.drivers, dr.claims = pods, drivers, dra.NewClaimResolver(kubefake.Wrap(dr.kube), nil)
		var aopts []attach.Option
		if o.attach != nil {
			aopts = o.attach(dr)
		}
		dr.attach = attach.New(r.registry, r.intents, aopts...)
		mopts := []manager.Option{manager.WithKubelet(func() manager.KubeletPods { return dr.kubelet })}
		if o.manager != nil {
			mopts = append(mopts, o.manager(dr)...)
		}
		dr.dra = manager.New(pods, drivers, dr.claims, r.claimStore, r.registry, r.runtimeClient, r.metrics, mopts...)
		return dr.dra, dr.attach
	}
	dr.pipelineRig = newPipelineRigWith(t, o.rigOptions)
	return dr
}

func (dr *draRig) runPod(t *testing.T, pod *corev1.Pod) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	resp, err := dr.client.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: &runtimeapi.PodSandboxConfig{
		Metadata: &runtimeapi.PodSandboxMetadata{Name: pod.Name, Namespace: pod.Namespace, Uid: string(pod.UID)},
		Labels:   map[string]string{"io.kubernetes.pod.uid": string(pod.UID)},
	}})
	return resp.GetPodSandboxId(), err
}

// removeSandbox stops and removes a sandbox through podgate, as the kubelet does.
func (dr *draRig) removeSandbox(t *testing.T, id string) {
	t.Helper()
	if _, err := dr.client.StopPodSandbox(t.Context(), &runtimeapi.StopPodSandboxRequest{PodSandboxId: id}); err != nil {
		t.Fatal(err)
	}
	if _, err := dr.client.RemovePodSandbox(t.Context(), &runtimeapi.RemovePodSandboxRequest{PodSandboxId: id}); err != nil {
		t.Fatal(err)
	}
}

func TestDRAPreparesBeforeForwarding(t *testing.T) {
	pod := draPod("1", "net")
	dr := newDRARig(t, 5*time.Second, pod, draClaim("net", pod))
	id, err := dr.runPod(t, pod)
	if err != nil {
		t.Fatal(err)
	}
	if at := dr.atRun.Load(); at == nil || !slices.Equal(*at, []string{"prepare default/net"}) {
		t.Errorf("driver calls when containerd got RunPodSandbox: %v, want the claim prepared", at)
	}
	if n := dr.gets.Load(); n != 1 {
		t.Errorf("%d API GETs for a pod with one claim, want 1", n)
	}
	want := []manager.ClaimRecord{{
		UID: "claim-net", Namespace: "default", Name: "net", PodClaimName: "net", Drivers: []string{testDriver}, Prepared: true,
		Devices: []manager.DeviceRecord{{Driver: testDriver, Pool: "pool", Device: "dev-net", Requests: []string{"req"}, CDIDeviceIDs: []string{"example.com/net=net"}}},
	}}
	got, ok := dr.claimStore.PodClaims(pod.UID)
	if !ok || !sameJSON(t, got.Claims, want) {
		t.Errorf("registry: %+v, want %+v", got, want)
	}
	// On disk at once (the claim's change is written before anyone sees it): one record per
	// claim with its users, and the pod's use of it.
	onDisk, err := registry.NewCheckpoint(dr.stateDir).ReadAll()
	wantInfo := []manager.ClaimInfo{{UID: "claim-net", Namespace: "default", Name: "net", Drivers: []string{testDriver}, Prepared: true,
		Devices: want[0].Devices, PreparedBy: manager.PreparedByPodgate, PodUIDs: []types.UID{pod.UID}}}
	var onDiskClaims []manager.ClaimInfo
	var onDiskPods []manager.PodDRA
	section(t, onDisk, "claims", &onDiskClaims)
	section(t, onDisk, "draPods", &onDiskPods)
	if err != nil || !sameJSON(t, onDiskClaims, wantInfo) || len(onDiskPods) != 1 || onDiskPods[0].Pod.UID != pod.UID {
		t.Errorf("checkpoint: claims %+v, pods %+v (%v); want %+v used by %s", onDiskClaims, onDiskPods, err, wantInfo, pod.UID)
	}

	// The kubelet re-creates the pod's sandbox: nothing is asked again.
	dr.removeSandbox(t, id)
	if _, err := dr.runPod(t, pod); err != nil {
		t.Fatal(err)
	}
	if calls := dr.driver.Calls(); len(calls) != 1 || dr.gets.Load() != 1 {
		t.Errorf("second sandbox: driver calls %v, API GETs %d; want no new call", calls, dr.gets.Load())
	}
}

func TestDRAPodWithoutClaimsCostsNothing(t *testing.T) {
	pod := draPod("1")
	dr := newDRARig(t, 5*time.Second, pod)
	if _, err := dr.runPod(t, pod); err != nil {
		t.Fatal(err)
	}
	if n, calls := dr.gets.Load(), dr.driver.Calls(); n != 0 || len(calls) != 0 {
		t.Errorf("pod without claims: %d API GETs, driver calls %v; want none", n, calls)
	}
	if _, ok := dr.claimStore.PodClaims(pod.UID); ok {
		t.Error("a pod without claims has a claims record")
	}
}

func TestDRARefusesSandbox(t *testing.T) {
	pod := draPod("1", "net")
	other := draPod("2")
	unallocated := draClaim("net", pod)
	unallocated.Status.Allocation = nil
	for _, tc := range []struct {
		name  string
		claim *resourceapi.ResourceClaim
		setup func(*draRig)
		code  codes.Code
		says  []string
	}{
		{name: "not allocated", claim: unallocated, code: codes.FailedPrecondition, says: []string{"default/pod-1", "default/net", "not allocated"}},
		{name: "reserved for another pod", claim: draClaim("net", other), code: codes.FailedPrecondition, says: []string{"default/pod-1", "default/net", "not reserved for this pod"}},
		{name: "driver gone", claim: draClaim("net", pod), setup: func(dr *draRig) {
			changed := dr.drivers.Changed()
			dr.driver.Stop()
			<-changed
		}, code: codes.Unavailable, says: []string{"default/pod-1", "default/net", testDriver, "not registered"}},
		{name: "driver fails the claim", claim: draClaim("net", pod), setup: func(dr *draRig) {
			dr.driver.FailClaim("default", "net", "no such NIC")
		}, code: codes.Unavailable, says: []string{"default/pod-1", "default/net", testDriver, "no such NIC"}},
		{name: "driver too slow", claim: draClaim("net", pod), setup: func(dr *draRig) {
			dr.driver.SetHook(func(ctx context.Context, _ string) error {
				<-ctx.Done() // answers only when podgate gave up
				return ctx.Err()
			})
		}, code: codes.Unavailable, says: []string{"default/net", testDriver}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dr := newDRARig(t, 200*time.Millisecond, pod, other, tc.claim)
			if tc.setup != nil {
				tc.setup(dr)
			}
			_, err := dr.runPod(t, pod)
			st := status.Convert(err)
			if st.Code() != tc.code {
				t.Fatalf("RunPodSandbox: %v, want %v", err, tc.code)
			}
			for _, s := range tc.says {
				if !strings.Contains(st.Message(), s) {
					t.Errorf("error %q does not say %q", st.Message(), s)
				}
			}
			if dr.atRun.Load() != nil {
				t.Error("the sandbox reached the runtime")
			}
			if got := dr.runtimeSandboxes(t); len(got) != 0 {
				t.Errorf("runtime holds %v", got)
			}
		})
	}
}

// The obligation to unprepare must be on disk before a driver is called: when it cannot be
// written, no driver is called and the sandbox is refused.
func TestDRANoDriverCallWithoutTheObligationOnDisk(t *testing.T) {
	pod := draPod("1", "net")
	dr := newDRARig(t, 5*time.Second, pod, draClaim("net", pod))
	if err := os.Mkdir(filepath.Join(dr.stateDir, registry.CheckpointFile), 0o700); err != nil {
		t.Fatal(err)
	}
	_, err := dr.runPod(t, pod)
	if err == nil || !strings.Contains(err.Error(), "pod registry") {
		t.Fatalf("RunPodSandbox: %v, want the checkpoint's failure", err)
	}
	if calls := dr.driver.Calls(); len(calls) != 0 || dr.atRun.Load() != nil {
		t.Errorf("driver calls %v, runtime reached %v; want neither", calls, dr.atRun.Load() != nil)
	}
	if _, ok := dr.claimStore.PodClaims(pod.UID); ok {
		t.Error("claims recorded in memory although not on disk")
	}
}

func TestDRAUnprepareOnceThePodIsGone(t *testing.T) {
	pod := draPod("1", "net")
	dr := newDRARig(t, 5*time.Second, pod, draClaim("net", pod))
	id, err := dr.runPod(t, pod)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	// Deleted in the API server, but its sandbox is still there: nothing is released.
	if err := dr.kube.CoreV1().Pods("default").Delete(ctx, pod.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPodGoneFromInformer(t, dr, pod.UID)
	dr.dra.Reconcile(ctx)
	if calls := dr.driver.Calls(); slices.Contains(calls, "unprepare default/net") {
		t.Fatalf("unprepared while the pod still has a sandbox: %v", calls)
	}
	// Stopped: a deleted pod's stopped sandbox never runs again, whenever the kubelet's
	// garbage collection removes it.
	if _, err := dr.client.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: id}); err != nil {
		t.Fatal(err)
	}
	dr.dra.Reconcile(ctx)
	if _, err := dr.client.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: id}); err != nil {
		t.Fatal(err)
	}
	dr.dra.Reconcile(ctx) // a second look finds nothing more to do
	if calls := dr.driver.Calls(); !slices.Equal(calls, []string{"prepare default/net", "unprepare default/net"}) {
		t.Errorf("driver calls %v, want one prepare and one unprepare", calls)
	}
	if _, ok := dr.claimStore.PodClaims(pod.UID); ok {
		t.Error("claims record kept after the unprepare")
	}
	dr.registry.Flush()
	if onDisk, _ := registry.NewCheckpoint(dr.stateDir).ReadAll(); len(onDisk.Sections["podClaims"]) != 0 || len(onDisk.Sections["draPods"]) != 0 {
		t.Errorf("checkpoint keeps %s %s", onDisk.Sections["podClaims"], onDisk.Sections["draPods"])
	}
}

func waitPodGoneFromInformer(t *testing.T, dr *draRig, uid types.UID) {
	t.Helper()
	if err := wait.PollUntilContextTimeout(t.Context(), time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		_, ok := dr.pods.Get(uid)
		return !ok, nil
	}); err != nil {
		t.Fatalf("informer still has the deleted pod: %v", err)
	}
}

func TestDRASharedClaimUnpreparedByTheLastPod(t *testing.T) {
	p1, p2 := draPod("1", "shared"), draPod("2", "shared")
	dr := newDRARig(t, 5*time.Second, p1, p2, draClaim("shared", p1, p2))
	ctx := t.Context()
	for _, p := range []*corev1.Pod{p1, p2} {
		id, err := dr.runPod(t, p)
		if err != nil {
			t.Fatal(err)
		}
		dr.removeSandbox(t, id)
	}
	if err := dr.kube.CoreV1().Pods("default").Delete(ctx, p1.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPodGoneFromInformer(t, dr, p1.UID)
	dr.dra.Reconcile(ctx)
	if calls := dr.driver.Calls(); slices.Contains(calls, "unprepare default/shared") {
		t.Fatalf("shared claim unprepared while another pod holds it: %v", calls)
	}
	if err := dr.kube.CoreV1().Pods("default").Delete(ctx, p2.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPodGoneFromInformer(t, dr, p2.UID)
	dr.dra.Reconcile(ctx)
	if calls := dr.driver.Calls(); !slices.Equal(calls, []string{"prepare default/shared", "unprepare default/shared"}) {
		t.Errorf("driver calls %v, want one prepare (the second pod found it prepared) and one unprepare", calls)
	}
}

func TestDRAObligationSurvivesACrash(t *testing.T) {
	// A podgate that crashed between recording the claim and calling the driver left this
	// checkpoint; the pod is gone since.
	pod := draPod("1", "net")
	dr := newDRARig(t, 5*time.Second)
	recordPodClaims(t, dr.claimStore, manager.PodClaims{
		Pod:    registry.PodRef{UID: pod.UID, Name: pod.Name, Namespace: pod.Namespace},
		Claims: []manager.ClaimRecord{{UID: "claim-net", Namespace: "default", Name: "net", PodClaimName: "net", Drivers: []string{testDriver}}},
	})
	restarted, store, _ := restartState(t, dr.stateDir)
	d := manager.New(dr.pods, dr.drivers, dr.claims, store, restarted, dr.runtimeClient, prometheus.NewRegistry())
	d.Reconcile(t.Context())
	if calls := dr.driver.Calls(); !slices.Equal(calls, []string{"unprepare default/net"}) {
		t.Errorf("driver calls %v, want the recorded claim unprepared", calls)
	}
	if _, ok := store.PodClaims(pod.UID); ok {
		t.Error("obligation kept after the unprepare")
	}
}

func TestDRAUnprepareRetriedWhileTheDriverFails(t *testing.T) {
	pod := draPod("1", "net")
	var now time.Time // zero: the wall clock
	clock := manager.WithClock(func() time.Time {
		if now.IsZero() {
			return time.Now()
		}
		return now
	})
	dr := newDRARigWith(t, 5*time.Second, draOptions{manager: func(*draRig) []manager.Option { return []manager.Option{clock} }}, pod, draClaim("net", pod))
	id, err := dr.runPod(t, pod)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	dr.removeSandbox(t, id)
	if err := dr.kube.CoreV1().Pods("default").Delete(ctx, pod.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPodGoneFromInformer(t, dr, pod.UID)
	now = time.Now()
	dr.driver.SetHook(func(context.Context, string) error { return errors.New("device busy") })
	dr.dra.Reconcile(ctx)
	if c, ok := dr.claimStore.Claim("claim-net"); !ok || len(c.PodUIDs) != 0 {
		t.Fatalf("claim record %+v (%v): want it kept, used by no pod, since the unprepare failed", c, ok)
	}
	dr.driver.SetHook(nil)
	// Within the backoff nothing is tried; after it, the release is.
	dr.dra.Reconcile(ctx)
	if n := strings.Count(strings.Join(dr.driver.Calls(), ","), "unprepare"); n != 1 {
		t.Fatalf("%d unprepare calls within the backoff, want 1 (the failed one)", n)
	}
	now = now.Add(manager.RetryInitial)
	dr.dra.Reconcile(ctx)
	if _, ok := dr.claimStore.Claim("claim-net"); ok {
		t.Error("obligation kept after a successful retry")
	}
	if n := counterValue(t, dr.metrics, "podgate_dra_claims_released_total", "how", "unprepared"); n != 1 {
		t.Errorf("claims_released_total{how=unprepared} = %v, want 1", n)
	}
}
