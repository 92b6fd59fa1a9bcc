package manager

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containerd/errdefs"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/version"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/klog/v2"

	"github.com/podgate/podgate/agent/kube"
	"github.com/podgate/podgate/agent/registry"
	"github.com/podgate/podgate/dra"
	"github.com/podgate/podgate/pipeline"
)

// draReconcilePeriod is how often podgate looks for prepared claims whose pod is gone, beside
// the looks that pod deletions and sandbox removals trigger.
const draReconcilePeriod = 10 * time.Second

// An unprepare that failed is tried again after a backoff that doubles from
// RetryInitial to RetryMax: a driver that is down for long is not called every period.
const (
	RetryInitial = 10 * time.Second
	RetryMax     = 5 * time.Minute
)

// ExtendedClaimName is the pod's name for the claim of its extended resources backed by DRA
// (pod.status.extendedResourceClaimStatus), which has none in the pod's spec: not a DNS label,
// so no spec claim is named so.
const ExtendedClaimName = "(extended resources)"

// configSourceAnnotation is the kubelet's pod annotation saying where a pod comes from; pods
// not from the API server (static pods: "file", "http") cannot use DRA claims.
const configSourceAnnotation = "kubernetes.io/config.source"

// Who prepares a pod's claims (dra.prepare): the values of the agent's configuration.
const (
	// PrepareAuto: the kubelet when it prepares claims (its version) and manages the pod (its
	// PodResources socket knows it), else podgate.
	PrepareAuto = "auto"
	// PrepareAlways: podgate, whatever the kubelet does.
	PrepareAlways = "always"
	// PrepareNever: the kubelet; podgate records the devices of the claims' allocation.
	PrepareNever = "never"
)

// nodeGetTimeout bounds one GET of the Node: one small object.
const nodeGetTimeout = 10 * time.Second

// Manager prepares a pod's DRA claims before its sandbox is created, so that the devices
// exist when containerd runs CNI, and unprepares them once the pod is gone from the API server
// and from the runtime. What it prepares is recorded in the pod registry before any driver is
// called: a crash never loses the obligation to unprepare.
//
// A failure after the prepare stage does not unprepare: the kubelet retries the sandbox, and
// the claims stay prepared until the pod is gone, as with the kubelet's own DRA manager.
type Manager struct {
	// off is why DRA is off (no Kubernetes API); empty when it is on.
	off      string
	pods     *kube.PodLookup
	claims   *dra.ClaimResolver
	drivers  *dra.Drivers
	registry *registry.Registry
	runtime  runtimeapi.RuntimeServiceClient

	// rebuilt is closed once the registry is rebuilt from the runtime: settler settles what
	// is left from then on. Nil: never (tests settle themselves).
	rebuilt <-chan struct{}
	settler Settler
	// hostIfs finds the host interface of a network device, for its network data; nil: none.
	hostIfs *dra.HostInterfaces

	mu sync.Mutex
	// preparing counts the RunPodSandbox calls of a pod between its claims' recording and
	// the sandbox's recording: the reconciler leaves such a pod alone.
	preparing map[types.UID]int
	// retry holds, per claim whose unprepare failed, when to try again and the backoff.
	retry map[types.UID]releaseRetry
	// busy holds the claims a call is preparing or unpreparing now. A shared claim is
	// prepared by one call while the others wait, and a claim being unprepared is waited for.
	busy map[types.UID]*claimOp
	// onWait, when set (tests), is called when a prepare waits for another call's claim.
	onWait func(types.UID)
	now    func() time.Time
	poke   chan struct{}

	unprepared *prometheus.CounterVec
	// decisions counts who prepared pods' claims (podgate, kubelet).
	decisions *prometheus.CounterVec

	// mode is dra.prepare (Prepare*).
	mode string
	// kubeletVersion is the node's kubelet version from its Node object (nil until read, or
	// when it could not be); kubelet tells whether the kubelet manages a pod. With mode auto
	// both decide whether the kubelet prepared a pod's claims.
	kubeletVersion atomic.Pointer[version.Version]
	kubelet        func() KubeletPods
	// nodeMu serialises the reads of the Node for a decision (kubeletVersionNow); nodeReadAt
	// is when the last began.
	nodeMu     sync.Mutex
	nodeReadAt time.Time
}

