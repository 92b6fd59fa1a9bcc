package agent

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"time"

	kubeletconfig "k8s.io/kubelet/config/v1beta1"

	"github.com/containerd/errdefs"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/klog/v2"

	"github.com/podgate/podgate/agent/config"
	"github.com/podgate/podgate/agent/kube"
	"github.com/podgate/podgate/agent/registry"
	"github.com/podgate/podgate/cri"
	"github.com/podgate/podgate/pipeline"
	"github.com/podgate/podgate/resources/cgroup"
)

// resourceStages do memory QoS on CreateContainer and UpdateContainerResources, and check
// after StartContainer and UpdateContainerResources that the container's cgroup holds what was
// asked. The check after StartContainer runs in the background: the answer is not delayed.
type resourceStages struct {
	node      cgroup.Node
	memoryQoS bool   // on: configured, and applicable on this node
	qosOff    string // why memory QoS is off, when configured but not applicable
	factor    float64
	policy    kubeletconfig.MemoryReservationPolicy
	verify    string // ResourcesVerifyWarn or ResourcesVerifyFail
	recheck   time.Duration
	pods      *kube.PodLookup
	runtime   runtimeapi.RuntimeServiceClient
	// allocatable is the node's allocatable memory, the ceiling of memory.high for a container
	// without a limit (resolveAllocatable sets it; 0: unknown).
	allocatable atomic.Int64
	pageSize    int64
	// containers are in the pod registry, with their sandboxes.
	containers *registry.Registry
	background *pipeline.Background
	// quiet waits until the CRI server has served no call for a moment; nil: no wait.
	quiet func(context.Context) error

	verifications *prometheus.CounterVec
	qosApplied    prometheus.Counter
	verifyTime    prometheus.Histogram
	// ownTime is podgate's own time in a call, the runtime's left out: what it adds.
	ownTime *prometheus.HistogramVec
}

func newResourceStages(cfg config.Resources, node cgroup.Node, pods *kube.PodLookup, reg *registry.Registry, rt runtimeapi.RuntimeServiceClient, r prometheus.Registerer) *resourceStages {
	s := &resourceStages{
		node: node, factor: cfg.MemoryThrottlingFactor, policy: cfg.MemoryReservationPolicy, verify: cfg.Verify,
		recheck: cfg.RecheckPeriod.Duration, pods: pods, runtime: rt,
		pageSize: int64(os.Getpagesize()), containers: reg,
		background: pipeline.NewBackground("cgroup verifications"),
		verifications: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "podgate", Subsystem: "resources", Name: "verifications_total",
			Help: "Containers' cgroups read back and compared with what was asked, by when (start, update) and result (ok, mismatch, error).",
		}, []string{"after", "result"}),
		qosApplied: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "podgate", Subsystem: "resources", Name: "memory_qos_applied_total",
			Help: "CreateContainer and UpdateContainerResources calls to which podgate added memory QoS (memory.min/memory.low, memory.high) as the kubelet computes it.",
		}),
		ownTime: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "podgate", Subsystem: "resources", Name: "stage_duration_seconds",
			Help:    "podgate's own time in CreateContainer and UpdateContainerResources (memory QoS, bookkeeping, the check with verify: fail), the runtime's left out.",
			Buckets: prometheus.ExponentialBuckets(0.00001, 2, 16),
		}, []string{"method"}),
		verifyTime: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "podgate", Subsystem: "resources", Name: "verification_duration_seconds",
			Help:    "Time to read a container's cgroup back and compare it, status call included.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 14),
		}),
	}
	switch {
	case !cfg.MemoryQoS:
	case !node.MemoryQoS:
		s.qosOff = node.MemoryQoSReason
	case pods == nil:
		s.qosOff = "no Kubernetes API: the containers' memory requests are in the pods"
	default:
		s.memoryQoS = true
	}
	info := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: "podgate", Subsystem: "resources", Name: "cgroup_info",
		Help: "The node's cgroup mode, and whether podgate's memory QoS is on; always 1.",
	}, []string{"mode", "memory_qos"})
	info.WithLabelValues(node.Mode, fmt.Sprint(s.memoryQoS)).Set(1)
	r.MustRegister(s.verifications, s.qosApplied, s.verifyTime, s.ownTime, info)
	return s
}

// logNode says once what podgate can do with this node's cgroups.
func (s *resourceStages) logNode(logger klog.Logger) {
	kv := []any{"mode", s.node.Mode, "v2Controllers", s.node.V2Controllers, "memoryQoS", s.memoryQoS}
	if s.qosOff != "" {
		kv = append(kv, "memoryQoSNotApplicable", s.qosOff)
	}
	logger.Info("Cgroups", kv...)
}

