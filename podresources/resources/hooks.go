package resources

import (
	"context"
	"fmt"
	"os"
	"sync/atomic"
	"time"

	"github.com/containerd/errdefs"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/klog/v2"
	kubeletconfig "k8s.io/kubelet/config/v1beta1"

	"github.com/podgate/podgate/cri"
	"github.com/podgate/podgate/cri/pipeline"
	"github.com/podgate/podgate/cri/registry"
	"github.com/podgate/podgate/podresources/cgroup"
)

// Config is the feature's part of podgate's configuration (its resources section), as plain
// values: the feature does not read the configuration file's types.
type Config struct {
	// MemoryQoS asks for memory QoS; it is on only where the node and the Kubernetes API allow.
	MemoryQoS bool
	// MemoryThrottlingFactor and MemoryReservationPolicy are the kubelet's settings of the
	// same names, which memory QoS computes with.
	MemoryThrottlingFactor  float64
	MemoryReservationPolicy kubeletconfig.MemoryReservationPolicy
	// VerifyFail fails an UpdateContainerResources whose cgroup does not hold what was asked
	// (verify: fail); off, a mismatch is only reported (verify: warn).
	VerifyFail bool
	// RecheckPeriod is how often every known container's cgroup is read again; 0: never.
	RecheckPeriod time.Duration
}

// Hooks do memory QoS on CreateContainer and UpdateContainerResources, and check after
// StartContainer and UpdateContainerResources that the container's cgroup holds what was
// asked. The check after StartContainer runs in the background: the answer is not delayed.
type Hooks struct {
	node       cgroup.Node
	memoryQoS  bool   // on: configured, and applicable on this node
	qosOff     string // why memory QoS is off, when configured but not applicable
	factor     float64
	policy     kubeletconfig.MemoryReservationPolicy
	verifyFail bool
	recheck    time.Duration
	pods       Pods
	// kubeletQoS tells whether the kubelet writes memory QoS itself; nil: it is not known to.
	kubeletQoS func() bool
	runtime    runtimeapi.RuntimeServiceClient
	// allocatable is the node's allocatable memory, the ceiling of memory.high for a container
	// without a limit (ResolveAllocatable sets it; 0: unknown).
	allocatable atomic.Int64
	pageSize    int64
	// containers are in the pod registry, with their sandboxes; records are what the feature
	// knows of their resources.
	containers *registry.Registry
	records    *containers
	background *pipeline.Background
	// quiet waits until the CRI server has served no call for a moment; nil: no wait.
	quiet func(context.Context) error

	// podLevel are the sandboxes' pod cgroups (pod-level resources).
	podLevel podLevels

	verifications    *prometheus.CounterVec
	podVerifications *prometheus.CounterVec
	qosApplied       prometheus.Counter
	verifyTime       prometheus.Histogram
	// ownTime is podgate's own time in a call, the runtime's left out: what it adds.
	ownTime *prometheus.HistogramVec
}

// Pods is the node's pods as memory QoS reads them (agent's Kubernetes adapter): the
// containers' memory requests and limits, the pod's QoS class.
type Pods interface {
	// Get returns the pod with this UID, if known; the pod is the caller's to read only.
	Get(uid types.UID) (*corev1.Pod, bool)
}

// Option configures Hooks.
type Option func(*Hooks)

// WithPods gives memory QoS the node's pods, where the containers' memory requests and the
// pods' QoS classes are (without it: no Kubernetes API, and memory QoS is off).
func WithPods(pods Pods) Option {
	return func(s *Hooks) { s.pods = pods }
}

// WithQuiet makes the check after StartContainer wait for quiet first (pipeline.Quiet of the
// CRI server), so that it does not run beside the kubelet's next calls; without it, it does
// not wait.
func WithQuiet(quiet func(context.Context) error) Option {
	return func(s *Hooks) { s.quiet = quiet }
}

// WithKubeletMemoryQoS tells whether the node's kubelet writes memory.min/memory.low and
// memory.high itself (its MemoryQoS feature gate on, on cgroup v2), asked at each call: the
// kubelet's version, which decides the gate's default, may be learnt after start-up. While it
// does, CreateContainer and UpdateContainerResources leave memory QoS to the kubelet — one
// writer — and the container's cgroup is still verified against the kubelet's values, which
// the request carries. Without it podgate writes memory QoS when it is on, leaving alone a
// request the kubelet already gave memory.min or memory.low.
func WithKubeletMemoryQoS(writes func() bool) Option {
	return func(s *Hooks) { s.kubeletQoS = writes }
}