// nodeReadInterval spaces the reads of the Node that pod starts make while the kubelet's
// version is not known (kubeletVersionNow): a Node podgate may not read costs one GET per
// interval, not one per pod start.
const nodeReadInterval = 10 * time.Second

// KubeletPods is the kubelet's PodResources socket as the DRA manager asks it: does the kubelet
// manage this pod? A kubelet that does called RunPodSandbox for it after preparing its claims.
// podgate's PodResources server asks it, within the kubelet's rate limit.
type KubeletPods interface {
	KubeletKnowsPod(ctx context.Context, namespace, name string) (bool, error)
	// NotListening tells an error of KubeletKnowsPod that says nobody listens on the
	// kubelet's socket (a kubelet that died and left its socket behind).
	NotListening(err error) bool
}

// Settler settles, once the registry is rebuilt from the runtime and then at every reconcile,
// what an interrupted operation left (package attach's left attach intents).
type Settler interface {
	Settle(ctx context.Context)
}

// kubeletPreparesFrom is the first kubelet version whose DRA manager prepares claims by
// default: DynamicResourceAllocation is GA, on by default, in 1.34 (and locked on from 1.35).
// An older kubelet may prepare too, with its feature gate on: dra.prepare never says so.
var kubeletPreparesFrom = version.MajorMinor(1, 34)

// Option configures a Manager.
type Option func(*Manager)

// WithPrepare sets dra.prepare (PrepareAlways, the default; PrepareNever; PrepareAuto).
func WithPrepare(mode string) Option { return func(d *Manager) { d.mode = mode } }

// WithKubelet gives dra.prepare auto the kubelet to ask whether it manages a pod. kubelet is
// called at each decision, as the PodResources socket that asks opens after the manager is
// built; it returns nil while there is none (nobody to ask: podgate prepares).
func WithKubelet(kubelet func() KubeletPods) Option { return func(d *Manager) { d.kubelet = kubelet } }

// WithSettle has s settle what is left once rebuilt is closed (the registry is rebuilt from
// the runtime, whose records then say which sandboxes still run), then at every reconcile.
func WithSettle(rebuilt <-chan struct{}, s Settler) Option {
	return func(d *Manager) { d.rebuilt, d.settler = rebuilt, s }
}

// WithHostInterfaces gives prepared network devices their network data (the host interface
// from the driver's ResourceSlice), which PodResources shows a meta-CNI plugin.
func WithHostInterfaces(h *dra.HostInterfaces) Option { return func(d *Manager) { d.hostIfs = h } }

// WithClock replaces time.Now for the unprepare retries' backoff and the Node reads' spacing
// (tests).
func WithClock(now func() time.Time) Option { return func(d *Manager) { d.now = now } }

// WithWaitHook has fn called when a prepare waits for another call's prepare or unprepare of
// a shared claim (tests order the calls by it).
func WithWaitHook(fn func(types.UID)) Option { return func(d *Manager) { d.onWait = fn } }

