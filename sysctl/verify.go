package sysctl

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/containerd/errdefs"
	"go.opentelemetry.io/otel/attribute"
	"k8s.io/klog/v2"

	"github.com/podgate/podgate/cri/pipeline"
	"github.com/podgate/podgate/cri/registry"
)

// verifyTimeout bounds a background verification: a status call and a few file reads, which
// take milliseconds unless containerd is stuck.
const verifyTimeout = 30 * time.Second

// VerifyStage reads the sandbox's sysctls back inside the pod: now with verify: fail, whose
// failure rolls the sandbox back; in the background otherwise. It records the sandbox's
// sysctls (Records), which the registry shows once it records the sandbox; its undo forgets
// them.
func (g *Stages) VerifyStage() pipeline.Stage {
	return pipeline.Stage{Name: "sysctl-verify", Run: g.verifyRun,
		Undo:  func(_ context.Context, sb *pipeline.Sandbox) error { g.records.forget(sb.Rec.ID); return nil },
		Holds: "reading the pod's sysctls back in its network namespace", RefusedReason: "FailedSysctlVerify"}
}

func (g *Stages) verifyRun(ctx context.Context, sb *pipeline.Sandbox) error {
	rec := g.held(sb)
	if len(rec.Applied) > 0 {
		if err := g.verifyNowOrLater(ctx, sb, &rec); err != nil {
			return err // the sandbox is rolled back: nothing to record
		}
	}
	g.records.set(sb.Rec.ID, rec)
	return nil
}

// verifyNowOrLater verifies the sandbox's sysctls into rec: now with verify: fail, whose
// failure it returns, or when the pause process is found in the sandbox's cgroup; otherwise
// once RunPodSandbox answers, in the background (rec stays pending).
func (g *Stages) verifyNowOrLater(ctx context.Context, sb *pipeline.Sandbox, rec *Record) error {
	want := rec.Applied
	logger := klog.FromContext(ctx).WithValues("podSandboxID", sb.Rec.ID)
	if g.verify == VerifyFail {
		if err := sb.FromRuntime(); err != nil {
			// Without the sandbox's namespaces nothing can be verified; the runtime's error
			// keeps its class (Unavailable, DeadlineExceeded) on its way to the kubelet.
			g.verified.WithLabelValues("error").Inc()
			return fmt.Errorf("verify sysctls of sandbox %s: %w", sb.Rec.ID, err)
		}
		res := g.timedVerify(ctx, logger, sb.Rec, want)
		res.record(rec)
		if res.failure != nil {
			logger.Info("Failing pod sandbox: sysctl verification failed", "err", res.failure)
		}
		return res.failure
	}
	if sbRec, ok := g.pauseFromCgroup(logger, sb.Rec); ok {
		// A few file reads: done now, so that CreateContainer has nothing to wait for and
		// nothing of it runs beside the kubelet's next calls. Repair and warn never fail it.
		g.timedVerify(ctx, logger, sbRec, want).record(rec)
		return nil
	}
	sbRec, view := sb.Rec.Clone(), sb.RuntimeView()
	sb.OnAnswer(func() { g.verifyInBackground(ctx, logger, sbRec, view, want) })
	return nil
}

// pauseFromCgroup finds the sandbox's pause process in the cgroup containerd gives the sandbox
// (registry.ContainerdCgroupsPath: the same as its containers'), the one process there, and returns rec
// with it: its namespaces are the pod's. It costs a few system calls where the verbose
// PodSandboxStatus costs containerd a JSON encoding of the sandbox's runtime spec, beside the
// kubelet's own next call. With another runtime or layout, or without [WithCgroupProcs], it
// reports false, and the verification waits for that status.
func (g *Stages) pauseFromCgroup(logger klog.Logger, rec registry.SandboxRecord) (registry.SandboxRecord, bool) {
	if g.cgroupProcs == nil {
		return rec, false
	}
	path := registry.ContainerdCgroupsPath(rec.CgroupParent, rec.ID)
	pids, err := g.cgroupProcs(path)
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
func (g *Stages) verifyInBackground(ctx context.Context, logger klog.Logger, rec registry.SandboxRecord, view func() (registry.SandboxRecord, error), want map[string]string) {
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
		g.records.update(rec.ID, func(r *Record) { res.record(r) })
		g.mu.Lock()
		delete(g.pending, rec.ID)
		g.mu.Unlock()
		close(done)
	})
}

// verifyResult is a verification's outcome: the recorded verification result and mismatches,
// and, with verify: fail, the error that fails the sandbox.
type verifyResult struct {
	verification string
	mismatches   []string
	errText      string
	failure      error
}

