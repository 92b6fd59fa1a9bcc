package agent

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/klog/v2"

	"github.com/podgate/podgate/agent/kube"
	"github.com/podgate/podgate/agent/registry"
	"github.com/podgate/podgate/dra"
)

// draReconcilePeriod is how often podgate looks for prepared claims whose pod is gone, beside
// the looks that pod deletions and sandbox removals trigger.
const draReconcilePeriod = 10 * time.Second

// An unprepare that failed is tried again after a backoff that doubles from
// draRetryInitial to draRetryMax: a driver that is down for long is not called every period.
const (
	draRetryInitial = 10 * time.Second
	draRetryMax     = 5 * time.Minute
)

// configSourceAnnotation is the kubelet's pod annotation saying where a pod comes from; pods
// not from the API server (static pods: "file", "http") cannot use DRA claims.
const configSourceAnnotation = "kubernetes.io/config.source"

// draStages prepare a pod's DRA claims before its sandbox is created, so that the devices
// exist when containerd runs CNI, and unprepare them once the pod is gone from the API server
// and from the runtime. What they prepare is recorded in the pod registry before any driver is
// called: a crash never loses the obligation to unprepare.
//
// A failure after the prepare stage does not unprepare: the kubelet retries the sandbox, and
// the claims stay prepared until the pod is gone, as with the kubelet's own DRA manager.
type draStages struct {
	// off is why DRA is off (no Kubernetes API); empty when it is on.
	off      string
	pods     *kube.PodLookup
	claims   *dra.ClaimResolver
	drivers  *dra.Drivers
	registry *registry.Registry
	runtime  runtimeapi.RuntimeServiceClient

	// attacher moves devices into pods; nil when no driver's devices are attached.
	attacher *draAttach
	// hostIfs finds the host interface of a network device, for its network data.
	hostIfs *dra.HostInterfaces

	mu sync.Mutex
	// preparing counts the RunPodSandbox calls of a pod between its claims' recording and
	// the sandbox's recording: the reconciler leaves such a pod alone.
	preparing map[types.UID]int
	// retry holds, per pod whose release failed, when to try again and the backoff.
	retry map[types.UID]releaseRetry
	now   func() time.Time
	poke  chan struct{}

	unprepared *prometheus.CounterVec
}

func newDRAStages(pods *kube.PodLookup, drivers *dra.Drivers, claims *dra.ClaimResolver, reg *registry.Registry, rt runtimeapi.RuntimeServiceClient, r prometheus.Registerer) *draStages {
	d := &draStages{
		pods: pods, drivers: drivers, claims: claims, registry: reg, runtime: rt,
		preparing: map[types.UID]int{},
		retry:     map[types.UID]releaseRetry{},
		now:       time.Now,
		poke:      make(chan struct{}, 1),
		unprepared: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "podgate", Subsystem: "dra", Name: "claims_released_total",
			Help: "Claims podgate stopped holding for a pod that is gone, by how: unprepared (by their drivers), shared (another pod on the node still uses them).",
		}, []string{"how"}),
	}
	prepared := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "podgate", Subsystem: "dra", Name: "claims_prepared",
		Help: "Claims podgate holds prepared for the pods of this node.",
	}, func() float64 {
		n := 0
		for _, pc := range reg.AllPodClaims() {
			for _, c := range pc.Claims {
				if c.Prepared {
					n++
				}
			}
		}
		return float64(n)
	})
	r.MustRegister(d.unprepared, prepared)
	return d
}

// draOff returns DRA stages that do nothing, saying why.
func draOff(why string) *draStages { return &draStages{off: why} }

// prepareStage prepares the pod's claims before RunPodSandbox is forwarded.
func (d *draStages) prepareStage() stage {
	return stage{name: "dra-prepare", run: d.prepare, removed: d.sandboxRemoved}
}

func (d *draStages) prepare(ctx context.Context, sb *sandboxRun) error {
	if d.off != "" {
		return nil
	}
	cfg := sb.req.GetConfig()
	if src, ok := cfg.GetAnnotations()[configSourceAnnotation]; ok && src != "api" {
		return nil // a static pod: no claims
	}
	ref := sb.rec.Pod
	if ref.UID == "" {
		return nil // not a kubelet pod; nothing to look up
	}
	pod, err := d.pods.GetOrFetch(ctx, ref.UID, ref.Namespace, ref.Name)
	if errdefs.IsNotFound(err) {
		klog.FromContext(ctx).V(2).Info("Pod not in the API server: no DRA claims to prepare", "reason", err.Error())
		return nil
	}
	if err != nil {
		return err
	}
	if len(pod.Spec.ResourceClaims) == 0 {
		return nil
	}
	// Until the sandbox is recorded (or the call failed), the reconciler must not take the
	// pod for gone: it has no sandbox yet, and the informer may not know it.
	d.begin(ref.UID)
	sb.onEnd(func() { d.done(ref.UID) })
	return d.prepareClaims(ctx, ref, pod)
}