// New returns the DRA manager: pods looked up in pods, claims resolved by claims, prepared by
// drivers, recorded in reg; rt tells which sandboxes still run. Its metrics are registered
// with r.
func New(pods *kube.PodLookup, drivers *dra.Drivers, claims *dra.ClaimResolver, reg *registry.Registry, rt runtimeapi.RuntimeServiceClient, r prometheus.Registerer, opts ...Option) *Manager {
	d := &Manager{
		pods: pods, drivers: drivers, claims: claims, registry: reg, runtime: rt, mode: PrepareAlways,
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "podgate", Subsystem: "dra", Name: "pod_claims_prepared_total",
			Help: "Pod starts with DRA claims, by who prepared the claims: podgate (it called the drivers, or found them prepared by podgate for another pod), kubelet (the kubelet's DRA manager did; podgate recorded their devices).",
		}, []string{"by"}),
		preparing: map[types.UID]int{},
		retry:     map[types.UID]releaseRetry{},
		busy:      map[types.UID]*claimOp{},
		now:       time.Now,
		poke:      make(chan struct{}, 1),
		unprepared: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "podgate", Subsystem: "dra", Name: "claims_released_total",
			Help: "Claims released by pods that are gone, by how: shared (another pod of the node still uses the claim, which stays prepared), unprepared (the last user gone, its drivers unprepared it), kubelet (the last user gone, the claim the kubelet prepared is forgotten: the kubelet unprepares it).",
		}, []string{"how"}),
	}
	for _, o := range opts {
		o(d)
	}
	prepared := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "podgate", Subsystem: "dra", Name: "claims_prepared",
		Help: "Claims podgate holds prepared for the pods of this node.",
	}, func() float64 {
		n := 0
		for _, c := range reg.Claims() {
			if c.Prepared {
				n++
			}
		}
		return float64(n)
	})
	r.MustRegister(d.unprepared, d.decisions, prepared)
	return d
}

// Off returns a manager that does nothing, saying why (no Kubernetes API): its stage lets
// every sandbox through.
func Off(why string) *Manager { return &Manager{off: why} }

// Claims is the claim resolver the manager reads claims with.
func (d *Manager) Claims() *dra.ClaimResolver { return d.claims }

// PrepareStage ("dra-prepare") prepares the pod's claims before RunPodSandbox is forwarded.
func (d *Manager) PrepareStage() pipeline.Stage {
	return pipeline.Stage{Name: "dra-prepare", Run: d.prepare, Removed: d.sandboxRemoved,
		Holds: "the DRA drivers prepare the pod's claims", RefusedReason: "FailedDRAPrepare"}
}

func (d *Manager) prepare(ctx context.Context, sb *pipeline.Sandbox) error {
	if d.off != "" {
		return nil
	}
	cfg := sb.Req.GetConfig()
	if src, ok := cfg.GetAnnotations()[configSourceAnnotation]; ok && src != "api" {
		return nil // a static pod: no claims
	}
	ref := sb.Rec.Pod
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
	if len(pod.Spec.ResourceClaims) == 0 && pod.Status.ExtendedResourceClaimStatus == nil {
		return nil // no claim: nothing to ask the API server
	}
	// Until the sandbox is recorded (or the call failed), the reconciler must not take the
	// pod for gone: it has no sandbox yet, and the informer may not know it.
	d.begin(ref.UID)
	sb.OnEnd(func() { d.done(ref.UID) })
	return d.prepareClaims(ctx, ref, pod)
}

func (d *Manager) prepareClaims(ctx context.Context, ref registry.PodRef, pod *corev1.Pod) error {
	claims, err := d.claims.PodClaims(ctx, pod)
	if err != nil || len(claims) == 0 {
		return err
	}
	uses := make([]registry.ClaimUse, len(claims))
	containers := SpecContainers(pod)
	for i, c := range claims {
		for _, name := range c.Drivers() {
			if _, err := d.drivers.Lookup(name); err != nil {
				return fmt.Errorf("pod %s/%s claim %s/%s: %w", ref.Namespace, ref.Name, c.Namespace, c.Name, err)
			}
		}
		uses[i] = registry.ClaimUse{UID: c.UID, Namespace: c.Namespace, Name: c.Name, PodClaimName: c.PodClaimName, Drivers: c.Drivers()}
		if c.Extended {
			// The claim of the pod's extended resources has no name in the pod's spec: it
			// gets one that no spec name can be, listed under the containers it serves.
			uses[i].PodClaimName = ExtendedClaimName
			for j := range containers {
				if slices.Contains(c.Containers(), containers[j].Name) {
					containers[j].Claims = append(containers[j].Claims, ExtendedClaimName)
				}
			}
		}
	}
	// The obligation is on disk before any driver is called: the pod is a user of each claim.
	// From now on no unprepare of these claims begins (unprepare looks for users); one that
	// began before is waited for (prepareOnce).
	if err := d.registry.UseClaims(ref, containers, uses); err != nil {
		return err
	}
	by := d.preparer(ctx, ref)
	d.decisions.WithLabelValues(by).Inc()
	if by == registry.PreparedByKubelet {
		klog.FromContext(ctx).V(2).Info("Claims prepared by the kubelet: recording their devices", "claims", len(claims))
	}
	if err := d.prepareOnce(ctx, claims, by); err != nil {
		return fmt.Errorf("pod %s/%s: %w", ref.Namespace, ref.Name, err)
	}
	return nil
}