func (s *resourceStages) createContainer(ctx context.Context, req *runtimeapi.CreateContainerRequest, next cri.Forward[*runtimeapi.CreateContainerRequest, *runtimeapi.CreateContainerResponse]) (*runtimeapi.CreateContainerResponse, error) {
	t := s.startTimer("CreateContainer")
	defer t.done()
	next = timed(t, next)
	md := req.GetSandboxConfig().GetMetadata()
	uid, name := types.UID(md.GetUid()), req.GetConfig().GetMetadata().GetName()
	if res := req.GetConfig().GetLinux().GetResources(); res != nil && s.memoryQoS {
		if err := s.applyMemoryQoS(ctx, uid, name, res); err != nil {
			return nil, err
		}
	}
	resp, err := next(ctx, req)
	if err != nil {
		return resp, err
	}
	id := resp.GetContainerId()
	s.containers.AddContainer(registry.ContainerRecord{
		ID: id, Name: name, SandboxID: req.GetPodSandboxId(), PodUID: uid, Origin: registry.OriginStarted,
		Asked:        cgroup.SpecResources(req.GetConfig().GetLinux().GetResources()),
		CgroupsPath:  registry.ContainerdCgroupsPath(req.GetSandboxConfig().GetLinux().GetCgroupParent(), id),
		Verification: registry.CgroupPending,
	})
	return resp, nil
}

// applyMemoryQoS adds the container's memory QoS to res.Unified as the kubelet 1.36 computes
// it (cgroup.MemoryQoS), from the container's request and limit and the pod's QoS class in the
// pod, and the node's allocatable memory for a container without a limit.
func (s *resourceStages) applyMemoryQoS(ctx context.Context, uid types.UID, container string, res *runtimeapi.LinuxContainerResources) error {
	pod, ok := s.pods.Get(uid)
	if !ok {
		klog.FromContext(ctx).V(2).Info("Memory QoS skipped: the pod is not in the informer yet", "podUID", uid, "container", container)
		return nil
	}
	c, ok := podContainer(pod, container)
	if !ok {
		klog.FromContext(ctx).V(2).Info("Memory QoS skipped: no such container in the pod", "pod", klog.KObj(pod), "container", container)
		return nil
	}
	v, err := cgroup.MemoryQoS(cgroup.MemoryQoSInput{
		Request:         c.Resources.Requests.Memory().Value(),
		Limit:           c.Resources.Limits.Memory().Value(),
		QOSClass:        pod.Status.QOSClass,
		NodeAllocatable: s.allocatable.Load(),
		Factor:          s.factor,
		Policy:          s.policy,
		PageSize:        s.pageSize,
	})
	if err != nil {
		return fmt.Errorf("container %q memory QoS: %w", container, err)
	}
	if unified, changed := v.AddTo(res.GetUnified()); changed {
		res.Unified = unified
		s.qosApplied.Inc()
	}
	return nil
}

// podContainer is the pod's container by name (init containers too).
func podContainer(pod *corev1.Pod, name string) (*corev1.Container, bool) {
	for _, list := range [][]corev1.Container{pod.Spec.Containers, pod.Spec.InitContainers} {
		for i := range list {
			if list[i].Name == name {
				return &list[i], true
			}
		}
	}
	return nil, false
}

// resolveAllocatable finds the node's allocatable memory from the best source at hand (the
// kubelet's configuration file, the Node object when given, MemTotal) and says which it used.
func (s *resourceStages) resolveAllocatable(ctx context.Context, kubeletConfig string, node *corev1.Node) {
	logger := klog.FromContext(ctx)
	var src cgroup.NodeMemorySources
	if kubeletConfig != "" {
		kc, err := cgroup.ReadKubeletConfig(kubeletConfig)
		if err != nil {
			logger.Error(err, "Read the kubelet's configuration for its allocatable memory", "path", kubeletConfig)
		}
		src.KubeletConfig = kc
	}
	if src.KubeletConfig == nil {
		src.Node = node
	}
	mt, err := cgroup.ReadMemTotal(cgroup.MeminfoPath)
	if err != nil {
		logger.Info("Node allocatable memory: MemTotal could not be read", "err", err)
	}
	src.MemTotal = mt
	nm := cgroup.NodeAllocatable(src)
	s.allocatable.Store(nm.Bytes)
	logger.Info("Node allocatable memory", nm.KeysAndValues()...)
}

