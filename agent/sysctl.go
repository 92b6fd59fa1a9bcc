package agent

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/klog/v2"

	"github.com/podgate/podgate/agent/config"
	"github.com/podgate/podgate/agent/registry"
	"github.com/podgate/podgate/cri"
	"github.com/podgate/podgate/pipeline"
	"github.com/podgate/podgate/resources/cgroup"
	"github.com/podgate/podgate/sysctl"
)

// verifyTimeout bounds a background verification: a status call and a few file reads, which
// take milliseconds unless containerd is stuck.
const verifyTimeout = 30 * time.Second

// sysctlStages are the pipeline's two sysctl stages: the check, which validates a pod's
// sysctls and adds the node's defaults before RunPodSandbox is forwarded, and the
// verification, which reads them back inside the pod once containerd has created it.
//
// With verify: fail the verification is part of RunPodSandbox, which it may fail. With repair
// and warn it is part of RunPodSandbox too when the pause process is found in the sandbox's
// cgroup (containerd's layout); otherwise it runs in the background once RunPodSandbox has
// answered and read the sandbox's status, overlapping with the kubelet's next calls (sandbox
// status, image checks), and CreateContainer for the sandbox waits for it, so no container of
// the pod starts before its sysctls are verified and repaired.
type sysctlStages struct {
	policy   *sysctl.Policy
	verify   string
	registry *registry.Registry

	mu      sync.Mutex
	pending map[string]chan struct{} // sandbox ID -> closed when its verification is done
	// background holds the verifications running after their RunPodSandbox answered.
	background *pipeline.Background

	rejected      prometheus.Counter
	defaultsAdded prometheus.Counter
	verified      *prometheus.CounterVec
	duration      *prometheus.HistogramVec
}

func newSysctlStages(policy *sysctl.Policy, verify string, registry *registry.Registry, reg prometheus.Registerer) *sysctlStages {
	g := &sysctlStages{
		policy:     policy,
		verify:     verify,
		registry:   registry,
		pending:    map[string]chan struct{}{},
		background: pipeline.NewBackground("sysctl verifications"),
		rejected: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "podgate", Subsystem: "sysctl", Name: "pods_rejected_total",
			Help: "RunPodSandbox calls refused because of a pod sysctl (name, namespace, allowlist, kernel or value).",
		}),
		defaultsAdded: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "podgate", Subsystem: "sysctl", Name: "defaults_added_total",
			Help: "Node default sysctls added to pods.",
		}),
		verified: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "podgate", Subsystem: "sysctl", Name: "verifications_total",
			Help: "Sandboxes whose sysctls were read back, by result: ok, repaired, mismatch (warn), failed (sandbox removed), error (could not verify).",
		}, []string{"result"}),
	}
	g.duration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: "podgate", Subsystem: "sysctl", Name: "duration_seconds",
		Help:    "Time podgate spends on pod sysctls, by phase: check (before RunPodSandbox is forwarded), verify (reading them back in the pod; in the background unless verify is fail), wait (CreateContainer waiting for a background verification).",
		Buckets: []float64{.00001, .00005, .0001, .00025, .0005, .001, .0025, .005, .01, .025, .1},
	}, []string{"phase"})
	reg.MustRegister(g.rejected, g.defaultsAdded, g.verified, g.duration)
	return g
}

// checkStage validates the pod's sysctls and completes them with the node's defaults. A
// refusal is InvalidArgument, before anything reaches the runtime.
func (g *sysctlStages) checkStage() pipeline.Stage {
	return pipeline.Stage{Name: "sysctl-check", Run: g.check,
		Holds: "checking the pod's sysctls", RefusedReason: "FailedSysctlCheck"}
}

