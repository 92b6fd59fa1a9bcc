package manager_test

// Races and crashes: claims shared by pods starting at once, a crash at every step of a
// claim's life, a pod taking up a claim being unprepared.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/utils/ptr"

	"github.com/podgate/podgate/cri/pipeline"
	"github.com/podgate/podgate/cri/registry"
	"github.com/podgate/podgate/dra/dratest/rig"
	"github.com/podgate/podgate/dra/manager"
)

// TestDRASharedClaimPreparedOnceUnderARace: the sandboxes of N pods sharing one claim start at
// the same moment; the driver's first prepare is held until every call has recorded its pod as
// a user of the claim, so all of them want the claim while it is being prepared. The driver
// sees exactly one prepare; the claim's record lists every pod; removing the pods one by one
// unprepares it once, after the last.
func TestDRASharedClaimPreparedOnceUnderARace(t *testing.T) {
	const n = 8
	pods := make([]*corev1.Pod, n)
	objs := make([]runtime.Object, 0, n+1)
	for i := range pods {
		pods[i] = rig.Pod(fmt.Sprint(i), "shared")
		objs = append(objs, pods[i])
	}
	objs = append(objs, rig.Claim("shared", pods...))
	dr := newRig(t, 30*time.Second, objs...)
	ctx := t.Context()

	release := make(chan struct{})
	dr.Driver.SetHook(func(ctx context.Context, op string) error {
		if op == "prepare" {
			select {
			case <-release:
			case <-ctx.Done():
			}
		}
		return nil
	})
	ids := make([]string, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i, p := range pods {
		wg.Go(func() { ids[i], errs[i] = dr.RunPod(t, p) })
	}
	if err := wait.PollUntilContextTimeout(ctx, time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		c, ok := dr.ClaimStore.Claim("claim-shared")
		return ok && len(c.PodUIDs) == n, nil
	}); err != nil {
		c, _ := dr.ClaimStore.Claim("claim-shared")
		t.Fatalf("claim's users %v, want all %d pods: %v", c.PodUIDs, n, err)
	}
	close(release)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("sandbox of pod %d: %v", i, err)
		}
	}
	if calls := dr.Driver.Calls(); !slices.Equal(calls, []string{"prepare default/shared"}) {
		t.Fatalf("driver calls %v, want exactly one prepare for %d sandboxes", calls, n)
	}
	for i, p := range pods {
		if pc, ok := dr.ClaimStore.PodClaims(p.UID); !ok || len(pc.Claims) != 1 || !pc.Claims[0].Prepared || len(pc.Claims[0].Devices) != 1 {
			t.Errorf("pod %d's view of its claims %+v: want the shared claim prepared, with its device", i, pc)
		}
	}

	for i, p := range pods {
		dr.RemoveSandbox(t, ids[i])
		dr.DeletePod(t, p)
		dr.Manager.Reconcile(ctx)
		unprepares := slices.Index(dr.Driver.Calls(), "unprepare default/shared") >= 0
		if last := i == n-1; unprepares != last {
			t.Fatalf("after pod %d of %d is gone: driver calls %v; want the unprepare after the last only", i+1, n, dr.Driver.Calls())
		}
	}
	if calls := dr.Driver.Calls(); !slices.Equal(calls, []string{"prepare default/shared", "unprepare default/shared"}) {
		t.Errorf("driver calls %v, want one prepare and one unprepare", calls)
	}
	if c := dr.ClaimStore.List(); len(c) != 0 {
		t.Errorf("claim records left: %+v", c)
	}
}

// crashStep is a step of a claim's life in TestDRACrashAtEveryStepConverges.
type crashStep int

const (
	runA  crashStep = iota // pod A's sandbox starts: record use → driver prepare → record prepared
	runB                   // pod B's, sharing A's claim: record use (the claim is prepared)
	goneA                  // A is removed and deleted, the reconciler runs: release → (last user) driver unprepare → record unprepared
	goneB                  // the same for B
)

