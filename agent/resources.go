package agent

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/klog/v2"

	"github.com/podgate/podgate/agent/config"
	"github.com/podgate/podgate/agent/kube"
	"github.com/podgate/podgate/agent/registry"
	"github.com/podgate/podgate/cri"
	"github.com/podgate/podgate/podresources/cgroup"
)

// Verification results of a container's cgroup, the result label of
// podgate_resources_verifications_total.
const (
	cgroupPending  = "pending"
	cgroupOK       = "ok"
	cgroupMismatch = "mismatch"
	cgroupError    = "error"
)

// containerRecord is what podgate knows of one container's resources.
type containerRecord struct {
	ID, Name, SandboxID string
	PodUID              types.UID
	// Asked is what the CRI request asked, as the runtime spec says it.
	Asked       *specs.LinuxResources
	CgroupsPath string
	Held        *cgroup.Held
	// Verification is one of the cgroup* results; Mismatches and Error say more.
	Verification string
	Mismatches   []string
	Error        string
	VerifiedAt   time.Time
}

// resourceStages do memory QoS on CreateContainer and UpdateContainerResources, and check
// after StartContainer and UpdateContainerResources that the container's cgroup holds what was
// asked. The check after StartContainer runs in the background: the answer is not delayed.
type resourceStages struct {
	node      cgroup.Node
	memoryQoS bool   // on: configured, and applicable on this node
	qosOff    string // why memory QoS is off, when configured but not applicable
	factor    float64
	verify    string // ResourcesVerifyWarn or ResourcesVerifyFail
	recheck   time.Duration
	pods      *kube.PodLookup
	runtime   runtimeapi.RuntimeServiceClient
	// allocatable is the node's memory, the limit of a container without one.
	allocatable func(ctx context.Context) int64
	pageSize    int64

	mu         sync.Mutex
	containers map[string]*containerRecord
	background backgroundWork

	verifications *prometheus.CounterVec
	qosApplied    prometheus.Counter
	verifyTime    prometheus.Histogram
	// ownTime is podgate's own time in a call, the runtime's left out: what it adds.
	ownTime *prometheus.HistogramVec
}

func newResourceStages(cfg config.Resources, node cgroup.Node, pods *kube.PodLookup, rt runtimeapi.RuntimeServiceClient, r prometheus.Registerer) *resourceStages {
	s := &resourceStages{
		node: node, factor: cfg.MemoryThrottlingFactor, verify: cfg.Verify, recheck: cfg.RecheckPeriod.Duration, pods: pods, runtime: rt,
		pageSize: int64(os.Getpagesize()), containers: map[string]*containerRecord{},
		background:  backgroundWork{name: "cgroup verifications"},
		allocatable: func(context.Context) int64 { return nodeMemory() },
		verifications: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "podgate", Subsystem: "resources", Name: "verifications_total",
			Help: "Containers' cgroups read back and compared with what was asked, by when (start, update) and result (ok, mismatch, error).",
		}, []string{"after", "result"}),
		qosApplied: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "podgate", Subsystem: "resources", Name: "memory_qos_applied_total",
			Help: "CreateContainer and UpdateContainerResources calls to which podgate added memory.min and memory.high.",
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
	s.mu.Lock()
	s.containers[resp.GetContainerId()] = &containerRecord{
		ID: resp.GetContainerId(), Name: name, SandboxID: req.GetPodSandboxId(), PodUID: uid,
		Asked: cgroup.SpecResources(req.GetConfig().GetLinux().GetResources()), Verification: cgroupPending,
	}
	s.mu.Unlock()
	return resp, nil
}

// applyMemoryQoS adds memory.min and memory.high to res.Unified, from the container's memory
// request in its pod and its limit in res (the node's memory when it has none).
func (s *resourceStages) applyMemoryQoS(ctx context.Context, uid types.UID, container string, res *runtimeapi.LinuxContainerResources) error {
	pod, ok := s.pods.Get(uid)
	if !ok {
		klog.FromContext(ctx).V(2).Info("Memory QoS skipped: the pod is not in the informer yet", "podUID", uid, "container", container)
		return nil
	}
	request := memoryRequest(pod, container)
	if request == 0 {
		return nil
	}
	limit := res.GetMemoryLimitInBytes()
	if limit == 0 {
		limit = s.allocatable(ctx)
	}
	unified, changed, err := cgroup.ApplyMemoryQoS(res.GetUnified(), request, limit, s.factor, s.pageSize)
	if err != nil {
		return fmt.Errorf("container %q memory QoS: %w", container, err)
	}
	if changed {
		res.Unified = unified
		s.qosApplied.Inc()
	}
	return nil
}

// memoryRequest is the memory request of the pod's container by name (init containers too).
func memoryRequest(pod *corev1.Pod, name string) int64 {
	for _, list := range [][]corev1.Container{pod.Spec.Containers, pod.Spec.InitContainers} {
		for i := range list {
			if list[i].Name == name {
				if q, ok := list[i].Resources.Requests[corev1.ResourceMemory]; ok {
					return q.Value()
				}
				return 0
			}
		}
	}
	return 0
}