func (g *sysctlStages) check(ctx context.Context, sb *pipeline.Sandbox) error {
	cfg := sb.Req.GetConfig()
	nsOpts := cfg.GetLinux().GetSecurityContext().GetNamespaceOptions()
	pod := sysctl.Pod{
		Namespace:   cfg.GetMetadata().GetNamespace(),
		HostNetwork: nsOpts.GetNetwork() == runtimeapi.NamespaceMode_NODE,
		HostIPC:     nsOpts.GetIpc() == runtimeapi.NamespaceMode_NODE,
	}
	logger := klog.FromContext(ctx)
	start := time.Now()
	asked := cfg.GetLinux().GetSysctls()
	want, added, err := g.policy.Complete(pod, asked)
	g.duration.WithLabelValues("check").Observe(time.Since(start).Seconds())
	if err != nil {
		g.rejected.Inc()
		logger.Info("Refused pod sandbox: sysctl", "err", err)
		return err
	}
	sb.Rec.Sysctls = registry.SysctlRecord{Asked: maps.Clone(asked), Applied: want, Verification: registry.SysctlsNone}
	if len(want) > 0 {
		sb.Rec.Sysctls.Verification = registry.SysctlsPending
	}
	if len(added) > 0 {
		// A changed copy: the cri package forwards the kubelet's bytes when req is unchanged.
		req := proto.Clone(sb.Req).(*runtimeapi.RunPodSandboxRequest)
		if req.Config.Linux == nil {
			req.Config.Linux = &runtimeapi.LinuxPodSandboxConfig{}
		}
		req.Config.Linux.Sysctls = want
		sb.Req = req
		g.defaultsAdded.Add(float64(len(added)))
		logger.V(2).Info("Added node default sysctls", "sysctls", added)
	}
	return nil
}

// verifyStage reads the sandbox's sysctls back inside the pod: now with verify: fail, whose
// failure rolls the sandbox back; in the background otherwise.
func (g *sysctlStages) verifyStage() pipeline.Stage {
	return pipeline.Stage{Name: "sysctl-verify", Run: g.verifyRun,
		Holds: "reading the pod's sysctls back in its network namespace", RefusedReason: "FailedSysctlVerify"}
}

func (g *sysctlStages) verifyRun(ctx context.Context, sb *pipeline.Sandbox) error {
	want := sb.Rec.Sysctls.Applied
	if len(want) == 0 {
		return nil
	}
	logger := klog.FromContext(ctx).WithValues("podSandboxID", sb.Rec.ID)
	if g.verify == config.VerifyFail {
		if err := sb.FromRuntime(); err != nil {
			// Without the sandbox's namespaces nothing can be verified; the runtime's error
			// keeps its class (Unavailable, DeadlineExceeded) on its way to the kubelet.
			verifyResult{verification: registry.SysctlsError, errText: err.Error()}.record(&sb.Rec.Sysctls)
			g.verified.WithLabelValues("error").Inc()
			return fmt.Errorf("verify sysctls of sandbox %s: %w", sb.Rec.ID, err)
		}
		res := g.timedVerify(ctx, logger, sb.Rec, want)
		res.record(&sb.Rec.Sysctls)
		if res.failure != nil {
			logger.Info("Failing pod sandbox: sysctl verification failed", "err", res.failure)
		}
		return res.failure
	}
	if rec, ok := pauseFromCgroup(logger, sb.Rec); ok {
		// A few file reads: done now, so that CreateContainer has nothing to wait for and
		// nothing of it runs beside the kubelet's next calls. Repair and warn never fail it.
		g.timedVerify(ctx, logger, rec, want).record(&sb.Rec.Sysctls)
		return nil
	}
	rec, view := sb.Rec.Clone(), sb.RuntimeView()
	sb.OnAnswer(func() { g.verifyInBackground(ctx, logger, rec, view, want) })
	return nil
}

// cgroupProcs lists the processes of a cgroup (cgroup.Procs; tests replace it).
var cgroupProcs = cgroup.Procs

// pauseFromCgroup finds the sandbox's pause process in the cgroup containerd gives the sandbox
// (registry.ContainerdCgroupsPath: the same as its containers'), the one process there, and returns rec
// with it: its namespaces are the pod's. It costs a few system calls where the verbose
// PodSandboxStatus costs containerd a JSON encoding of the sandbox's runtime spec, beside the
// kubelet's own next call. With another runtime or layout it reports false, and the
// verification waits for that status.
func pauseFromCgroup(logger klog.Logger, rec registry.SandboxRecord) (registry.SandboxRecord, bool) {
	path := registry.ContainerdCgroupsPath(rec.CgroupParent, rec.ID)
	pids, err := cgroupProcs(path)
	if err != nil || len(pids) != 1 {
		logger.V(4).Info("Pause process not found in the sandbox's cgroup: its status is read", "cgroupsPath", path, "pids", pids, "err", err)
		return rec, false
	}
	rec = rec.Clone()
	rec.PID, rec.NetNS = pids[0], "" // the pause process's own namespaces: the pod's
	return rec, true
}