// preparer decides who prepares the pod's claims, by dra.prepare: podgate (always), the
// kubelet (never), or with auto the kubelet when it prepares claims (its version) and manages
// this pod (its PodResources socket knows it): it then called RunPodSandbox after preparing
// them. A kubelet that does not answer, does not know the pod, or whose version is not known
// leaves it to podgate: a repeated prepare is harmless, a missing device is not.
func (d *Manager) preparer(ctx context.Context, ref registry.PodRef) string {
	switch d.mode {
	case PrepareNever:
		return registry.PreparedByKubelet
	case PrepareAlways:
		return registry.PreparedByPodgate
	}
	var kubelet KubeletPods
	if d.kubelet != nil {
		kubelet = d.kubelet()
	}
	if kubelet == nil { // no podResources.kubeletSocket: nobody to ask
		return registry.PreparedByPodgate
	}
	if v := d.kubeletVersionNow(ctx); v == nil || v.LessThan(kubeletPreparesFrom) {
		return registry.PreparedByPodgate
	}
	known, err := kubelet.KubeletKnowsPod(ctx, ref.Namespace, ref.Name)
	switch {
	case kubelet.NotListening(err):
		// A kubelet that died and left its socket behind: decided at once, as with no socket
		// (podgate_podresources_kubelet_requests_total{result="not_listening"} counts it).
		klog.FromContext(ctx).V(1).Info("Nobody listens on the kubelet's PodResources socket: no kubelet, podgate prepares the pod's claims", "err", err)
		return registry.PreparedByPodgate
	case err != nil:
		klog.FromContext(ctx).V(1).Info("The kubelet's PodResources did not say whether it manages the pod: podgate prepares its claims", "err", err)
		return registry.PreparedByPodgate
	}
	if !known {
		return registry.PreparedByPodgate
	}
	return registry.PreparedByKubelet
}

// kubeletVersionNow is the kubelet's version for a decision now: the one read at start-up or,
// while that read has not succeeded (podgate started before the kubelet registered its Node,
// and retries with a backoff of up to 30 s), the Node read now, by one GET at most every
// nodeReadInterval, which the sandboxes asking meanwhile wait for. Without it, the claims of
// the pods the kubelet starts right after it registered would be prepared twice.
func (d *Manager) kubeletVersionNow(ctx context.Context) *version.Version {
	if v := d.kubeletVersion.Load(); v != nil || d.pods == nil {
		return v
	}
	d.nodeMu.Lock()
	defer d.nodeMu.Unlock()
	if v := d.kubeletVersion.Load(); v != nil || (!d.nodeReadAt.IsZero() && d.now().Sub(d.nodeReadAt) < nodeReadInterval) {
		return v
	}
	d.nodeReadAt = d.now()
	gctx, cancel := context.WithTimeout(ctx, nodeGetTimeout)
	defer cancel()
	node, err := d.pods.Client().GetNode(gctx, d.pods.NodeName())
	if err != nil {
		klog.FromContext(ctx).V(1).Info("Node not read: podgate prepares the pod's claims itself", "node", d.pods.NodeName(), "err", err)
		return nil
	}
	d.SetKubeletVersion(ctx, node)
	return d.kubeletVersion.Load()
}