// withPageSize computes memory QoS with pages of n bytes in place of the machine's (tests).
func withPageSize(n int64) Option {
	return func(s *Hooks) { s.pageSize = n }
}

// New returns the hooks for a node of these cgroups, recording containers in reg and asking
// rt for a container's cgroups path when its record has none; its metrics are registered
// with r.
func New(cfg Config, node cgroup.Node, reg *registry.Registry, rt runtimeapi.RuntimeServiceClient, r prometheus.Registerer, opts ...Option) *Hooks {
	s := &Hooks{
		node: node, factor: cfg.MemoryThrottlingFactor, policy: cfg.MemoryReservationPolicy, verifyFail: cfg.VerifyFail,
		recheck: cfg.RecheckPeriod, runtime: rt,
		pageSize: int64(os.Getpagesize()), containers: reg, records: newContainers(),
		background: pipeline.NewBackground("cgroup verifications"),
		podLevel:   podLevels{bySandbox: map[string]*podLevel{}},
		verifications: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "podgate", Subsystem: "resources", Name: "verifications_total",
			Help: "Containers' cgroups read back and compared with what was asked, by when (start, update) and result (ok, mismatch, error).",
		}, []string{"after", "result"}),
		podVerifications: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "podgate", Subsystem: "resources", Name: "pod_verifications_total",
			Help: "Pods' cgroups (pod-level resources) read back and compared with what the kubelet sent the runtime, by when (update: after an UpdatePodSandboxResources; recheck) and result (ok, mismatch, error).",
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
	for _, o := range opts {
		o(s)
	}
	reg.WatchContainers(s.records)
	s.memoryQoS, s.qosOff = memoryQoSOn(cfg.MemoryQoS, node, s.pods)
	info := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: "podgate", Subsystem: "resources", Name: "cgroup_info",
		Help: "The node's cgroup mode, and whether podgate's memory QoS is on; always 1.",
	}, []string{"mode", "memory_qos"})
	info.WithLabelValues(node.Mode, fmt.Sprint(s.memoryQoS)).Set(1)
	r.MustRegister(s.verifications, s.podVerifications, s.qosApplied, s.verifyTime, s.ownTime, info)
	return s
}

// memoryQoSOn says whether memory QoS is on, and when asked for but off, why.
func memoryQoSOn(asked bool, node cgroup.Node, pods Pods) (on bool, off string) {
	switch {
	case !asked:
		return false, ""
	case !node.MemoryQoS:
		return false, node.MemoryQoSReason
	case pods == nil:
		return false, "no Kubernetes API: the containers' memory requests are in the pods"
	}
	return true, ""
}

// MemoryQoS reports whether memory QoS is on: then CreateContainer and
// UpdateContainerResources change the request, and the node's allocatable memory is needed
// (ResolveAllocatable).
func (s *Hooks) MemoryQoS() bool { return s.memoryQoS }

// writesMemoryQoS tells whether podgate writes memory QoS into this call: it is on, and the
// kubelet does not write it itself.
func (s *Hooks) writesMemoryQoS() bool {
	return s.memoryQoS && (s.kubeletQoS == nil || !s.kubeletQoS())
}

// LogNode says once what podgate can do with this node's cgroups.
func (s *Hooks) LogNode(logger klog.Logger) {
	kv := []any{"mode", s.node.Mode, "v2Controllers", s.node.V2Controllers, "memoryQoS", s.memoryQoS}
	if s.qosOff != "" {
		kv = append(kv, "memoryQoSNotApplicable", s.qosOff)
	}
	logger.Info("Cgroups", kv...)
}