// verifyInBackground starts the verification of a sandbox whose RunPodSandbox is answering
// and records its result in the registry. view gives the sandbox's namespaces.
func (g *sysctlStages) verifyInBackground(ctx context.Context, logger klog.Logger, rec registry.SandboxRecord, view func() (registry.SandboxRecord, error), want map[string]string) {
	done := make(chan struct{})
	g.mu.Lock()
	g.pending[rec.ID] = done
	g.mu.Unlock()
	// The kubelet's call ends when we answer; the verification must not end with it.
	vctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), verifyTimeout)
	g.background.Go(func() {
		defer cancel()
		if view != nil {
			v, _ := view() // an error is in v.Status, which the verification reports
			rec.FillFromRuntime(&v)
		}
		res := g.timedVerify(vctx, logger, rec, want) // repair and warn never fail the sandbox
		g.registry.Update(rec.ID, func(r *registry.SandboxRecord) { res.record(&r.Sysctls) })
		g.mu.Lock()
		delete(g.pending, rec.ID)
		g.mu.Unlock()
		close(done)
	})
}

// wait waits for the background verifications, until ctx ends.
func (g *sysctlStages) wait(ctx context.Context) error { return g.background.Wait(ctx) }

// verifyResult is a verification's outcome: the registry's verification result and
// mismatches, and, with verify: fail, the error that fails the sandbox.
type verifyResult struct {
	verification string
	mismatches   []string
	errText      string
	failure      error
}

func (res verifyResult) record(r *registry.SysctlRecord) {
	r.Verification, r.Mismatches, r.Error = res.verification, res.mismatches, res.errText
}

func (g *sysctlStages) timedVerify(ctx context.Context, logger klog.Logger, rec registry.SandboxRecord, want map[string]string) verifyResult {
	start := time.Now()
	defer func() { g.duration.WithLabelValues("verify").Observe(time.Since(start).Seconds()) }()
	ctx, span := pipeline.StartSpan(ctx, "sysctl verification", attribute.String("podSandboxID", rec.ID), attribute.Int("sysctls", len(want)))
	res := g.verifyPod(ctx, logger, rec, want)
	span.SetAttributes(attribute.String("verification", res.verification))
	pipeline.EndSpan(span, res.failure)
	return res
}

// createContainer holds a container of a sandbox whose sysctls are still being verified.
func (g *sysctlStages) createContainer(ctx context.Context, req *runtimeapi.CreateContainerRequest, next cri.Forward[*runtimeapi.CreateContainerRequest, *runtimeapi.CreateContainerResponse]) (*runtimeapi.CreateContainerResponse, error) {
	g.mu.Lock()
	done := g.pending[req.GetPodSandboxId()]
	g.mu.Unlock()
	if done != nil {
		start := time.Now()
		select {
		case <-done:
		case <-ctx.Done():
			return nil, fmt.Errorf("wait for the sysctl verification of sandbox %s: %w", req.GetPodSandboxId(), context.Cause(ctx))
		}
		g.duration.WithLabelValues("wait").Observe(time.Since(start).Seconds())
	}
	return next(ctx, req)
}