// SetKubeletVersion takes the kubelet's version from its Node object (status.nodeInfo), read
// at start-up, for dra.prepare auto.
func (d *Manager) SetKubeletVersion(ctx context.Context, node *corev1.Node) {
	if node == nil {
		return
	}
	raw := node.Status.NodeInfo.KubeletVersion
	v, err := version.ParseGeneric(raw)
	if err != nil {
		klog.FromContext(ctx).Info("Kubelet version of the Node not understood: podgate prepares pods' claims itself", "kubeletVersion", raw, "err", err)
		return
	}
	d.kubeletVersion.Store(v)
	klog.FromContext(ctx).Info("DRA prepare", "mode", d.mode, "kubeletVersion", raw, "kubeletPrepares", !v.LessThan(kubeletPreparesFrom))
}

// observed are the devices of the claims the kubelet prepared and podgate has not recorded as
// prepared yet, from their allocation, with their network data as podgate's own prepare
// records it: what the PodResources extension shows a meta-CNI plugin during CNI ADD.
func (d *Manager) observed(ctx context.Context, claims []dra.PodClaim) map[types.UID][]registry.DeviceRecord {
	devices := allocatedDevices(claims)
	var fresh []registry.ClaimRecord
	for _, c := range claims {
		if info, ok := d.registry.Claim(c.UID); ok && info.Prepared {
			delete(devices, c.UID) // recorded already, with its network data
			continue
		}
		fresh = append(fresh, registry.ClaimRecord{UID: c.UID, Namespace: c.Namespace, Name: c.Name, Drivers: c.Drivers(), Prepared: true, Devices: devices[c.UID]})
	}
	d.describeNetwork(ctx, fresh)
	for _, c := range fresh {
		devices[c.UID] = c.Devices
	}
	return devices
}

// allocatedDevices are the devices of each claim's allocation that its drivers serve, as the
// kubelet prepared them: what podgate shows and attaches without having called the drivers.
func allocatedDevices(claims []dra.PodClaim) map[types.UID][]registry.DeviceRecord {
	out := make(map[types.UID][]registry.DeviceRecord, len(claims))
	for _, c := range claims {
		var devs []registry.DeviceRecord
		for _, r := range c.Results {
			i := slices.IndexFunc(devs, func(d registry.DeviceRecord) bool {
				return d.Driver == r.Driver && d.Pool == r.Pool && d.Device == r.Device
			})
			if i < 0 {
				devs = append(devs, registry.DeviceRecord{Driver: r.Driver, Pool: r.Pool, Device: r.Device})
				i = len(devs) - 1
			}
			devs[i].Requests = append(devs[i].Requests, r.Request)
		}
		out[c.UID] = devs
	}
	return out
}

// claimOp is a prepare or an unprepare of a claim in progress; done closes when it ends.
type claimOp struct {
	done chan struct{}
	// unprepare: podgate's drivers are unpreparing the claim.
	unprepare bool
}