// TestDRACrashAtEveryStepConverges: podgate crashes after each checkpoint write, and between
// each driver call and its record, of a claim's prepare (record use → driver prepare → record
// prepared) and unprepare (release → driver unprepare → record unprepared), with one pod, and
// with a claim shared by two pods (the second joining, the first leaving, the last leaving). A
// podgate restarted from the checkpoint that crash left, with the sandbox starts the crash
// interrupted started again and then every pod removed one by one, converges: nothing is left
// recorded, the claim is never unprepared while a pod still uses it, and the driver sees
// exactly the calls the crash makes necessary: a prepare again only when the crash lost the
// driver's answer (or came before the driver's call), an unprepare again only when it lost the
// record of one.
func TestDRACrashAtEveryStepConverges(t *testing.T) {
	for _, tc := range []struct {
		name  string
		steps []crashStep // what the first podgate does
		// hook is the driver operation during the steps at which the crash comes ("": after
		// the last step); driverDid: the driver did that operation before the crash, else
		// the crash came before the call reached it (the call fails).
		hook      string
		driverDid bool
		// rerun are the pods whose sandbox start the crash interrupted: the kubelet starts
		// them again after the restart.
		rerun []string
		// The driver's calls after the restart.
		prepares, unprepares int
	}{
		{name: "A: use recorded, driver not called", steps: []crashStep{runA}, hook: "prepare", rerun: []string{"A"}, prepares: 1, unprepares: 1},
		{name: "A: driver prepared, answer not recorded", steps: []crashStep{runA}, hook: "prepare", driverDid: true, rerun: []string{"A"}, prepares: 1, unprepares: 1},
		{name: "A: prepared and recorded", steps: []crashStep{runA}, rerun: []string{"A"}, unprepares: 1},
		{name: "A: released, driver not called", steps: []crashStep{runA, goneA}, hook: "unprepare", unprepares: 1},
		{name: "A: driver unprepared, not recorded", steps: []crashStep{runA, goneA}, hook: "unprepare", driverDid: true, unprepares: 1},
		{name: "A: unprepared and recorded", steps: []crashStep{runA, goneA}},
		{name: "shared: B joining, its use not recorded", steps: []crashStep{runA}, rerun: []string{"B"}, unprepares: 1},
		{name: "shared: B's use recorded, its sandbox not started", steps: []crashStep{runA, runB}, rerun: []string{"B"}, unprepares: 1},
		{name: "shared: A released, B still uses the claim", steps: []crashStep{runA, runB, goneA}, unprepares: 1},
		{name: "shared: B, the last, released, driver not called", steps: []crashStep{runA, runB, goneA, goneB}, hook: "unprepare", unprepares: 1},
		{name: "shared: B, the last: driver unprepared, not recorded", steps: []crashStep{runA, runB, goneA, goneB}, hook: "unprepare", driverDid: true, unprepares: 1},
		{name: "shared: B, the last: unprepared and recorded", steps: []crashStep{runA, runB, goneA, goneB}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pods := map[string]*corev1.Pod{"A": rig.Pod("a", "net"), "B": rig.Pod("b", "net")}
			dr := newRig(t, 5*time.Second, pods["A"], pods["B"], rig.Claim("net", pods["A"], pods["B"]))
			ctx := t.Context()
			cpPath := filepath.Join(dr.StateDir, registry.CheckpointFile)
			var crashed []byte
			dr.Driver.SetHook(func(_ context.Context, op string) error {
				if op != tc.hook || crashed != nil {
					return nil
				}
				b, err := os.ReadFile(cpPath)
				if err != nil {
					return err
				}
				crashed = b
				if !tc.driverDid {
					return errors.New("crashed before the call reached the driver")
				}
				return nil
			})
			ids := map[string]string{}
			deleted := map[string]bool{}
			gone := func(t *testing.T, name string, d *manager.Manager, reg *registry.Registry) {
				t.Helper()
				if ids[name] != "" {
					dr.RemoveSandbox(t, ids[name])
					ids[name] = ""
				}
				if !deleted[name] {
					dr.DeletePod(t, pods[name])
					deleted[name] = true
				}
				// The sandboxes as the runtime has them: the restarted registry's were rebuilt
				// from it, and the removal above went through the first podgate's pipeline.
				if _, _, _, err := reg.Rebuild(ctx, dr.RuntimeClient); err != nil {
					t.Fatal(err)
				}
				d.Reconcile(ctx)
			}
			for _, step := range tc.steps {
				switch step {
				case runA, runB:
					name := map[crashStep]string{runA: "A", runB: "B"}[step]
					id, err := dr.RunPod(t, pods[name])
					if err != nil && (tc.hook != "prepare" || tc.driverDid) {
						t.Fatalf("sandbox of %s: %v", name, err)
					}
					ids[name] = id
				case goneA, goneB:
					gone(t, map[crashStep]string{goneA: "A", goneB: "B"}[step], dr.Manager, dr.Registry)
				}
			}
			if tc.hook == "" {
				b, err := os.ReadFile(cpPath)
				if err != nil {
					t.Fatal(err)
				}
				crashed = b
			}
			if crashed == nil {
				t.Fatalf("no crash point reached at %q: driver calls %v", tc.hook, dr.Driver.Calls())
			}
			dr.Driver.SetHook(nil)

			// The restart: a new registry from the checkpoint the crash left, new DRA stages.
			// The first podgate's background writes end first, or one could land over it.
			dr.Registry.Flush()
			if err := os.WriteFile(cpPath, crashed, 0o600); err != nil {
				t.Fatal(err)
			}
			restarted, store, _ := rig.ReadState(t, dr.StateDir)
			d := manager.New(dr.Pods, dr.Drivers, dr.Claims, store, restarted, dr.RuntimeClient, prometheus.NewRegistry())
			before := len(dr.Driver.Calls())
			after := func() []string { return dr.Driver.Calls()[before:] }
			for _, name := range tc.rerun {
				p := pods[name]
				if err := prepareAgain(ctx, d, p); err != nil {
					t.Fatalf("sandbox of %s started again: %v", name, err)
				}
				if c, ok := store.Claim("claim-net"); !ok || !c.Prepared || len(c.Devices) != 1 {
					t.Errorf("after %s started again: claim record %+v (%v), want prepared with its device", name, c, ok)
				}
			}
			// The pods that lived at the crash, or started after it, are removed one by one.
			var alive []string
			for _, name := range []string{"A", "B"} {
				if ids[name] != "" || slices.Contains(tc.rerun, name) {
					alive = append(alive, name)
				}
			}
			if _, _, _, err := restarted.Rebuild(ctx, dr.RuntimeClient); err != nil {
				t.Fatal(err)
			}
			d.Reconcile(ctx) // what the crash left, before any pod goes
			for i := 0; ; i++ {
				if n := countOf(after(), "unprepare default/net"); len(alive[i:]) > 0 && n != 0 {
					t.Fatalf("unprepared while %v still use the claim: calls after the restart %v", alive[i:], after())
				}
				if i == len(alive) {
					break
				}
				gone(t, alive[i], d, restarted)
			}
			if n := countOf(after(), "prepare default/net"); n != tc.prepares {
				t.Errorf("prepares after the restart: %d (calls %v), want %d", n, after(), tc.prepares)
			}
			if n := countOf(after(), "unprepare default/net"); n != tc.unprepares {
				t.Errorf("unprepares after the restart: %d (calls %v), want %d", n, after(), tc.unprepares)
			}
			if c, p := store.List(), store.Pods(); len(c) != 0 || len(p) != 0 {
				t.Errorf("left recorded after converging: claims %+v, pods %+v", c, p)
			}
		})
	}
}

