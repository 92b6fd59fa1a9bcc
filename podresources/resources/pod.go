package resources

import (
	"context"
	"errors"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"go.opentelemetry.io/otel/attribute"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/klog/v2"

	"github.com/podgate/podgate/cri"
	"github.com/podgate/podgate/cri/pipeline"
	"github.com/podgate/podgate/podresources/cgroup"
)

// podLevel is what the feature knows of one sandbox's pod cgroup: the pod-level resources the
// kubelet told the runtime (RunPodSandbox, then each UpdatePodSandboxResources) and the last
// reading of the cgroup. The kubelet, not the runtime, writes the pod cgroup (after the
// runtime's answer): podgate only reads it.
type podLevel struct {
	podUID       types.UID
	cgroupParent string
	// resources are the sandbox's resources without the overhead, overhead the overhead.
	resources, overhead *runtimeapi.LinuxContainerResources
	resizes             uint32

	verification string
	held         *cgroup.Held
	mismatches   []string
	err          string
	verifiedAt   time.Time
}

// podLevels are the pod cgroups of the sandboxes podgate saw start or resize, by sandbox ID.
type podLevels struct {
	mu        sync.Mutex
	bySandbox map[string]*podLevel
}

// get returns a copy of the sandbox's entry.
func (p *podLevels) get(id string) (podLevel, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	e, ok := p.bySandbox[id]
	if !ok {
		return podLevel{}, false
	}
	return *e, true
}

// update changes the sandbox's entry, made with mk when there is none.
func (p *podLevels) update(id string, mk func() *podLevel, fn func(*podLevel)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	e, ok := p.bySandbox[id]
	if !ok {
		if mk == nil {
			return
		}
		e = mk()
		p.bySandbox[id] = e
	}
	fn(e)
}

func (p *podLevels) forget(id string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.bySandbox, id)
}