func (s *resourceStages) startContainer(ctx context.Context, req *runtimeapi.StartContainerRequest, next cri.Forward[*runtimeapi.StartContainerRequest, *runtimeapi.StartContainerResponse]) (*runtimeapi.StartContainerResponse, error) {
	resp, err := next(ctx, req)
	if err != nil {
		return resp, err
	}
	id := req.GetContainerId()
	// Off the hot path: the kubelet's StartContainer is not delayed by the check, nor its
	// next call (ContainerStatus) met by it.
	bctx := context.WithoutCancel(ctx)
	s.background.Go(func() {
		if s.quiet != nil {
			_ = s.quiet(bctx) // bctx does not end, and the wait is bounded
		}
		_ = s.verifyContainer(bctx, id, "start")
	})
	return resp, nil
}

func (s *resourceStages) updateContainerResources(ctx context.Context, req *runtimeapi.UpdateContainerResourcesRequest, next cri.Forward[*runtimeapi.UpdateContainerResourcesRequest, *runtimeapi.UpdateContainerResourcesResponse]) (*runtimeapi.UpdateContainerResourcesResponse, error) {
	t := s.startTimer("UpdateContainerResources")
	defer t.done()
	next = timed(t, next)
	id := req.GetContainerId()
	rec, known := s.containers.Container(id)
	if res := req.GetLinux(); res != nil && s.memoryQoS && known {
		if err := s.applyMemoryQoS(ctx, rec.PodUID, rec.Name, res); err != nil {
			return nil, err
		}
	}
	resp, err := next(ctx, req)
	if err != nil || req.GetLinux() == nil {
		return resp, err
	}
	asked := cgroup.SpecResources(req.GetLinux())
	if !s.containers.UpdateContainer(id, func(c *registry.ContainerRecord) { c.Asked = asked }) {
		// Not rebuilt yet (podgate just started), or not a container of the runtime's own
		// listing: learnt of here; the next rebuild or recheck corrects what is missing.
		s.containers.AddContainer(registry.ContainerRecord{ID: id, Origin: registry.OriginAdopted, Asked: asked, Verification: registry.CgroupUnverified})
	}
	if s.verify != config.ResourcesVerifyFail {
		bctx := context.WithoutCancel(ctx)
		s.background.Go(func() { _ = s.verifyContainer(bctx, id, "update") })
		return resp, nil
	}
	if err := s.verifyContainer(ctx, id, "update"); err != nil {
		return nil, err
	}
	return resp, nil
}

func (s *resourceStages) removeContainer(ctx context.Context, req *runtimeapi.RemoveContainerRequest, next cri.Forward[*runtimeapi.RemoveContainerRequest, *runtimeapi.RemoveContainerResponse]) (*runtimeapi.RemoveContainerResponse, error) {
	resp, err := next(ctx, req)
	if err == nil || errdefs.IsNotFound(err) {
		s.containers.RemoveContainer(req.GetContainerId())
	}
	return resp, err
}

// verifyContainer reads the container's cgroup and compares it with what was asked. It
// returns an error only for a mismatch (the fail policy's answer to the kubelet); a cgroup
// that cannot be read is recorded and logged, not returned.
func (s *resourceStages) verifyContainer(ctx context.Context, id, after string) (err error) {
	start := time.Now()
	defer func() { s.verifyTime.Observe(time.Since(start).Seconds()) }()
	ctx, span := pipeline.StartSpan(ctx, "cgroup verification", attribute.String("containerID", id), attribute.String("after", after))
	defer func() { pipeline.EndSpan(span, err) }()
	logger := klog.FromContext(ctx).WithValues("containerID", id)
	rec, ok := s.containers.Container(id)
	if !ok {
		return nil // removed meanwhile
	}
	asked, path := rec.Asked, rec.CgroupsPath
	if path == "" {
		var err error
		if path, err = s.cgroupsPath(ctx, id); err != nil {
			if status.Code(err) == codes.NotFound {
				// Removed behind podgate's back (straight at the runtime): forget it, or it
				// would be read again every recheck period.
				s.containers.RemoveContainer(id)
				logger.V(2).Info("Container gone from the runtime: forgotten", "after", after)
				return nil
			}
			if s.record(id, after, nil, nil, err) {
				logger.Info("Cannot verify the container's cgroup", "after", after, "err", err)
			}
			return nil
		}
	}
	held, err := cgroup.Read(ctx, path, cgroup.ForResources(asked))
	if err != nil && rec.CgroupsPath != "" {
		// The path taken from the request may not be the runtime's (another runtime than
		// containerd): ask the runtime, once, and read again where it says.
		if rt, rerr := s.cgroupsPath(ctx, id); rerr == nil && rt != path {
			path = rt
			held, err = cgroup.Read(ctx, path, cgroup.ForResources(asked))
		}
	}
	if err != nil {
		if s.record(id, after, nil, nil, err) {
			logger.Info("Cannot read the container's cgroup", "after", after, "cgroupsPath", path, "err", err)
		}
		return nil
	}
	mismatches := cgroup.Compare(asked, held)
	changed := s.record(id, after, held, mismatches, nil)
	if len(mismatches) == 0 {
		if changed {
			logger.V(2).Info("Container's cgroup holds what was asked", "after", after)
		}
		return nil
	}
	var list []string
	for _, m := range mismatches {
		list = append(list, m.String())
	}
	if changed {
		logger.Info("Container's cgroup does not hold what was asked", "after", after, "cgroupsPath", path, "mismatches", list)
	}
	return errdefs.ErrFailedPrecondition.WithMessage(fmt.Sprintf("container %s: its cgroup does not hold what was asked: %v", id, list))
}

