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
// and the progress tracker's, are registered with reg.
func NewFeature(ctx context.Context, limits Limits, fallback SandboxPriority, reg prometheus.Registerer, opts ...FeatureOption) (*Feature, error) {
	var c featureConfig
	for _, o := range opts {
		o(&c)
	}
	// The view needs the governor, the governor the Events as its observer, the Events the
	// view: the view is completed below, before anything reads it.
	v := &view{}
	f := &Feature{view: v, prio: podPriority(c.pods, fallback)}
	gopts := []Option{WithRegisterer(reg)}
	logger := klog.FromContext(ctx)
	var t *progress.Tracker // set below, before its first poll and before any pull runs
	if c.socket != "" {
		gopts = append(gopts, WithKeep(func(image string) {
			// A running pull whose pods are gone: the kubelet's next pull of the image
			// (another pod's, or the same pod's after a restart) fetches only what is missing.
			if err := t.Keep(ctx, image, keepFetched); err != nil {
				logger.Info("Cannot keep what containerd fetched of a cancelled pull; a later pull fetches it again", "image", image, "err", err)
			}
		}))
	}
	if c.sink != nil {
		f.events = newPullEvents(v, c.sink, c.waitAfter, c.progressAfter, c.progressInterval)
		gopts = append(gopts, WithObserver(f.events))
	}
	f.governor = New(limits, gopts...)
	if c.kubeletCap != nil {
		registerKubeletCap(reg, limits, *c.kubeletCap)
	}
	v.governor = f.governor
	if c.socket != "" {
		popts := []progress.Option{progress.WithNamespace(c.namespace), progress.WithRegisterer(reg)}
		if c.stall.On() {
			g, rule := f.governor, c.stall
			popts = append(popts, progress.WithStall(rule, func(r progress.Running, p progress.Progress) {
				// What containerd fetched must outlive the cancelled pull's lease.
				if err := t.Keep(ctx, r.Image, keepFetched); err != nil {
					logger.Info("Cannot keep what containerd fetched of a stalled pull; the retry fetches it again", "image", r.Image, "err", err)
				}
				g.Stall(r.Image, r.Started, p.Stall.Rate, rule)
			}))
			v.stall = rule
		}
		var err error
		if t, err = progress.New(c.socket, v.running, popts...); err != nil {
			return nil, err
		}
		v.progress = t
		logger.Info("Image pull progress on: reading containerd's content store", "socket", c.socket, "namespace", c.namespace,
			"stallMinBytesPerSecond", v.stall.MinBytesPerSecond, "stallWindow", v.stall.Window)
	} else {
		logger.Info("Image pull progress off: imagePulls.containerdAddress is empty")
		if c.stall.On() {
			logger.Info("Stalled image pulls are not found: imagePulls.stall needs pull progress (imagePulls.containerdAddress)")
		}
	}
	if c.pods != nil {
		g := f.governor
		c.pods.OnDeleted(func(pod *corev1.Pod) { g.PodDeleted(string(pod.UID)) })
		if p, ok := c.pods.(DeletionPoller); ok {
			f.poller, f.pollInterval = p, queuedPollInterval
		}
	}
	return f, nil
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
		running.Go(func() { f.events.run(ctx) })
	}
	if f.view.progress != nil {
		running.Go(func() { f.view.progress.Run(ctx) })
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