// prepareAgain runs the DRA manager's stage for a pod's sandbox, on its own: the interrupted
// start of the pod's sandbox, started again.
func prepareAgain(ctx context.Context, d *manager.Manager, p *corev1.Pod) error {
	sb := pipeline.NewSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: &runtimeapi.PodSandboxConfig{
		Metadata: &runtimeapi.PodSandboxMetadata{Name: p.Name, Namespace: p.Namespace, Uid: string(p.UID)},
	}}, nil)
	defer sb.End()
	return d.PrepareStage().Run(ctx, sb)
}

func countOf(list []string, s string) int {
	n := 0
	for _, v := range list {
		if v == s {
			n++
		}
	}
	return n
}

// TestDRAExtendedResourceClaim: the claim the scheduler made for a pod's extended resources
// backed by DRA (pod.status.extendedResourceClaimStatus) is prepared with the pod's other
// claims and listed under the containers it serves only, not under every container.
func TestDRAExtendedResourceClaim(t *testing.T) {
	pod := rig.Pod("1")
	pod.Spec.Containers = []corev1.Container{{Name: "app"}, {Name: "side"}}
	pod.Status.ExtendedResourceClaimStatus = &corev1.PodExtendedResourceClaimStatus{
		ResourceClaimName: "ext",
		RequestMappings:   []corev1.ContainerExtendedResourceRequest{{ContainerName: "app", ResourceName: "example.com/gpu", RequestName: "req"}},
	}
	claim := rig.Claim("ext", pod)
	claim.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID, Controller: ptr.To(true)}}
	dr := newRig(t, 5*time.Second, pod, claim)
	if _, err := dr.RunPod(t, pod); err != nil {
		t.Fatal(err)
	}
	if calls := dr.Driver.Calls(); !slices.Equal(calls, []string{"prepare default/ext"}) {
		t.Errorf("driver calls %v, want the extended-resource claim prepared", calls)
	}
	pc, ok := dr.ClaimStore.PodClaims(pod.UID)
	if !ok || len(pc.Claims) != 1 || pc.Claims[0].PodClaimName != manager.ExtendedClaimName || !pc.Claims[0].Prepared {
		t.Fatalf("pod's claims %+v, want the extended-resource claim, prepared", pc)
	}
	want := []manager.ContainerClaims{{Name: "app", Claims: []string{manager.ExtendedClaimName}}, {Name: "side"}}
	if !rig.SameJSON(t, pc.Containers, want) {
		t.Errorf("containers %+v, want the claim under app only: %+v", pc.Containers, want)
	}
}

