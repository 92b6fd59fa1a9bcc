package imagepull

import (
	"context"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/klog/v2"

	"github.com/podgate/podgate/cri"
	"github.com/podgate/podgate/cri/imagepull/progress"
)

// Feature is podgate's image-pull feature: the [Governor] as PullImage's hook, the progress of
// the running pulls (from containerd's content store), the pods' pull Events, and the view of
// the pulls that PodResources' extension serves (PodPulls, each pod's image_pulls). The
// governor is always on: without caps it still shares concurrent pulls of one image and drops
// pulls whose pod is gone.
type Feature struct {
	governor *Governor
	view     *view
	// events tells pods of their pulls; nil without Events (no Kubernetes API).
	events *pullEvents
	prio   Prioritizer
	// poller is asked about the pods whose pulls wait (WithPods with a DeletionPoller); nil
	// otherwise.
	poller       DeletionPoller
	pollInterval time.Duration
}

// Pods is the node's pods from the API server (agent/kube's PodLookup): a pull takes its
// pod's priority, and the pulls of a deleted pod are dropped.
type Pods interface {
	// Get returns the pod with this UID, if known.
	Get(uid types.UID) (*corev1.Pod, bool)
	// OnDeleted calls fn when a pod is deleted (or marked for deletion); fn must not block.
	OnDeleted(fn func(*corev1.Pod))
}

// FeatureOption configures a Feature.
type FeatureOption func(*featureConfig)

type featureConfig struct {
	pods                                       Pods
	sink                                       EventSink
	waitAfter, progressAfter, progressInterval time.Duration
	socket, namespace                          string
	// kubeletCap is the kubelet's cap on pulls in flight (WithKubeletCap); nil: not known.
	kubeletCap *int
	stall      progress.StallRule
	coolDown   CoolDown
	// pollInterval is how often a DeletionPoller is asked (queuedPollInterval; tests shorten it).
	pollInterval time.Duration
}

// withPollInterval asks the DeletionPoller every d in place of queuedPollInterval (tests).
func withPollInterval(d time.Duration) FeatureOption {
	return func(c *featureConfig) { c.pollInterval = d }
}

// keepFetched is how long containerd keeps what it fetched of a stalled pull, or of a running
// pull whose callers all left, for the next pull of the image:
// the kubelet's image back-off reaches its 5-minute cap after a few failures.
const keepFetched = 30 * time.Minute

// WithStall cancels a running pull whose rate, read from containerd's content store, stays
// below minBytesPerSecond over window (imagePulls.stall): its callers get an Unavailable error
// naming the image, the registry, the rate and the minimum, their pods a PullStalled Event, and
// its slot goes to the next pull. The window counts from the first reading of the pull's bytes
// after its backend call started (never the time in podgate's queue) and ends with the last
// blob fetched (unpacking is not measured). It needs pull progress (WithProgress);
// minBytesPerSecond 0 leaves it off, as without the option.
func WithStall(minBytesPerSecond int64, window time.Duration) FeatureOption {
	return func(c *featureConfig) {
		c.stall = progress.StallRule{MinBytesPerSecond: minBytesPerSecond, Window: window}
	}
}

// WithRegistryCoolDown holds the pulls of a registry that pushes back (HTTP 429, or 503 with a
// Retry-After) in podgate's queue for a cool-down, and tries again the pull that met the
// push-back, as c says (imagePulls.coolDown; see [CoolDown]); its pods get a PullThrottled
// Event. Without it, a push-back fails its pull as any other error does.
func WithRegistryCoolDown(c CoolDown) FeatureOption {
	return func(fc *featureConfig) { fc.coolDown = c }
}

// WithPods takes each pull's priority from its pod in the API server when the pod is known
// (the sandbox config otherwise), and drops the pulls of pods deleted meanwhile; when pods is
// also a DeletionPoller, it is asked about the pods whose pulls wait in the queue. Without it,
// priorities come from the sandbox config only and pulls end with their callers.
func WithPods(pods Pods) FeatureOption {
	return func(c *featureConfig) { c.pods = pods }
}

// WithEvents tells pods through Events written to sink: of a pull that waits for a slot longer
// than waitAfter, of a pull that runs longer than progressAfter (again every progressInterval,
// and once more when it ends), of a shared pull and of a pull cancelled because its pod is
// gone. Without it, no Events.
func WithEvents(sink EventSink, waitAfter, progressAfter, progressInterval time.Duration) FeatureOption {
	return func(c *featureConfig) {
		c.sink, c.waitAfter, c.progressAfter, c.progressInterval = sink, waitAfter, progressAfter, progressInterval
	}
}

// WithProgress follows the running pulls' bytes in the content store of the containerd on the
// unix socket path, in its namespace (imagePulls.containerdAddress, containerdNamespace). An
// empty socket leaves pull progress off, as without the option.
func WithProgress(socket, namespace string) FeatureOption {
	return func(c *featureConfig) { c.socket, c.namespace = socket, namespace }
}

