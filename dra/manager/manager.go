package manager

import (
	"context"
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

	"github.com/podgate/podgate/cri/pipeline"
	"github.com/podgate/podgate/cri/registry"
	"github.com/podgate/podgate/dra"
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

// Prepare says who prepares a pod's claims. The agent maps its configuration's dra.prepare
// onto it: the configuration's words are the operator's, this is the manager's behaviour.
type Prepare int

// Who prepares a pod's claims.
const (
	// PrepareAlways: podgate, whatever the kubelet does (the default).
	PrepareAlways Prepare = iota
	// PrepareNever: the kubelet; podgate records the devices of the claims' allocation.
	PrepareNever
	// PrepareAuto: the kubelet when it prepares claims (its version) and manages the pod (its
	// PodResources socket knows it), else podgate.
	PrepareAuto
)

// String says who prepares, for the log.
func (p Prepare) String() string {
	switch p {
	case PrepareAlways:
		return "podgate"
	case PrepareNever:
		return "the kubelet"
	case PrepareAuto:
		return "the kubelet where it prepares and manages the pod, else podgate"
	}
	return fmt.Sprintf("Prepare(%d)", int(p))
}

// Manager prepares a pod's DRA claims before its sandbox is created, so that the devices
// exist when containerd runs CNI, and unprepares them once the pod is gone from the API server
// and from the runtime. What it prepares is recorded in its claim store (Claims), a section of
// the pod registry's checkpoint, before any driver is called: a crash never loses the
// obligation to unprepare.
//
// A failure after the prepare stage does not unprepare: the kubelet retries the sandbox, and
// the claims stay prepared until the pod is gone, as with the kubelet's own DRA manager.
type Manager struct {
	pods    Pods
	claims  *dra.ClaimResolver
	drivers *dra.Drivers
	// store holds the claims (their checkpoint section); sandboxes tells which of a pod's
	// sandboxes podgate saw run.
	store     *Claims
	sandboxes registry.PodSandboxLister
	runtime   runtimeapi.RuntimeServiceClient

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

	// mode is who prepares (dra.prepare).
	mode Prepare
	// hookDrivers are the drivers that do their part when the sandbox starts, in a runtime
	// hook (dra.sandboxHookDrivers): each must answer before such a pod's sandbox is forwarded.
	hookDrivers map[string]bool
	// kubeletPrepares tells whether the node's kubelet prepares DRA claims (its version; nil:
	// it does not); kubelet tells whether the kubelet manages a pod (nil: nobody to ask). With
	// mode auto both decide whether the kubelet prepared a pod's claims.
	kubeletPrepares func(ctx context.Context) bool
	kubelet         KubeletPods
}

// Pods is the node's pods as the manager reads them: agent's Kubernetes adapter (the pod
// informer, a GET where it has not seen a pod yet).
type Pods interface {
	// Get returns the pod with this UID if the informer knows it; the pod is the cache's.
	Get(uid types.UID) (*corev1.Pod, bool)
	// GetOrFetch returns the pod, from the API server when the informer has not seen it yet;
	// NotFound when the API server has no such pod (or another pod by that name).
	GetOrFetch(ctx context.Context, uid types.UID, namespace, name string) (*corev1.Pod, error)
	// HasSynced reports whether the informer has listed the node's pods once.
	HasSynced() bool
	// OnDeleted calls fn when a pod of the node is deleted or marked for deletion; fn must
	// not block.
	OnDeleted(fn func(*corev1.Pod))
}

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

// Option configures a Manager.
type Option func(*Manager)

// WithPrepare says who prepares a pod's claims (PrepareAlways, the default; PrepareNever;
// PrepareAuto).
func WithPrepare(mode Prepare) Option { return func(d *Manager) { d.mode = mode } }

// WithSandboxHookDrivers names the drivers that do their part of a device when the pod's
// sandbox starts, in a hook of the runtime's (dranet moves its interfaces in NRI's
// RunPodSandbox): before the sandbox of a pod with a claim of theirs is forwarded, each must
// answer ([dra.Driver.Answers]), whoever prepared the claim, or the sandbox is refused. Without
// it such a driver's death between the prepare and the sandbox goes unnoticed: a claim is
// prepared once per pod, and the runtime starts a sandbox whose hook nobody serves without the
// device (containerd/nri#282).
func WithSandboxHookDrivers(names ...string) Option {
	return func(d *Manager) {
		d.hookDrivers = make(map[string]bool, len(names))
		for _, n := range names {
			d.hookDrivers[n] = true
		}
	}
}

// WithKubelet gives PrepareAuto the kubelet to ask whether it manages a pod. Without it there
// is nobody to ask, and podgate prepares.
func WithKubelet(kubelet KubeletPods) Option { return func(d *Manager) { d.kubelet = kubelet } }

// WithKubeletPrepares tells PrepareAuto whether the node's kubelet prepares DRA claims itself,
// as its version says at the moment of a pod start (agent hands in what it knows of the
// kubelet, reading the Node then if it has not been read yet). Without it, and while it says
// false (an older kubelet, or its version not known), podgate prepares.
func WithKubeletPrepares(prepares func(ctx context.Context) bool) Option {
	return func(d *Manager) { d.kubeletPrepares = prepares }
}

// WithSettle has s settle what is left once rebuilt is closed (the registry is rebuilt from
// the runtime, whose records then say which sandboxes still run), then at every reconcile.
func WithSettle(rebuilt <-chan struct{}, s Settler) Option {
	return func(d *Manager) { d.rebuilt, d.settler = rebuilt, s }
}

// WithHostInterfaces gives prepared network devices their network data (the host interface
// from the driver's ResourceSlice), which PodResources shows a meta-CNI plugin.
func WithHostInterfaces(h *dra.HostInterfaces) Option { return func(d *Manager) { d.hostIfs = h } }

// WithClock replaces time.Now for the unprepare retries' backoff (tests).
func WithClock(now func() time.Time) Option { return func(d *Manager) { d.now = now } }

// WithWaitHook has fn called when a prepare waits for another call's prepare or unprepare of
// a shared claim (tests order the calls by it).
func WithWaitHook(fn func(types.UID)) Option { return func(d *Manager) { d.onWait = fn } }

// New returns the DRA manager: pods looked up in pods, claims resolved by claims, prepared by
// drivers, recorded in store; sandboxes (the pod registry) and rt tell which sandboxes still
// run. Its metrics are registered with r.
func New(pods Pods, drivers *dra.Drivers, claims *dra.ClaimResolver, store *Claims, sandboxes registry.PodSandboxLister, rt runtimeapi.RuntimeServiceClient, r prometheus.Registerer, opts ...Option) *Manager {
	d := &Manager{
		pods: pods, drivers: drivers, claims: claims, store: store, sandboxes: sandboxes, runtime: rt, mode: PrepareAlways,
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
		for _, c := range store.List() {
			if c.Prepared {
				n++
			}
		}
		return float64(n)
	})
	r.MustRegister(d.unprepared, d.decisions, prepared)
	return d
}