func (d *draStages) prepareClaims(ctx context.Context, ref registry.PodRef, pod *corev1.Pod) error {
	claims, err := d.claims.PodClaims(ctx, pod)
	if err != nil || len(claims) == 0 {
		return err
	}
	for _, c := range claims {
		for _, name := range c.Drivers() {
			if _, err := d.drivers.Lookup(name); err != nil {
				return fmt.Errorf("pod %s/%s claim %s/%s: %w", ref.Namespace, ref.Name, c.Namespace, c.Name, err)
			}
		}
	}
	rec, todo := d.obligation(ref, claims)
	rec.Containers = specContainers(pod)
	if len(todo) == 0 {
		// Prepared for an earlier sandbox of the pod, or for another pod sharing the claims.
		if cur, ok := d.registry.PodClaims(ref.UID); ok && sameJSONClaims(cur, rec) {
			return nil
		}
		return d.registry.SetPodClaims(rec)
	}
	// The obligation is on disk before any driver is called.
	if err := d.registry.SetPodClaims(rec); err != nil {
		return err
	}
	results, err := d.callDrivers(ctx, todo)
	var fresh []registry.ClaimRecord
	for i := range rec.Claims {
		c := &rec.Claims[i]
		if devs, ok := results[c.UID]; ok && !c.Prepared {
			c.Prepared, c.Devices = true, devs
			klog.FromContext(ctx).Info("Prepared claim", "claim", klog.KRef(c.Namespace, c.Name), "drivers", c.Drivers, "devices", deviceNames(devs))
			fresh = append(fresh, *c)
		}
	}
	d.describeNetwork(ctx, fresh)
	for _, c := range fresh {
		i := slices.IndexFunc(rec.Claims, func(r registry.ClaimRecord) bool { return r.UID == c.UID })
		rec.Claims[i] = c
	}
	d.registry.UpdatePodClaims(rec)
	if err != nil {
		return fmt.Errorf("pod %s/%s: %w", ref.Namespace, ref.Name, err)
	}
	return nil
}

// obligation merges claims into what the registry holds for the pod, and returns it with the
// claims still to prepare (each with the drivers it needs). A claim already prepared for
// another pod of the node (a shared claim) is not prepared again: the pod takes its devices, as
// the kubelet's DRA manager does.
func (d *draStages) obligation(ref registry.PodRef, claims []dra.PodClaim) (registry.PodClaims, []dra.PodClaim) {
	all := d.registry.AllPodClaims()
	rec := registry.PodClaims{Pod: ref}
	if i := slices.IndexFunc(all, func(pc registry.PodClaims) bool { return pc.Pod.UID == ref.UID }); i >= 0 {
		rec = all[i]
	}
	var todo []dra.PodClaim
	for _, c := range claims {
		i := slices.IndexFunc(rec.Claims, func(r registry.ClaimRecord) bool { return r.UID == c.UID })
		if i >= 0 && rec.Claims[i].Prepared {
			continue
		}
		if prepared, ok := preparedElsewhere(c.UID, all); ok {
			prepared.PodClaimName = c.PodClaimName
			if i >= 0 {
				rec.Claims[i] = prepared
			} else {
				rec.Claims = append(rec.Claims, prepared)
			}
			continue
		}
		if i < 0 {
			rec.Claims = append(rec.Claims, registry.ClaimRecord{UID: c.UID, Namespace: c.Namespace, Name: c.Name, PodClaimName: c.PodClaimName, Drivers: c.Drivers()})
		}
		todo = append(todo, c)
	}
	return rec, todo
}

// preparedElsewhere returns the record of claim where some pod holds it prepared.
func preparedElsewhere(claim types.UID, all []registry.PodClaims) (registry.ClaimRecord, bool) {
	for _, pc := range all {
		for _, c := range pc.Claims {
			if c.UID == claim && c.Prepared {
				return c, true
			}
		}
	}
	return registry.ClaimRecord{}, false
}