// verified are the sandboxes whose pod cgroup was read at least once: the rechecks read them
// again.
func (p *podLevels) verified() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var ids []string
	for id, e := range p.bySandbox {
		if e.verification != ResultUnverified {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids
}

// PodStage is the sandbox pipeline's stage that records the pod-level resources the kubelet
// sent with RunPodSandbox (LinuxPodSandboxConfig.resources and overhead), what the PodResources
// extension shows and an UpdatePodSandboxResources changes; it changes nothing and refuses
// nothing. It runs after the forward stage, which gives the sandbox its ID.
func (s *Hooks) PodStage() pipeline.Stage {
	return pipeline.Stage{
		Name: "pod-resources",
		Run: func(_ context.Context, sb *pipeline.Sandbox) error {
			lx := sb.Req.GetConfig().GetLinux()
			if sb.Rec.ID == "" {
				return nil
			}
			e := &podLevel{
				podUID: sb.Rec.Pod.UID, cgroupParent: lx.GetCgroupParent(), verification: ResultUnverified,
				resources: cloneResources(lx.GetResources()), overhead: cloneResources(lx.GetOverhead()),
			}
			s.podLevel.update(sb.Rec.ID, func() *podLevel { return e }, func(*podLevel) {})
			return nil
		},
		Undo:    func(_ context.Context, sb *pipeline.Sandbox) error { s.podLevel.forget(sb.Rec.ID); return nil },
		Removed: func(_ context.Context, id string) error { s.podLevel.forget(id); return nil },
	}
}

// UpdatePodSandboxResources records the pod-level resources of an in-place pod resize and,
// once the CRI calls pause (the kubelet writes the pod cgroup itself after the runtime's
// answer), reads the pod cgroup and compares it with them. It changes neither message, and a
// drift is reported (log, podgate_resources_pod_verifications_total, the PodResources
// extension), never returned: the kubelet has the runtime's answer before its cgroup write,
// so even resources.verify: fail cannot fail the call.
func (s *Hooks) UpdatePodSandboxResources(ctx context.Context, req *runtimeapi.UpdatePodSandboxResourcesRequest, next cri.Forward[*runtimeapi.UpdatePodSandboxResourcesRequest, *runtimeapi.UpdatePodSandboxResourcesResponse]) (*runtimeapi.UpdatePodSandboxResourcesResponse, error) {
	resp, err := next(ctx, req)
	if err != nil && !notImplemented(err) {
		return resp, err // the kubelet rejects the resize
	}
	// A runtime without the call (Unimplemented, or containerd 2.2's Unknown "not implemented
	// yet"): the kubelet resizes the pod cgroup all the same.
	id := req.GetPodSandboxId()
	mk := func() *podLevel {
		rec, _ := s.containers.Sandbox(id) // unknown: an empty parent, reported by the read
		return &podLevel{podUID: rec.Pod.UID, cgroupParent: rec.CgroupParent}
	}
	res, over := cloneResources(req.GetResources()), cloneResources(req.GetOverhead())
	s.podLevel.update(id, mk, func(e *podLevel) {
		e.resources, e.overhead = res, over
		e.resizes++
	})
	bctx := context.WithoutCancel(ctx)
	s.background.Go(func() {
		if s.quiet != nil {
			_ = s.quiet(bctx) // bounded
		}
		s.verifyPod(bctx, id, "update")
	})
	return resp, err
}

// notImplemented tells a runtime's answer that it does not serve a call, as the kubelet 1.37
// tells it (kuberuntime_container.go, updatePodSandboxResources).
func notImplemented(err error) bool {
	st, _ := status.FromError(err)
	return st.Code() == codes.Unimplemented || (st.Code() == codes.Unknown && strings.Contains(st.Message(), "not implemented"))
}

// verifyPod reads the sandbox's pod cgroup and compares it with the pod-level resources the
// kubelet last sent; the result is recorded, counted and, when news, logged.
func (s *Hooks) verifyPod(ctx context.Context, id, after string) {
	ctx, span := pipeline.StartSpan(ctx, "pod cgroup verification", attribute.String("podSandboxID", id), attribute.String("after", after))
	var failed error
	defer func() { pipeline.EndSpan(span, failed) }()
	e, ok := s.podLevel.get(id)
	if !ok {
		return // removed meanwhile
	}
	logger := klog.FromContext(ctx).WithValues("podSandboxID", id, "podUID", e.podUID, "after", after)
	asked := podSpec(e.resources, e.overhead)
	var held *cgroup.Held
	var mismatches []cgroup.Mismatch
	if e.cgroupParent == "" {
		failed = errors.New("the sandbox's cgroup parent is not known")
	} else {
		held, failed = cgroup.Read(ctx, e.cgroupParent, cgroup.ForResources(asked))
	}
	if failed == nil {
		mismatches = cgroup.Compare(asked, held, cgroup.WrittenByKubelet()) // the kubelet writes the pod's cgroup
	}
	news := s.recordPod(id, after, held, mismatches, failed)
	switch {
	case !news:
	case failed != nil:
		logger.Info("Cannot read the pod's cgroup", "cgroupParent", e.cgroupParent, "err", failed)
	case len(mismatches) > 0:
		logger.Info("Pod's cgroup does not hold the pod-level resources asked", "cgroupParent", e.cgroupParent, "mismatches", mismatchStrings(mismatches))
	default:
		logger.V(2).Info("Pod's cgroup holds the pod-level resources asked")
	}
}

// recordPod stores a pod cgroup's verification, and reports whether it is news worth a log
// line (as record does for containers).
func (s *Hooks) recordPod(id, after string, held *cgroup.Held, mismatches []cgroup.Mismatch, err error) bool {
	result := verificationResult(mismatches, err)
	s.podVerifications.WithLabelValues(after, result).Inc()
	news := false
	s.podLevel.update(id, nil, func(e *podLevel) {
		prev := e.verification + "|" + strings.Join(e.mismatches, ";") + "|" + e.err
		e.verification, e.held, e.mismatches, e.err, e.verifiedAt = result, held, mismatchStrings(mismatches), "", time.Now()
		if err != nil {
			e.err = err.Error()
		}
		news = after != "recheck" || prev != e.verification+"|"+strings.Join(e.mismatches, ";")+"|"+e.err
	})
	return news
}

func mismatchStrings(ms []cgroup.Mismatch) []string {
	var out []string
	for _, m := range ms {
		out = append(out, m.String())
	}
	return out
}

// recheckPods reads again the pod cgroups verified once (after a resize), and forgets those
// of sandboxes gone from the pod registry (removed past podgate, or gone at a rebuild).
func (s *Hooks) recheckPods(ctx context.Context) {
	for _, id := range s.podLevel.verified() {
		if _, ok := s.containers.Sandbox(id); !ok {
			s.podLevel.forget(id)
			continue
		}
		s.verifyPod(ctx, id, "recheck")
	}
}

// podSpec is what the kubelet writes into the pod cgroup for these pod-level resources: the
// sandbox's resources and its overhead together (cm.ResourceConfigForPod; the kubelet takes
// the overhead out of what it sends). With a CPU overhead the CPU shares are not compared:
// the kubelet's conversion between shares and milli-CPUs rounds, so their sum may be off by
// one. The kubelet writes neither swap nor, from these fields, hugepages into the pod cgroup.
//
// What the kubelet 1.38 sends for a pod cgroup without a limit (kubelet 1.38.0-beta.0,
// pkg/kubelet/kuberuntime/kuberuntime_manager.go, doPodResizeAction, and helpers_linux.go,
// subtractOverheadFromResourceConfig) is no limit here too:
//
//   - a limit left out (0): RunPodSandbox's, when not every container sets one
//     (kuberuntime_sandbox_linux.go, calculateSandboxResources; kubernetes#141014);
//   - a negative CPU quota: -1 of a pod with exclusive CPUs, whose CFS quota is off, less the
//     overhead's quota when the pod has one (the kubelet subtracts it all the same);
//   - a memory limit read back from the pod cgroup: cgroup v1's unlimited number
//     (cgroup.UnlimitedBytes) or v2's "max" as -1, less the overhead's.
func podSpec(res, overhead *runtimeapi.LinuxContainerResources) *specs.LinuxResources {
	if res == nil {
		return nil
	}
	sum := cloneResources(res)
	switch q := overhead.GetCpuQuota(); {
	case sum.CpuQuota < 0:
		sum.CpuQuota = -1
	case q > 0 && sum.CpuQuota > 0:
		sum.CpuQuota += q
	}
	switch m := overhead.GetMemoryLimitInBytes(); {
	case sum.MemoryLimitInBytes < 0:
		sum.MemoryLimitInBytes = -1
	case m > 0 && sum.MemoryLimitInBytes > 0:
		sum.MemoryLimitInBytes = addBytes(sum.MemoryLimitInBytes, m)
	}
	if overhead.GetCpuShares() > 0 {
		sum.CpuShares = 0
	}
	return cgroup.SpecResources(sum, cgroup.WithSwapController(false), cgroup.WithHugetlbController(false))
}

func cloneResources(r *runtimeapi.LinuxContainerResources) *runtimeapi.LinuxContainerResources {
	if r == nil {
		return nil
	}
	return proto.Clone(r).(*runtimeapi.LinuxContainerResources)
}

// podQuantities are the pod-level requests and limits as quantities ("200m", "128Mi"), from
// what the runtime was told: the CPU request from the shares, the CPU limit from the quota and
// period, the memory limit. The kubelet's conversions (cm.SharesToMilliCPU, QuotaToMilliCPU);
// a zero or negative value is absent, as the kubelet 1.38 takes a zero CPU request or limit
// (pkg/kubelet/kubelet_pods.go, convertContainerStatusResources), and so is a memory limit
// that is the kernel's unlimited once the overhead is added back (podSpec).
func podQuantities(r, overhead *runtimeapi.LinuxContainerResources, pageSize int64) (requests, limits map[string]string) {
	requests, limits = map[string]string{}, map[string]string{}
	if sh := r.GetCpuShares(); sh > minShares {
		requests["cpu"] = milliCPU((sh*1000 + 1023) / 1024) // rounded up
	}
	if q, p := r.GetCpuQuota(), r.GetCpuPeriod(); q > 0 && p > 0 {
		limits["cpu"] = milliCPU(q * 1000 / p)
	}
	if m := r.GetMemoryLimitInBytes(); m > 0 && !cgroup.UnlimitedBytes(addBytes(m, max(overhead.GetMemoryLimitInBytes(), 0)), pageSize) {
		limits["memory"] = bytesQuantity(m)
	}
	return requests, limits
}

// addBytes is a+b, both not negative, at most math.MaxInt64 (no limit, to the kernel).
func addBytes(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// minShares are the kubelet's shares for no CPU request (cm.MinShares).
const minShares = 2

func milliCPU(m int64) string { return resource.NewMilliQuantity(m, resource.DecimalSI).String() }

func bytesQuantity(b int64) string { return resource.NewQuantity(b, resource.BinarySI).String() }