// record stores a verification's result. It reports whether it is news worth a log line: the
// check follows a CRI call, or a recheck found the result changed (a recheck repeating the
// last result stays quiet).
func (s *resourceStages) record(id, after string, held *cgroup.Held, mismatches []cgroup.Mismatch, err error) bool {
	result := registry.CgroupOK
	switch {
	case err != nil:
		result = registry.CgroupError
	case len(mismatches) > 0:
		result = registry.CgroupMismatch
	}
	s.verifications.WithLabelValues(after, result).Inc()
	news := false
	s.containers.UpdateContainer(id, func(c *registry.ContainerRecord) {
		prev := c.Verification + "|" + strings.Join(c.Mismatches, ";") + "|" + c.Error
		c.Verification, c.Held, c.Mismatches, c.Error, c.VerifiedAt = result, held, nil, "", time.Now()
		for _, m := range mismatches {
			c.Mismatches = append(c.Mismatches, m.String())
		}
		if err != nil {
			c.Error = err.Error()
		}
		news = after != "recheck" || prev != c.Verification+"|"+strings.Join(c.Mismatches, ";")+"|"+c.Error
	})
	return news
}

// stageTimer measures podgate's own time in a call: the whole call less the runtime's part.
type stageTimer struct {
	start   time.Time
	runtime time.Duration
	obs     prometheus.Observer
}

func (s *resourceStages) startTimer(method string) *stageTimer {
	return &stageTimer{start: time.Now(), obs: s.ownTime.WithLabelValues(method)}
}

func (t *stageTimer) done() { t.obs.Observe((time.Since(t.start) - t.runtime).Seconds()) }

// timed wraps next so that the time it takes is the runtime's, not podgate's.
func timed[Req, Resp any](t *stageTimer, next func(context.Context, Req) (Resp, error)) func(context.Context, Req) (Resp, error) {
	return func(ctx context.Context, req Req) (Resp, error) {
		start := time.Now()
		defer func() { t.runtime += time.Since(start) }()
		return next(ctx, req)
	}
}

// cgroupsPath reads the container's linux.cgroupsPath from its runtime spec, and remembers it.
func (s *resourceStages) cgroupsPath(ctx context.Context, id string) (string, error) {
	path, err := registry.ContainerCgroupsPath(ctx, s.runtime, id)
	if err != nil {
		return "", err
	}
	s.containers.UpdateContainer(id, func(c *registry.ContainerRecord) { c.CgroupsPath = path })
	return path, nil
}

// run reads every known container's cgroup again each recheck period, until ctx ends: a
// change made behind the runtime's back shows as a mismatch.
func (s *resourceStages) run(ctx context.Context) {
	if s.recheck <= 0 {
		return
	}
	t := time.NewTicker(s.recheck)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		// Started (checked once already, or found running at start-up), not pending.
		for _, c := range s.containers.Containers(func(c *registry.ContainerRecord) bool { return c.Verification != registry.CgroupPending }) {
			_ = s.verifyContainer(ctx, c.ID, "recheck") // recorded and logged there
		}
	}
}

// wait waits for the background verifications, until ctx ends (shutdown, tests).
func (s *resourceStages) wait(ctx context.Context) error { return s.background.Wait(ctx) }