// callDrivers prepares claims, each driver's in one call, the drivers in parallel. It returns
// the devices of every claim all of whose drivers prepared it.
func (d *draStages) callDrivers(ctx context.Context, claims []dra.PodClaim) (map[types.UID][]registry.DeviceRecord, error) {
	byDriver := map[string][]dra.Claim{}
	for _, c := range claims {
		for _, name := range c.Drivers() {
			byDriver[name] = append(byDriver[name], dra.Claim{Namespace: c.Namespace, Name: c.Name, UID: c.UID})
		}
	}
	type answer struct {
		driver  string
		results map[types.UID]dra.PrepareResult
		err     error
	}
	answers := make(chan answer, len(byDriver))
	for name, cls := range byDriver {
		go func() {
			drv, err := d.drivers.Lookup(name)
			if err != nil {
				answers <- answer{driver: name, err: err}
				return
			}
			res, err := drv.Prepare(ctx, cls)
			answers <- answer{driver: name, results: res, err: err}
		}()
	}
	devices := map[types.UID][]registry.DeviceRecord{}
	failed := map[types.UID]bool{}
	var errs []error
	for range byDriver {
		a := <-answers
		if a.err != nil {
			errs = append(errs, a.err)
		}
		for _, c := range byDriver[a.driver] {
			res, ok := a.results[c.UID]
			if !ok || res.Err != nil {
				failed[c.UID] = true
				continue
			}
			for _, dev := range res.Devices {
				devices[c.UID] = append(devices[c.UID], registry.DeviceRecord{Driver: a.driver, Pool: dev.Pool, Device: dev.Name, Requests: dev.Requests, CDIDeviceIDs: dev.CDIDeviceIDs})
			}
			if _, ok := devices[c.UID]; !ok {
				devices[c.UID] = nil // prepared, with no device to show
			}
		}
	}
	for uid := range failed {
		delete(devices, uid)
	}
	return devices, errors.Join(errs...)
}

// sameJSONClaims reports whether two records hold the same claims, in order.
func sameJSONClaims(a, b registry.PodClaims) bool {
	return slices.EqualFunc(a.Claims, b.Claims, func(x, y registry.ClaimRecord) bool {
		return x.UID == y.UID && x.Prepared == y.Prepared && x.PodClaimName == y.PodClaimName
	})
}

func deviceNames(devs []registry.DeviceRecord) []string {
	out := make([]string, len(devs))
	for i, d := range devs {
		out[i] = d.Driver + "/" + d.Pool + "/" + d.Device
	}
	return out
}

func (d *draStages) begin(uid types.UID) {
	d.mu.Lock()
	d.preparing[uid]++
	d.mu.Unlock()
}

// done ends one in-flight RunPodSandbox of the pod.
func (d *draStages) done(uid types.UID) {
	d.mu.Lock()
	if d.preparing[uid]--; d.preparing[uid] <= 0 {
		delete(d.preparing, uid)
	}
	d.mu.Unlock()
}

func (d *draStages) inFlight(uid types.UID) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.preparing[uid] > 0
}

// sandboxRemoved asks the reconciler to look: the pod's last sandbox may be gone.
func (d *draStages) sandboxRemoved(context.Context, string) error {
	d.wake()
	return nil
}

func (d *draStages) wake() {
	if d.off != "" {
		return
	}
	select {
	case d.poke <- struct{}{}:
	default: // a look is already due
	}
}

// run releases the claims of pods that are gone until ctx ends: periodically, and when a pod is
// deleted or a sandbox removed.
func (d *draStages) run(ctx context.Context) {
	if d.off != "" {
		return
	}
	d.pods.OnDeleted(func(*corev1.Pod) { d.wake() })
	ticker := time.NewTicker(draReconcilePeriod)
	defer ticker.Stop()
	for {
		d.reconcile(ctx)
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		case <-d.poke:
		}
	}
}

// reconcile releases, once, the claims of each pod that is gone from the API server (or
// deleted) and has no running sandbox left in the runtime: a stopped sandbox of such a pod
// never runs again (the kubelet makes new sandboxes only for pods the API server still has,
// undeleted), and the kubelet's garbage collection may keep it for minutes. A claim another pod
// of this node still holds is only dropped from the gone pod's record: the last pod unprepares
// it.
func (d *draStages) reconcile(ctx context.Context) {
	logger := klog.FromContext(ctx)
	all := d.registry.AllPodClaims()
	for _, pc := range slices.Clone(all) {
		if ctx.Err() != nil {
			return
		}
		gone, err := d.podGone(ctx, pc.Pod)
		if err != nil {
			logger.V(1).Info("Cannot tell yet whether a pod with prepared claims is gone", "pod", klog.KRef(pc.Pod.Namespace, pc.Pod.Name), "err", err)
			continue
		}
		if !gone || !d.due(pc.Pod.UID) {
			continue
		}
		if err := d.release(ctx, pc, all); err != nil {
			after := d.failed(pc.Pod.UID)
			logger.Error(err, "Release claims of a gone pod", "pod", klog.KRef(pc.Pod.Namespace, pc.Pod.Name), "retryIn", after)
			continue
		}
		d.mu.Lock()
		delete(d.retry, pc.Pod.UID)
		d.mu.Unlock()
		// Released: the claims it shared are now the remaining holders' to unprepare.
		all = slices.DeleteFunc(all, func(o registry.PodClaims) bool { return o.Pod.UID == pc.Pod.UID })
	}
}