// CreateContainer adds the container's memory QoS to the request, and records the container
// with what it asks for.
func (s *Hooks) CreateContainer(ctx context.Context, req *runtimeapi.CreateContainerRequest, next cri.Forward[*runtimeapi.CreateContainerRequest, *runtimeapi.CreateContainerResponse]) (*runtimeapi.CreateContainerResponse, error) {
	t := s.startTimer("CreateContainer")
	defer t.done()
	next = timed(t, next)
	md := req.GetSandboxConfig().GetMetadata()
	uid, name := types.UID(md.GetUid()), req.GetConfig().GetMetadata().GetName()
	if res := req.GetConfig().GetLinux().GetResources(); res != nil && s.writesMemoryQoS() {
		if err := s.applyMemoryQoS(ctx, uid, name, res); err != nil {
			return nil, err
		}
	}
	resp, err := next(ctx, req)
	if err != nil {
		return resp, err
	}
	id := resp.GetContainerId()
	s.records.set(id, container{asked: cgroup.SpecResources(req.GetConfig().GetLinux().GetResources()), verification: ResultPending})
	s.containers.AddContainer(registry.ContainerRecord{
		ID: id, Name: name, SandboxID: req.GetPodSandboxId(), PodUID: uid, Origin: registry.OriginStarted,
		CgroupsPath: registry.ContainerdCgroupsPath(req.GetSandboxConfig().GetLinux().GetCgroupParent(), id),
	})
	return resp, nil
}

// StartContainer checks the started container's cgroup, after the answer.
func (s *Hooks) StartContainer(ctx context.Context, req *runtimeapi.StartContainerRequest, next cri.Forward[*runtimeapi.StartContainerRequest, *runtimeapi.StartContainerResponse]) (*runtimeapi.StartContainerResponse, error) {
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

// UpdateContainerResources recomputes the container's memory QoS, records what it now asks
// for, and checks its cgroup: in the background, or before the answer with verify: fail.
func (s *Hooks) UpdateContainerResources(ctx context.Context, req *runtimeapi.UpdateContainerResourcesRequest, next cri.Forward[*runtimeapi.UpdateContainerResourcesRequest, *runtimeapi.UpdateContainerResourcesResponse]) (*runtimeapi.UpdateContainerResourcesResponse, error) {
	t := s.startTimer("UpdateContainerResources")
	defer t.done()
	next = timed(t, next)
	id := req.GetContainerId()
	rec, known := s.containers.Container(id)
	if res := req.GetLinux(); res != nil && s.writesMemoryQoS() && known {
		if err := s.applyMemoryQoS(ctx, rec.PodUID, rec.Name, res); err != nil {
			return nil, err
		}
	}
	resp, err := next(ctx, req)
	if err != nil || req.GetLinux() == nil {
		return resp, err
	}
	// The runtime lays the request over what the container asked before: a zero keeps it.
	if !s.records.update(id, func(c *container) { c.asked = cgroup.UpdateSpecResources(c.asked, req.GetLinux()) }) {
		// Not rebuilt yet (podgate just started), or not a container of the runtime's own
		// listing: learnt of here; the next rebuild or recheck corrects what is missing.
		s.records.set(id, container{asked: cgroup.SpecResources(req.GetLinux()), verification: ResultUnverified})
		if !known {
			s.containers.AddContainer(registry.ContainerRecord{ID: id, Origin: registry.OriginAdopted})
		}
	}
	if !s.verifyFail {
		bctx := context.WithoutCancel(ctx)
		s.background.Go(func() { _ = s.verifyContainer(bctx, id, "update") })
		return resp, nil
	}
	if err := s.verifyContainer(ctx, id, "update"); err != nil {
		return nil, err
	}
	return resp, nil
}

// RemoveContainer forgets the container once the runtime has removed it (or has none).
func (s *Hooks) RemoveContainer(ctx context.Context, req *runtimeapi.RemoveContainerRequest, next cri.Forward[*runtimeapi.RemoveContainerRequest, *runtimeapi.RemoveContainerResponse]) (*runtimeapi.RemoveContainerResponse, error) {
	resp, err := next(ctx, req)
	if err == nil || errdefs.IsNotFound(err) {
		s.containers.RemoveContainer(req.GetContainerId())
	}
	return resp, err
}

// stageTimer measures podgate's own time in a call: the whole call less the runtime's part.
type stageTimer struct {
	start   time.Time
	runtime time.Duration
	obs     prometheus.Observer
}

func (s *Hooks) startTimer(method string) *stageTimer {
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