func (res verifyResult) record(r *Record) {
	r.Verification, r.Mismatches, r.Error = res.verification, res.mismatches, res.errText
}

func (g *Stages) timedVerify(ctx context.Context, logger klog.Logger, rec registry.SandboxRecord, want map[string]string) verifyResult {
	start := time.Now()
	defer func() { g.duration.WithLabelValues("verify").Observe(time.Since(start).Seconds()) }()
	ctx, span := pipeline.StartSpan(ctx, "sysctl verification", attribute.String("podSandboxID", rec.ID), attribute.Int("sysctls", len(want)))
	res := g.verifyPod(ctx, logger, rec, want)
	span.SetAttributes(attribute.String("verification", res.verification))
	pipeline.EndSpan(span, res.failure)
	return res
}

// verifyPod reads the sandbox's sysctls inside its namespaces and applies the verify policy.
func (g *Stages) verifyPod(ctx context.Context, logger klog.Logger, rec registry.SandboxRecord, want map[string]string) verifyResult {
	wantByName := make(map[Name]string, len(want))
	for k, v := range want {
		n, _ := ParseName(k) // the check stage accepted every name
		wantByName[n] = v
	}
	mismatch, target, err := mismatches(ctx, rec, wantByName)
	if err != nil {
		g.verified.WithLabelValues("error").Inc()
		res := verifyResult{verification: ResultError, errText: err.Error()}
		if g.verify == VerifyFail {
			res.failure = classOr(errdefs.ErrFailedPrecondition, fmt.Errorf("verify sysctls of sandbox %s: %w", rec.ID, err))
			return res
		}
		logger.Error(err, "Could not verify pod sysctls")
		return res
	}
	if len(mismatch) == 0 {
		g.verified.WithLabelValues("ok").Inc()
		return verifyResult{verification: ResultOK}
	}
	res := verifyResult{mismatches: make([]string, len(mismatch))}
	for i, m := range mismatch {
		res.mismatches[i] = m.String()
	}
	switch g.verify {
	case VerifyRepair:
		fix := make(map[Name]string, len(mismatch))
		for _, m := range mismatch {
			fix[m.name] = wantByName[m.name]
		}
		if err := Write(target, fix); err != nil {
			g.verified.WithLabelValues("error").Inc()
			logger.Error(err, "Could not repair pod sysctls", "mismatches", res.mismatches)
			res.verification, res.errText = ResultError, err.Error()
			return res
		}
		g.verified.WithLabelValues("repaired").Inc()
		logger.Info("Repaired pod sysctls inside the pod", "mismatches", res.mismatches)
		res.verification = ResultRepaired
	case VerifyFail:
		g.verified.WithLabelValues("failed").Inc()
		res.verification = ResultMismatch
		res.failure = errdefs.ErrFailedPrecondition.WithMessage(fmt.Sprintf("verify sysctls of sandbox %s: they do not hold in the pod: %v", rec.ID, mismatch))
	default:
		g.verified.WithLabelValues("mismatch").Inc()
		logger.Info("Pod sysctls do not hold in the pod", "mismatches", res.mismatches)
		res.verification = ResultMismatch
	}
	return res
}

// valueMismatch is a sysctl whose value in the pod is not the one asked for.
type valueMismatch struct {
	name      Name
	got, want string
}

func (m valueMismatch) String() string { return fmt.Sprintf("%s=%q (want %q)", m.name, m.got, m.want) }

func mismatches(ctx context.Context, rec registry.SandboxRecord, want map[Name]string) ([]valueMismatch, Target, error) {
	target, err := sandboxTarget(rec)
	if err != nil {
		return nil, target, err
	}
	names := make([]Name, 0, len(want))
	for n := range want {
		names = append(names, n)
	}
	slices.Sort(names)
	if ctx.Err() != nil {
		return nil, target, context.Cause(ctx)
	}
	got, err := Read(target, names)
	if err != nil {
		return nil, target, err
	}
	var out []valueMismatch
	for _, n := range names {
		if !SameValue(n, got[n], want[n]) {
			out = append(out, valueMismatch{n, got[n], want[n]})
		}
	}
	return out, target, nil
}

// sandboxTarget names the sandbox's namespaces from its record, which the forward stage read
// from the runtime: the network namespace CNI used, and the pause process's IPC namespace.
func sandboxTarget(rec registry.SandboxRecord) (Target, error) {
	if rec.PID <= 0 {
		if rec.Status != "" {
			return Target{}, errors.New(rec.Status)
		}
		return Target{}, errors.New("sandbox status info has no pid")
	}
	target := ForPID(rec.PID)
	if rec.NetNS != "" {
		target.NetNS = rec.NetNS
	}
	return target, nil
}
