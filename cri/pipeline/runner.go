package pipeline

// The pod-sandbox pipeline's runner: the one place that runs podgate's stages on a pod
// sandbox in order, and undoes them.
//
// RunPodSandbox runs the stages in order. Each stage has a step and, when it leaves something
// behind, an undo. When a stage fails, the stages already done are undone in reverse order and
// the kubelet gets the failure: nothing of the sandbox is left — not in the runtime, not in the
// registry, not in the checkpoint. A sandbox podgate must remove itself (a sysctl verification
// that fails with verify: fail) is removed this way too, by the forward stage's undo, so every
// stage before it learns of the removal.
//
// StopPodSandbox runs the stages' stop steps, last stage first, before it is forwarded (a
// device must leave the pod's network namespace while that still exists). RemovePodSandbox
// runs their removed steps, last stage first, once the runtime has removed the sandbox.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	corev1 "k8s.io/api/core/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/klog/v2"

	"github.com/podgate/podgate/cri"
	"github.com/podgate/podgate/cri/registry"
)

// rollbackTimeout bounds the undo of a failed RunPodSandbox: removing a fresh sandbox takes
// containerd well under a second, and the kubelet is waiting for the answer.
const rollbackTimeout = 30 * time.Second

// EventFunc tells a pod about its sandbox in a Kubernetes Event (kube.EventRecorder's
// Eventf, adapted by the agent: the pipeline does not import the Kubernetes client).
type EventFunc func(pod registry.PodRef, eventType, reason, action, note string)

// Runner runs the stages on RunPodSandbox, StopPodSandbox and RemovePodSandbox.
type Runner struct {
	stages   []Stage
	registry *registry.Registry

	failures   *prometheus.CounterVec
	undoErrors *prometheus.CounterVec
	duration   *prometheus.HistogramVec
	// events tells the pod when a stage of podgate's refuses its sandbox or holds it longer
	// than heldAfter; nil: no Events (no Kubernetes API).
	events    EventFunc
	heldAfter time.Duration
}

// RunnerOption configures a Runner.
type RunnerOption func(*Runner)

// WithEvents tells pods in Events when a stage refuses their sandbox (Stage.RefusedReason) or
// holds it longer than heldAfter (Stage.Holds; 0: never).
func WithEvents(fn EventFunc, heldAfter time.Duration) RunnerOption {
	return func(r *Runner) { r.events, r.heldAfter = fn, heldAfter }
}

// NewRunner returns the pipeline of stages, in this order, recording sandboxes in reg; its
// metrics are registered with r.
func NewRunner(stages []Stage, reg *registry.Registry, r prometheus.Registerer, opts ...RunnerOption) *Runner {
	p := &Runner{
		stages:   stages,
		registry: reg,
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "podgate", Subsystem: "sandbox", Name: "stage_failures_total",
			Help: "RunPodSandbox calls that failed, by the pipeline stage that failed (forward: the runtime refused).",
		}, []string{"stage"}),
		undoErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "podgate", Subsystem: "sandbox", Name: "undo_errors_total",
			Help: "Undo steps that failed while rolling back a failed RunPodSandbox, by stage; what they left is in the log.",
		}, []string{"stage"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "podgate", Subsystem: "sandbox", Name: "stage_duration_seconds",
			Help:    "Time each pipeline stage of RunPodSandbox takes, successful or not; forward is the runtime's own work (network namespace, CNI, pause), the rest is podgate's.",
			Buckets: []float64{.00001, .00005, .0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}, []string{"stage"}),
	}
	for _, o := range opts {
		o(p)
	}
	sandboxes := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "podgate", Subsystem: "registry", Name: "sandboxes",
		Help: "Pod sandboxes in podgate's pod registry.",
	}, func() float64 { return float64(reg.Len()) })
	r.MustRegister(p.failures, p.undoErrors, p.duration, sandboxes)
	return p
}

// Stages are the runner's stages, in order.
func (p *Runner) Stages() []Stage { return p.stages }

// Register plugs the pipeline into the CRI server.
func (p *Runner) Register(s *cri.Server) {
	cri.Intercept(s, cri.RunPodSandbox, p.RunPodSandbox)
	cri.Intercept(s, cri.StopPodSandbox, p.StopPodSandbox)
	cri.Intercept(s, cri.RemovePodSandbox, p.RemovePodSandbox)
}

// RunPodSandbox runs every stage in order; on a failure it undoes those done and returns it.
func (p *Runner) RunPodSandbox(ctx context.Context, req *runtimeapi.RunPodSandboxRequest, next cri.Forward[*runtimeapi.RunPodSandboxRequest, *runtimeapi.RunPodSandboxResponse]) (*runtimeapi.RunPodSandboxResponse, error) {
	sb := NewSandbox(ctx, req, next)
	ctx = klog.NewContext(ctx, sb.Logger)
	defer sb.End()
	start := time.Now()
	for i, st := range p.stages {
		stageStart := time.Now()
		err := p.runStage(ctx, st, sb)
		p.duration.WithLabelValues(st.Name).Observe(time.Since(stageStart).Seconds())
		if err != nil {
			p.failures.WithLabelValues(st.Name).Inc()
			sb.Logger.Info("Pod sandbox failed", "stage", st.Name, "err", err, "duration", time.Since(start))
			p.refused(sb, st, err)
			p.rollback(ctx, sb, i)
			return nil, err
		}
	}
	for _, fn := range sb.answered {
		fn()
	}
	// The IPs are not in this line: unless a stage needed them during the call, the sandbox's
	// status is read after the answer (podgate's registry and PodResources show them).
	sb.Logger.Info("Pod sandbox started", "podSandboxID", sb.Rec.ID, "runtimeHandler", sb.Rec.RuntimeHandler,
		"duration", time.Since(start))
	return sb.Resp, nil
}