// prepareOnce makes sure each claim is prepared, calling its drivers at most once however many
// sandboxes ask at the same moment. A claim another call is preparing or unpreparing is waited
// for first, and looked at again after: until an unprepare ends, the claim's record still says
// prepared while its drivers tear its devices down. A claim prepared already is then taken as it
// is; the rest this call prepares: by podgate, each driver's claims in one call; by the kubelet,
// it records their devices. A claim whose preparer failed is tried again by a waiter.
//
// A claim whose drivers podgate unprepared while the pod joined is prepared by podgate even when
// the kubelet prepares the pod's claims: the kubelet's prepare may have come before that
// unprepare, and the kubelet does not prepare a claim it holds prepared again.
func (d *Manager) prepareOnce(ctx context.Context, claims []dra.PodClaim, by string) error {
	undone := map[types.UID]bool{} // claims whose drivers unprepared them while this call waited
	for {
		var mine []dra.PodClaim
		waits := map[types.UID]*claimOp{}
		d.mu.Lock()
		for _, c := range claims {
			if op, busy := d.busy[c.UID]; busy {
				waits[c.UID] = op
				continue
			}
			if info, ok := d.registry.Claim(c.UID); ok && info.Prepared {
				continue
			}
			d.busy[c.UID] = &claimOp{done: make(chan struct{})}
			mine = append(mine, c)
		}
		d.mu.Unlock()
		if len(mine) == 0 && len(waits) == 0 {
			return nil
		}
		if len(mine) > 0 {
			err := d.prepareMine(ctx, mine, by, undone)
			d.mu.Lock()
			for _, c := range mine {
				close(d.busy[c.UID].done)
				delete(d.busy, c.UID)
			}
			d.mu.Unlock()
			if err != nil {
				return err
			}
		}
		for uid, op := range waits {
			if d.onWait != nil {
				d.onWait(uid)
			}
			select {
			case <-op.done:
			case <-ctx.Done():
				return fmt.Errorf("wait for another call's prepare or unprepare of a shared claim: %w", context.Cause(ctx))
			}
			if op.unprepare {
				undone[uid] = true
			}
		}
	}
}

// prepareMine prepares the claims this call holds: it records the devices of those the kubelet
// prepared (by kubelet), and calls the drivers of the others.
func (d *Manager) prepareMine(ctx context.Context, claims []dra.PodClaim, by string, undone map[types.UID]bool) error {
	if by != registry.PreparedByKubelet {
		return d.callAndRecord(ctx, claims)
	}
	var observe, call []dra.PodClaim
	for _, c := range claims {
		if undone[c.UID] {
			klog.FromContext(ctx).Info("Claim unprepared by podgate while the pod joined it: podgate prepares it again", "claim", klog.KRef(c.Namespace, c.Name))
			call = append(call, c)
			continue
		}
		observe = append(observe, c)
	}
	var errs []error
	if len(observe) > 0 {
		errs = append(errs, d.registry.SetObserved(d.observed(ctx, observe)))
	}
	if len(call) > 0 {
		errs = append(errs, d.callAndRecord(ctx, call))
	}
	return errors.Join(errs...)
}

// callAndRecord calls the drivers of claims this call prepares and records what they returned.
func (d *Manager) callAndRecord(ctx context.Context, claims []dra.PodClaim) error {
	results, err := d.callDrivers(ctx, claims)
	if len(results) > 0 {
		var fresh []registry.ClaimRecord
		for _, c := range claims {
			if devs, ok := results[c.UID]; ok {
				fresh = append(fresh, registry.ClaimRecord{UID: c.UID, Namespace: c.Namespace, Name: c.Name, Drivers: c.Drivers(), Prepared: true, Devices: devs})
				klog.FromContext(ctx).Info("Prepared claim", "claim", klog.KRef(c.Namespace, c.Name), "drivers", c.Drivers(), "devices", deviceNames(devs))
			}
		}
		d.describeNetwork(ctx, fresh)
		devices := make(map[types.UID][]registry.DeviceRecord, len(fresh))
		for _, c := range fresh {
			devices[c.UID] = c.Devices
		}
		if werr := d.registry.SetPrepared(devices); werr != nil {
			// The drivers prepared; the record says not yet: the next sandbox prepares again,
			// which drivers accept, and the claim stays an obligation to unprepare.
			err = errors.Join(err, werr)
		}
	}
	return err
}