// verifyPod reads the sandbox's sysctls inside its namespaces and applies the verify policy.
func (g *sysctlStages) verifyPod(ctx context.Context, logger klog.Logger, rec registry.SandboxRecord, want map[string]string) verifyResult {
	wantByName := make(map[sysctl.Name]string, len(want))
	for k, v := range want {
		n, _ := sysctl.ParseName(k) // the check stage accepted every name
		wantByName[n] = v
	}
	mismatch, target, err := g.mismatches(ctx, rec, wantByName)
	if err != nil {
		g.verified.WithLabelValues("error").Inc()
		res := verifyResult{verification: registry.SysctlsError, errText: err.Error()}
		if g.verify == config.VerifyFail {
			res.failure = classOr(errdefs.ErrFailedPrecondition, fmt.Errorf("verify sysctls of sandbox %s: %w", rec.ID, err))
			return res
		}
		logger.Error(err, "Could not verify pod sysctls")
		return res
	}
	if len(mismatch) == 0 {
		g.verified.WithLabelValues("ok").Inc()
		return verifyResult{verification: registry.SysctlsOK}
	}
	res := verifyResult{mismatches: make([]string, len(mismatch))}
	for i, m := range mismatch {
		res.mismatches[i] = m.String()
	}
	switch g.verify {
	case config.VerifyRepair:
		fix := make(map[sysctl.Name]string, len(mismatch))
		for _, m := range mismatch {
			fix[m.name] = wantByName[m.name]
		}
		if err := sysctl.Write(target, fix); err != nil {
			g.verified.WithLabelValues("error").Inc()
			logger.Error(err, "Could not repair pod sysctls", "mismatches", res.mismatches)
			res.verification, res.errText = registry.SysctlsError, err.Error()
			return res
		}
		g.verified.WithLabelValues("repaired").Inc()
		logger.Info("Repaired pod sysctls inside the pod", "mismatches", res.mismatches)
		res.verification = registry.SysctlsRepaired
	case config.VerifyFail:
		g.verified.WithLabelValues("failed").Inc()
		res.verification = registry.SysctlsMismatch
		res.failure = errdefs.ErrFailedPrecondition.WithMessage(fmt.Sprintf("verify sysctls of sandbox %s: they do not hold in the pod: %v", rec.ID, mismatch))
	default:
		g.verified.WithLabelValues("mismatch").Inc()
		logger.Info("Pod sysctls do not hold in the pod", "mismatches", res.mismatches)
		res.verification = registry.SysctlsMismatch
	}
	return res
}

type sysctlMismatch struct {
	name      sysctl.Name
	got, want string
}

func (m sysctlMismatch) String() string { return fmt.Sprintf("%s=%q (want %q)", m.name, m.got, m.want) }

func (g *sysctlStages) mismatches(ctx context.Context, rec registry.SandboxRecord, want map[sysctl.Name]string) ([]sysctlMismatch, sysctl.Target, error) {
	target, err := sandboxTarget(rec)
	if err != nil {
		return nil, target, err
	}
	names := make([]sysctl.Name, 0, len(want))
	for n := range want {
		names = append(names, n)
	}
	slices.Sort(names)
	if ctx.Err() != nil {
		return nil, target, context.Cause(ctx)
	}
	got, err := sysctl.Read(target, names)
	if err != nil {
		return nil, target, err
	}
	var out []sysctlMismatch
	for _, n := range names {
		if !sysctl.SameValue(n, got[n], want[n]) {
			out = append(out, sysctlMismatch{n, got[n], want[n]})
		}
	}
	return out, target, nil
}

// sandboxTarget names the sandbox's namespaces from its record, which the forward stage read
// from the runtime: the network namespace CNI used, and the pause process's IPC namespace.
func sandboxTarget(rec registry.SandboxRecord) (sysctl.Target, error) {
	if rec.PID <= 0 {
		if rec.Status != "" {
			return sysctl.Target{}, errors.New(rec.Status)
		}
		return sysctl.Target{}, errors.New("sandbox status info has no pid")
	}
	target := sysctl.ForPID(rec.PID)
	if rec.NetNS != "" {
		target.NetNS = rec.NetNS
	}
	return target, nil
}

// applyNodeSysctls sets the configured node sysctls where they differ, logging each change, and
// returns the ones it changed.
func applyNodeSysctls(logger klog.Logger, values map[sysctl.Name]string) ([]sysctl.Name, error) {
	names := make([]sysctl.Name, 0, len(values))
	for n := range values {
		names = append(names, n)
	}
	slices.Sort(names)
	var changed []sysctl.Name
	for _, n := range names {
		old, err := sysctl.ReadNode(n)
		if err != nil {
			return changed, fmt.Errorf("sysctls.node %s: %w", n, err)
		}
		if sysctl.SameValue(n, old, values[n]) {
			continue
		}
		if err := sysctl.WriteNode(n, values[n]); err != nil {
			return changed, fmt.Errorf("sysctls.node %s: %w", n, err)
		}
		logger.Info("Set node sysctl", "sysctl", n, "from", old, "to", values[n])
		changed = append(changed, n)
	}
	return changed, nil
}