// PrepareStage ("dra-prepare") prepares the pod's claims before RunPodSandbox is forwarded.
func (d *Manager) PrepareStage() pipeline.Stage {
	return pipeline.Stage{Name: "dra-prepare", Run: d.prepare, Removed: d.sandboxRemoved,
		Holds: "the DRA drivers prepare the pod's claims", RefusedReason: "FailedDRAPrepare"}
}

func (d *Manager) prepare(ctx context.Context, sb *pipeline.Sandbox) error {
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
	uses := make([]ClaimUse, len(claims))
	containers := SpecContainers(pod)
	for i, c := range claims {
		for _, name := range c.Drivers() {
			drv, err := d.drivers.Lookup(name)
			if err == nil && d.hookDrivers[name] {
				err = drv.Answers(ctx)
			}
			if err != nil {
				return fmt.Errorf("pod %s/%s claim %s/%s: %w", ref.Namespace, ref.Name, c.Namespace, c.Name, err)
			}
		}
		uses[i] = ClaimUse{UID: c.UID, Namespace: c.Namespace, Name: c.Name, PodClaimName: c.PodClaimName, Drivers: c.Drivers()}
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
	if err := d.store.UseClaims(ref, containers, uses); err != nil {
		return err
	}
	by := d.preparer(ctx, ref)
	d.decisions.WithLabelValues(by).Inc()
	if by == PreparedByKubelet {
		klog.FromContext(ctx).V(2).Info("Claims prepared by the kubelet: recording their devices", "claims", len(claims))
	}
	if err := d.prepareOnce(ctx, claims, by); err != nil {
		return fmt.Errorf("pod %s/%s: %w", ref.Namespace, ref.Name, err)
	}
	return nil
}