// callDrivers prepares claims, each driver's in one call, the drivers in parallel. It returns
// the devices of every claim all of whose drivers prepared it.
func (d *Manager) callDrivers(ctx context.Context, claims []dra.PodClaim) (map[types.UID][]registry.DeviceRecord, error) {
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
			// A span per driver: the pod start's trace shows which driver took how long.
			sctx, span := pipeline.StartSpan(ctx, "dra prepare", attribute.String("driver", name), attribute.Int("claims", len(cls)))
			res, err := drv.Prepare(sctx, cls)
			pipeline.EndSpan(span, err)
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

func deviceNames(devs []registry.DeviceRecord) []string {
	out := make([]string, len(devs))
	for i, d := range devs {
		out[i] = d.Driver + "/" + d.Pool + "/" + d.Device
	}
	return out
}

func (d *Manager) begin(uid types.UID) {
	d.mu.Lock()
	d.preparing[uid]++
	d.mu.Unlock()
}

// done ends one in-flight RunPodSandbox of the pod.
func (d *Manager) done(uid types.UID) {
	d.mu.Lock()
	if d.preparing[uid]--; d.preparing[uid] <= 0 {
		delete(d.preparing, uid)
	}
	d.mu.Unlock()
}

func (d *Manager) inFlight(uid types.UID) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.preparing[uid] > 0
}

// sandboxRemoved asks the reconciler to look: the pod's last sandbox may be gone.
func (d *Manager) sandboxRemoved(context.Context, string) error {
	d.wake()
	return nil
}

func (d *Manager) wake() {
	if d.off != "" {
		return
	}
	select {
	case d.poke <- struct{}{}:
	default: // a look is already due
	}
}

// Run releases the claims of pods that are gone until ctx ends: periodically, and when a pod is
// deleted or a sandbox removed. Once the registry is rebuilt from the runtime, it settles the
// intents that are left too (Settler), at once and then each time.
func (d *Manager) Run(ctx context.Context) {
	if d.off != "" {
		return
	}
	d.pods.OnDeleted(func(*corev1.Pod) { d.wake() })
	ticker := time.NewTicker(draReconcilePeriod)
	defer ticker.Stop()
	rebuilt, settle := d.rebuilt, false
	for {
		d.Reconcile(ctx)
		if settle && d.settler != nil {
			d.settler.Settle(ctx)
		}
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		case <-d.poke:
		case <-rebuilt:
			rebuilt, settle = nil, true
		}
	}
}

// Reconcile releases the claims of each pod that is gone from the API server (or deleted) and
// has no running sandbox left in the runtime: a stopped sandbox of such a pod never runs again
// (the kubelet makes new sandboxes only for pods the API server still has, undeleted), and the
// kubelet's garbage collection may keep it for minutes. The pod leaves its claims' users; a
// claim no pod of the node uses any more is unprepared, once; a claim another pod still uses
// stays prepared for it: the last user unprepares it.
func (d *Manager) Reconcile(ctx context.Context) {
	logger := klog.FromContext(ctx)
	for _, p := range d.registry.DRAPods() {
		if ctx.Err() != nil {
			return
		}
		gone, err := d.podGone(ctx, p.Pod)
		if err != nil {
			logger.V(1).Info("Cannot tell yet whether a pod with prepared claims is gone", "pod", klog.KRef(p.Pod.Namespace, p.Pod.Name), "err", err)
			continue
		}
		if !gone {
			continue
		}
		unused, err := d.registry.ReleasePod(p.Pod.UID)
		if err != nil {
			logger.Error(err, "Release claims of a gone pod", "pod", klog.KRef(p.Pod.Namespace, p.Pod.Name))
			continue
		}
		if shared := len(p.Claims) - len(unused); shared > 0 {
			d.unprepared.WithLabelValues("shared").Add(float64(shared))
			logger.Info("Pod gone: claims other pods of the node use stay prepared", "pod", klog.KRef(p.Pod.Namespace, p.Pod.Name), "shared", shared)
		}
	}
	for _, c := range d.registry.Claims() {
		if ctx.Err() != nil {
			return
		}
		if len(c.PodUIDs) > 0 || !d.due(c.UID) {
			continue
		}
		if err := d.unprepare(ctx, c); err != nil {
			after := d.failed(c.UID)
			logger.Error(err, "Unprepare claim no pod uses", "claim", klog.KRef(c.Namespace, c.Name), "retryIn", after)
			continue
		}
		d.mu.Lock()
		delete(d.retry, c.UID)
		d.mu.Unlock()
	}
}