// runStage runs one stage in a span of its own ("RunPodSandbox/<stage>", a child of the CRI
// call's span; the forward stage's is the parent of containerd's), and tells the pod when a
// stage of podgate's holds its sandbox longer than heldAfter.
func (p *Runner) runStage(ctx context.Context, st Stage, sb *Sandbox) error {
	ctx, span := StartSpan(ctx, "RunPodSandbox/"+st.Name,
		attribute.String("k8s.pod.name", sb.Rec.Pod.Name), attribute.String("k8s.namespace.name", sb.Rec.Pod.Namespace),
		attribute.String("k8s.pod.uid", string(sb.Rec.Pod.UID)))
	if st.Holds != "" && p.events != nil && p.heldAfter > 0 {
		pod := sb.Rec.Pod
		held := time.AfterFunc(p.heldAfter, func() {
			p.events(pod, corev1.EventTypeNormal, "SandboxHeld", "Waiting",
				fmt.Sprintf("podgate's stage %q has held the pod sandbox for %s: %s", st.Name, p.heldAfter, st.Holds))
		})
		defer held.Stop()
	}
	err := st.Run(ctx, sb)
	EndSpan(span, err)
	return err
}

// refused tells the pod which stage of podgate's refused its sandbox, and why: the kubelet's
// own FailedCreatePodSandBox says only the error. The runtime's failures (forward) are the
// kubelet's to report.
func (p *Runner) refused(sb *Sandbox, st Stage, err error) {
	if st.RefusedReason == "" || p.events == nil || errors.Is(err, context.Canceled) {
		return // a call the kubelet gave up was not refused
	}
	p.events(sb.Rec.Pod, corev1.EventTypeWarning, st.RefusedReason, "RunPodSandbox",
		fmt.Sprintf("podgate's stage %q refused the pod sandbox: %v", st.Name, err))
}

// rollback undoes the stages before failed, last first. It runs to the end whatever fails:
// each undo is independent, and what one leaves is logged and counted.
func (p *Runner) rollback(ctx context.Context, sb *Sandbox, failed int) {
	// The kubelet may have given up on the call; the undo must still happen.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
	defer cancel()
	for i := failed - 1; i >= 0; i-- {
		st := p.stages[i]
		if st.Undo == nil {
			continue
		}
		if err := st.Undo(ctx, sb); err != nil {
			p.undoErrors.WithLabelValues(st.Name).Inc()
			sb.Logger.Error(err, "Undo pod sandbox stage", "stage", st.Name, "podSandboxID", sb.Rec.ID)
			continue
		}
		sb.Logger.V(2).Info("Undid pod sandbox stage", "stage", st.Name, "podSandboxID", sb.Rec.ID)
	}
}

// StopPodSandbox runs the stages' stop steps, last stage first, then forwards the call.
func (p *Runner) StopPodSandbox(ctx context.Context, req *runtimeapi.StopPodSandboxRequest, next cri.Forward[*runtimeapi.StopPodSandboxRequest, *runtimeapi.StopPodSandboxResponse]) (*runtimeapi.StopPodSandboxResponse, error) {
	id := req.GetPodSandboxId()
	logger := klog.FromContext(ctx).WithValues("podSandboxID", id)
	if rec, ok := p.registry.Sandbox(id); ok {
		logger = logger.WithValues("pod", klog.KRef(rec.Pod.Namespace, rec.Pod.Name))
		for i := len(p.stages) - 1; i >= 0; i-- {
			if st := p.stages[i]; st.Stop != nil {
				if err := st.Stop(ctx, rec); err != nil {
					return nil, fmt.Errorf("stop pod sandbox %s: %s: %w", id, st.Name, err)
				}
			}
		}
	}
	resp, err := next(ctx, req)
	if err != nil {
		return nil, err
	}
	p.registry.Update(id, func(r *registry.SandboxRecord) { r.Ready = false })
	logger.Info("Pod sandbox stopped")
	return resp, nil
}

// RemovePodSandbox forwards the call, then runs the stages' removed steps, last stage first.
func (p *Runner) RemovePodSandbox(ctx context.Context, req *runtimeapi.RemovePodSandboxRequest, next cri.Forward[*runtimeapi.RemovePodSandboxRequest, *runtimeapi.RemovePodSandboxResponse]) (*runtimeapi.RemovePodSandboxResponse, error) {
	resp, err := next(ctx, req)
	if err != nil {
		return nil, err
	}
	id := req.GetPodSandboxId()
	logger := klog.FromContext(ctx).WithValues("podSandboxID", id)
	if err := p.Removed(ctx, id); err != nil {
		// The runtime removed the sandbox: the kubelet must hear so; podgate's own leftovers
		// are in the log, and the start-up rebuild drops a record the runtime no longer has.
		logger.Error(err, "Forget removed sandbox")
	}
	logger.Info("Pod sandbox removed")
	return resp, nil
}

// Removed runs every stage's removed step, last stage first, and joins their errors: for a
// sandbox the runtime no longer has, whoever removed it.
func (p *Runner) Removed(ctx context.Context, id string) error {
	var errs []error
	for i := len(p.stages) - 1; i >= 0; i-- {
		if st := p.stages[i]; st.Removed != nil {
			if err := st.Removed(ctx, id); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", st.Name, err))
			}
		}
	}
	return errors.Join(errs...)
}