// NewFeature builds the image-pull feature: a governor under limits, whose pulls take the
// priority the sandbox config claims (fallback) unless WithPods knows their pod; its metrics,
// and the progress tracker's, are registered with reg. Each part is built from the ones before
// it: the tracker (containerd's content store), the Events (which read the tracker), the
// governor (which tells the Events and asks the tracker to keep what a cancelled pull fetched),
// the view of all three. The tracker and the Events follow the governor's pulls as Run gives
// them the view.
func NewFeature(ctx context.Context, limits Limits, fallback SandboxPriority, reg prometheus.Registerer, opts ...FeatureOption) (*Feature, error) {
	c := featureConfig{pollInterval: queuedPollInterval}
	for _, o := range opts {
		o(&c)
	}
	logger := klog.FromContext(ctx)
	t, err := newTracker(logger, c, reg)
	if err != nil {
		return nil, err
	}
	gopts := []Option{WithRegisterer(reg), WithCoolDown(c.coolDown)}
	if t != nil {
		gopts = append(gopts, WithKeep(keeper{ctx: ctx, tracker: t}.keep))
	}
	var events *pullEvents
	if c.sink != nil {
		events = newPullEvents(t, c.sink, c.waitAfter, c.progressAfter, c.progressInterval)
		gopts = append(gopts, WithObserver(events))
	}
	g := New(limits, gopts...)
	if c.kubeletCap != nil {
		registerKubeletCap(reg, limits, *c.kubeletCap)
	}
	if c.pods != nil {
		c.pods.OnDeleted(func(pod *corev1.Pod) { g.PodDeleted(string(pod.UID)) })
	}
	poller, _ := c.pods.(DeletionPoller) // nil without pods, or pods that cannot be asked
	return &Feature{governor: g, view: newView(g, t, c.stall), events: events, prio: podPriority(c.pods, fallback),
		poller: poller, pollInterval: c.pollInterval}, nil
}

// newTracker is the tracker of the pulls' progress in containerd's content store, measuring
// them against the stall rule; nil when pull progress is off (no socket).
func newTracker(logger klog.Logger, c featureConfig, reg prometheus.Registerer) (*progress.Tracker, error) {
	if c.socket == "" {
		logger.Info("Image pull progress off: imagePulls.containerdAddress is empty")
		if c.stall.On() {
			logger.Info("Stalled image pulls are not found: imagePulls.stall needs pull progress (imagePulls.containerdAddress)")
		}
		return nil, nil
	}
	t, err := progress.New(c.socket, progress.WithNamespace(c.namespace), progress.WithRegisterer(reg), progress.WithStall(c.stall))
	if err != nil {
		return nil, err
	}
	logger.Info("Image pull progress on: reading containerd's content store", "socket", c.socket, "namespace", c.namespace,
		"stallMinBytesPerSecond", c.stall.MinBytesPerSecond, "stallWindow", c.stall.Window)
	return t, nil
}

// keeper keeps what containerd fetched of a running pull whose pods are gone, for the
// kubelet's next pull of the image (another pod's, or the same pod's after a restart), which
// then fetches only what is missing.
type keeper struct {
	ctx     context.Context
	tracker *progress.Tracker
}

func (k keeper) keep(image string) {
	if err := k.tracker.Keep(k.ctx, image, keepFetched); err != nil {
		klog.FromContext(k.ctx).Info("Cannot keep what containerd fetched of a cancelled pull; a later pull fetches it again", "image", image, "err", err)
	}
}

// Interceptor is the feature's PullImage hook: the governor, with each pull's priority.
func (f *Feature) Interceptor() cri.Interceptor[*runtimeapi.PullImageRequest, *runtimeapi.PullImageResponse] {
	return f.governor.Interceptor(f.prio)
}

// Run follows the pulls' progress, tells pods of their pulls and asks the DeletionPoller about
// the pods whose pulls wait, until ctx ends; it returns at once when all three are off.
func (f *Feature) Run(ctx context.Context) {
	var running sync.WaitGroup
	if f.poller != nil {
		running.Go(func() { f.pollQueued(ctx, f.poller, f.pollInterval) })
	}
	if f.events != nil {
		running.Go(func() { f.events.run(ctx, f.view) })
	}
	if f.view.progress != nil {
		running.Go(func() { f.view.progress.Run(ctx, f.view) })
	}
	running.Wait()
}

// Close closes the connection to containerd's content store, if pull progress is on.
func (f *Feature) Close() {
	if f.view.progress != nil {
		_ = f.view.progress.Close() // closing a client connection has nothing to report
	}
}

// podPriority takes a pull's priority from its pod in the API server when podgate knows the
// pod, and from the sandbox config otherwise.
func podPriority(pods Pods, fallback SandboxPriority) Prioritizer {
	return func(_ context.Context, req *runtimeapi.PullImageRequest) Priority {
		uid := req.GetSandboxConfig().GetMetadata().GetUid()
		if pods != nil && uid != "" {
			if pod, ok := pods.Get(types.UID(uid)); ok {
				return PriorityOf(pod.Spec.PriorityClassName, pod.Spec.Priority)
			}
		}
		return fallback.Of(req.GetSandboxConfig())
	}
}