func (s *resourceStages) startContainer(ctx context.Context, req *runtimeapi.StartContainerRequest, next cri.Forward[*runtimeapi.StartContainerRequest, *runtimeapi.StartContainerResponse]) (*runtimeapi.StartContainerResponse, error) {
	resp, err := next(ctx, req)
	if err != nil {
		return resp, err
	}
	id := req.GetContainerId()
	// Off the hot path: the kubelet's StartContainer is not delayed by the check.
	bctx := context.WithoutCancel(ctx)
	s.background.Go(func() { _ = s.verifyContainer(bctx, id, "start") })
	return resp, nil
}

func (s *resourceStages) updateContainerResources(ctx context.Context, req *runtimeapi.UpdateContainerResourcesRequest, next cri.Forward[*runtimeapi.UpdateContainerResourcesRequest, *runtimeapi.UpdateContainerResourcesResponse]) (*runtimeapi.UpdateContainerResourcesResponse, error) {
	t := s.startTimer("UpdateContainerResources")
	defer t.done()
	next = timed(t, next)
	id := req.GetContainerId()
	s.mu.Lock()
	rec := s.containers[id]
	s.mu.Unlock()
	if res := req.GetLinux(); res != nil && s.memoryQoS && rec != nil {
		if err := s.applyMemoryQoS(ctx, rec.PodUID, rec.Name, res); err != nil {
			return nil, err
		}
	}
	resp, err := next(ctx, req)
	if err != nil || req.GetLinux() == nil {
		return resp, err
	}
	asked := cgroup.SpecResources(req.GetLinux())
	s.mu.Lock()
	if rec = s.containers[id]; rec == nil {
		rec = &containerRecord{ID: id} // created before podgate ran: learnt of here
		s.containers[id] = rec
	}
	rec.Asked = asked
	s.mu.Unlock()
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
		s.mu.Lock()
		delete(s.containers, req.GetContainerId())
		s.mu.Unlock()
	}
	return resp, err
}

// verifyContainer reads the container's cgroup and compares it with what was asked. It
// returns an error only for a mismatch (the fail policy's answer to the kubelet); a cgroup
// that cannot be read is recorded and logged, not returned.
func (s *resourceStages) verifyContainer(ctx context.Context, id, after string) error {
	start := time.Now()
	defer func() { s.verifyTime.Observe(time.Since(start).Seconds()) }()
	logger := klog.FromContext(ctx).WithValues("containerID", id)
	s.mu.Lock()
	rec, ok := s.containers[id]
	var asked *specs.LinuxResources
	path := ""
	if ok {
		asked, path = rec.Asked, rec.CgroupsPath
	}
	s.mu.Unlock()
	if !ok {
		return nil // removed meanwhile, or created before podgate ran
	}
	if path == "" {
		var err error
		if path, err = s.cgroupsPath(ctx, id); err != nil {
			if s.record(id, after, nil, nil, err) {
				logger.Info("Cannot verify the container's cgroup", "after", after, "err", err)
			}
			return nil
		}
	}
	held, err := cgroup.Read(ctx, path, cgroup.ForResources(asked))
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
	result := cgroupOK
	switch {
	case err != nil:
		result = cgroupError
	case len(mismatches) > 0:
		result = cgroupMismatch
	}
	s.verifications.WithLabelValues(after, result).Inc()
	s.mu.Lock()
	defer s.mu.Unlock()
	rec, ok := s.containers[id]
	if !ok {
		return false
	}
	prev := rec.Verification + "|" + strings.Join(rec.Mismatches, ";") + "|" + rec.Error
	rec.Verification, rec.Held, rec.Mismatches, rec.Error, rec.VerifiedAt = result, held, nil, "", time.Now()
	for _, m := range mismatches {
		rec.Mismatches = append(rec.Mismatches, m.String())
	}
	if err != nil {
		rec.Error = err.Error()
	}
	return after != "recheck" || prev != rec.Verification+"|"+strings.Join(rec.Mismatches, ";")+"|"+rec.Error
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
	s.mu.Lock()
	if rec, ok := s.containers[id]; ok {
		rec.CgroupsPath = path
	}
	s.mu.Unlock()
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
		s.mu.Lock()
		ids := make([]string, 0, len(s.containers))
		for id, rec := range s.containers {
			if rec.Verification != cgroupPending { // started, and checked once already
				ids = append(ids, id)
			}
		}
		s.mu.Unlock()
		for _, id := range ids {
			_ = s.verifyContainer(ctx, id, "recheck") // recorded and logged there
		}
	}
}

// podContainers returns copies of the records of a pod's containers.
func (s *resourceStages) podContainers(uid types.UID) []containerRecord {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []containerRecord
	for _, rec := range s.containers {
		if rec.PodUID == uid {
			c := *rec
			c.Mismatches = append([]string(nil), rec.Mismatches...)
			out = append(out, c)
		}
	}
	return out
}

// wait waits for the background verifications, until ctx ends (shutdown, tests).
func (s *resourceStages) wait(ctx context.Context) error { return s.background.wait(ctx) }

// nodeMemory is the node's memory, read from /proc/meminfo once: it does not change while
// podgate runs, and CreateContainer should not read a file each time.
var nodeMemory = sync.OnceValue(memTotal)

// memTotal is the node's memory from /proc/meminfo; 0 when it cannot be read (memory QoS
// then skips containers without a limit).
func memTotal() int64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	var kib int64
	for line := range strings.Lines(string(b)) {
		if _, err := fmt.Sscanf(line, "MemTotal: %d kB", &kib); err == nil {
			return kib << 10
		}
	}
	return 0
}