// unprepare has the drivers unprepare a claim no pod uses, unless a sandbox is taking it up
// again (preparing it), and then forgets it. A claim that was never prepared is unprepared too:
// a crash may have come between the driver's prepare and its record. A sandbox whose pod takes
// the claim up while the drivers unprepare it waits (prepareOnce) and then finds it unprepared,
// used by its pod (ClaimUnprepared, ClaimUnprepareFailed): it prepares it again.
func (d *Manager) unprepare(ctx context.Context, c registry.ClaimInfo) error {
	d.mu.Lock()
	if _, busy := d.busy[c.UID]; busy {
		d.mu.Unlock()
		return nil // a sandbox is preparing it: it is used again
	}
	c, ok := d.registry.Claim(c.UID)
	if !ok || len(c.PodUIDs) > 0 {
		d.mu.Unlock()
		return nil
	}
	op := &claimOp{done: make(chan struct{}), unprepare: c.PreparedBy != registry.PreparedByKubelet}
	d.busy[c.UID] = op
	d.mu.Unlock()
	defer func() {
		d.mu.Lock()
		close(op.done)
		delete(d.busy, c.UID)
		d.mu.Unlock()
	}()
	logger := klog.FromContext(ctx)
	if c.PreparedBy == registry.PreparedByKubelet {
		// The kubelet unprepares what it prepared, once its own pods are gone.
		d.unprepared.WithLabelValues("kubelet").Inc()
		logger.V(2).Info("Forgot claim the kubelet prepared", "claim", klog.KRef(c.Namespace, c.Name))
		d.claims.Forget(c.Namespace, c.Name)
		return d.registry.ClaimUnprepared(c.UID)
	}
	claim := dra.Claim{Namespace: c.Namespace, Name: c.Name, UID: c.UID}
	var errs []error
	for _, name := range c.Drivers {
		drv, err := d.drivers.Lookup(name)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if _, err := drv.Unprepare(ctx, []dra.Claim{claim}); err != nil {
			errs = append(errs, err)
			continue
		}
		logger.Info("Unprepared claim", "claim", klog.KRef(c.Namespace, c.Name), "driver", name)
	}
	if err := errors.Join(errs...); err != nil {
		// A driver may have torn part of the claim down: a pod that took it up meanwhile
		// must not find it prepared.
		return errors.Join(err, d.registry.ClaimUnprepareFailed(c.UID))
	}
	d.unprepared.WithLabelValues("unprepared").Inc()
	d.claims.Forget(c.Namespace, c.Name)
	return d.registry.ClaimUnprepared(c.UID)
}

// releaseRetry is when a failed release of a pod's claims is tried again.
type releaseRetry struct {
	next    time.Time
	backoff time.Duration
}

// due reports whether the pod's release may be tried now.
func (d *Manager) due(uid types.UID) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	r, ok := d.retry[uid]
	return !ok || !d.now().Before(r.next)
}

// failed records a failed release and returns when it is tried again.
func (d *Manager) failed(uid types.UID) time.Duration {
	d.mu.Lock()
	defer d.mu.Unlock()
	r := d.retry[uid]
	r.backoff = min(max(2*r.backoff, RetryInitial), RetryMax)
	r.next = d.now().Add(r.backoff)
	d.retry[uid] = r
	return r.backoff
}

// podGone reports whether the pod is deleted in the API server and has no running sandbox.
func (d *Manager) podGone(ctx context.Context, ref registry.PodRef) (bool, error) {
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