// releaseRetry is when a failed release of a pod's claims is tried again.
type releaseRetry struct {
	next    time.Time
	backoff time.Duration
}

// due reports whether the pod's release may be tried now.
func (d *draStages) due(uid types.UID) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	r, ok := d.retry[uid]
	return !ok || !d.now().Before(r.next)
}

// failed records a failed release and returns when it is tried again.
func (d *draStages) failed(uid types.UID) time.Duration {
	d.mu.Lock()
	defer d.mu.Unlock()
	r := d.retry[uid]
	r.backoff = min(max(2*r.backoff, draRetryInitial), draRetryMax)
	r.next = d.now().Add(r.backoff)
	d.retry[uid] = r
	return r.backoff
}

// podGone reports whether the pod is deleted in the API server and has no running sandbox.
func (d *draStages) podGone(ctx context.Context, ref registry.PodRef) (bool, error) {
	if d.inFlight(ref.UID) {
		return false, nil
	}
	if pod, ok := d.pods.Get(ref.UID); ok && pod.DeletionTimestamp == nil {
		return false, nil
	} else if !ok {
		if !d.pods.HasSynced() {
			return false, errors.New("pod informer not synced")
		}
		// The informer may lag behind a pod podgate fetched itself: ask once.
		pod, err := d.pods.GetOrFetch(ctx, ref.UID, ref.Namespace, ref.Name)
		switch {
		case err == nil && pod.DeletionTimestamp == nil:
			return false, nil
		case err != nil && !errdefs.IsNotFound(err) && !errdefs.IsFailedPrecondition(err):
			return false, err
		}
	}
	if slices.ContainsFunc(d.registry.PodSandboxes(ref.UID), func(r registry.SandboxRecord) bool { return r.Ready }) {
		return false, nil
	}
	// Sandboxes made past podgate count too: the kubelet labels each with its pod's UID.
	resp, err := d.runtime.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{Filter: &runtimeapi.PodSandboxFilter{
		LabelSelector: map[string]string{"io.kubernetes.pod.uid": string(ref.UID)},
		State:         &runtimeapi.PodSandboxStateValue{State: runtimeapi.PodSandboxState_SANDBOX_READY},
	}})
	if err != nil {
		return false, fmt.Errorf("list the pod's sandboxes: %w", err)
	}
	return len(resp.GetItems()) == 0, nil
}

// release unprepares the gone pod's claims that no other pod holds, and forgets the pod's
// claims once every one is released.
func (d *draStages) release(ctx context.Context, pc registry.PodClaims, all []registry.PodClaims) error {
	logger := klog.FromContext(ctx).WithValues("pod", klog.KRef(pc.Pod.Namespace, pc.Pod.Name), "podUID", pc.Pod.UID)
	byDriver := map[string][]dra.Claim{}
	for _, c := range pc.Claims {
		if heldByOther(c.UID, pc.Pod.UID, all) {
			d.unprepared.WithLabelValues("shared").Inc()
			logger.Info("Claim stays prepared: another pod of the node holds it", "claim", klog.KRef(c.Namespace, c.Name))
			continue
		}
		for _, name := range c.Drivers {
			byDriver[name] = append(byDriver[name], dra.Claim{Namespace: c.Namespace, Name: c.Name, UID: c.UID})
		}
	}
	var errs []error
	for name, cls := range byDriver {
		drv, err := d.drivers.Lookup(name)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if _, err := drv.Unprepare(ctx, cls); err != nil {
			errs = append(errs, err)
			continue
		}
		for _, c := range cls {
			d.unprepared.WithLabelValues("unprepared").Inc()
			logger.Info("Unprepared claim", "claim", klog.KRef(c.Namespace, c.Name), "driver", name)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	for _, c := range pc.Claims {
		d.claims.Forget(c.Namespace, c.Name)
	}
	d.registry.RemovePodClaims(pc.Pod.UID)
	return nil
}

// heldByOther reports whether a pod other than uid has claim in its records.
func heldByOther(claim, uid types.UID, all []registry.PodClaims) bool {
	for _, pc := range all {
		if pc.Pod.UID == uid {
			continue
		}
		if slices.ContainsFunc(pc.Claims, func(c registry.ClaimRecord) bool { return c.UID == claim }) {
			return true
		}
	}
	return false
}