// TestDRAPodJoinsAClaimBeingUnprepared: the last pod using a claim is gone and the driver is
// unpreparing the claim (held) when the sandbox of a new pod sharing it starts. Until the
// unprepare ends, the claim's record still says prepared: the new sandbox waits for it, and then
// has the claim prepared again, whether the unprepare succeeded or failed (the driver may have
// torn part of it down), and also when the kubelet prepares the new pod's claims (its prepare
// may have come before podgate's unprepare). The claim ends prepared with its device, used by
// the new pod, and is unprepared once after it.
func TestDRAPodJoinsAClaimBeingUnprepared(t *testing.T) {
	for _, tc := range []struct {
		name          string
		failUnprepare bool
		mode          manager.Prepare // who prepares when the new pod starts
	}{
		{name: "unprepare succeeds", mode: manager.PrepareAlways},
		{name: "unprepare fails", failUnprepare: true, mode: manager.PrepareAlways},
		{name: "the kubelet prepares the new pod's claims", mode: manager.PrepareNever},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p1, p2 := rig.Pod("1", "shared"), rig.Pod("2", "shared")
			waiting := make(chan struct{})
			var waitOnce sync.Once
			var shift time.Duration // the clock's, past a failed unprepare's backoff
			opts := []manager.Option{
				manager.WithWaitHook(func(types.UID) { waitOnce.Do(func() { close(waiting) }) }),
				manager.WithClock(func() time.Time { return time.Now().Add(shift) }),
				// auto beside a kubelet 1.36 that manages the new pod when tc.mode says it
				// prepares (never): the kubelet decides, the first pod's claims are podgate's.
				manager.WithPrepare(manager.PrepareAuto),
			}
			kubeletPods := &kubeletKnowsPods{}
			opts = append(opts, manager.WithKubelet(kubeletPods), manager.WithKubeletPrepares(kubeletPrepares))
			dr := newRigWith(t, 30*time.Second, func(*rig.Rig) []manager.Option { return opts }, p1, p2, rig.Claim("shared", p1, p2))
			ctx := t.Context()
			id1, err := dr.RunPod(t, p1)
			if err != nil {
				t.Fatal(err)
			}
			dr.RemoveSandbox(t, id1)
			dr.DeletePod(t, p1)

			held, release := make(chan struct{}), make(chan struct{})
			var once sync.Once
			dr.Driver.SetHook(func(ctx context.Context, op string) error {
				if op != "unprepare" {
					return nil
				}
				once.Do(func() { close(held) })
				select {
				case <-release:
				case <-ctx.Done():
					return ctx.Err()
				}
				if tc.failUnprepare {
					return errors.New("device busy")
				}
				return nil
			})
			if tc.mode == manager.PrepareNever {
				kubeletPods.known.Store(p2.Namespace + "/" + p2.Name)
			}
			reconciled := make(chan struct{})
			go func() { defer close(reconciled); dr.Manager.Reconcile(ctx) }()
			select {
			case <-held:
			case <-ctx.Done():
				t.Fatal("the driver was not asked to unprepare")
			}

			type result struct {
				id  string
				err error
			}
			started := make(chan result, 1)
			go func() {
				id, err := dr.RunPod(t, p2)
				started <- result{id, err}
			}()
			var r result
			select {
			case <-waiting:
				close(release)
				r = <-started
			case r = <-started:
				t.Errorf("the new pod's sandbox did not wait for the unprepare of its claim (err %v)", r.err)
				close(release)
			}
			<-reconciled
			if r.err != nil {
				t.Fatalf("sandbox of the new pod: %v", r.err)
			}
			want := []string{"prepare default/shared", "unprepare default/shared", "prepare default/shared"}
			if calls := dr.Driver.Calls(); !slices.Equal(calls, want) {
				t.Errorf("driver calls %v, want %v", calls, want)
			}
			c, ok := dr.ClaimStore.Claim("claim-shared")
			if !ok || !c.Prepared || c.PreparedBy != manager.PreparedByPodgate || len(c.Devices) != 1 || c.Devices[0].Device != "dev-shared" ||
				!slices.Equal(c.PodUIDs, []types.UID{p2.UID}) {
				t.Errorf("claim record %+v (%v), want it prepared by podgate with its device, used by %s", c, ok, p2.UID)
			}

			// The new pod is the last user: its departure unprepares the claim, once.
			dr.Driver.SetHook(nil)
			shift = manager.RetryMax // past a failed unprepare's backoff
			dr.RemoveSandbox(t, r.id)
			dr.DeletePod(t, p2)
			dr.Manager.Reconcile(ctx)
			if calls := dr.Driver.Calls(); !slices.Equal(calls, append(want, "unprepare default/shared")) {
				t.Errorf("driver calls after the new pod is gone %v, want one more unprepare", calls)
			}
			if c := dr.ClaimStore.List(); len(c) != 0 {
				t.Errorf("claim records left: %+v", c)
			}
		})
	}
}

// kubeletKnowsPods is a kubelet that manages the pod named in known ("namespace/name").
type kubeletKnowsPods struct{ known atomic.Value }

func (k *kubeletKnowsPods) KubeletKnowsPod(_ context.Context, namespace, name string) (bool, error) {
	known, _ := k.known.Load().(string)
	return known == namespace+"/"+name, nil
}

func (*kubeletKnowsPods) NotListening(error) bool { return false }
