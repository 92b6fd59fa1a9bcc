package agent

// The pod-sandbox pipeline: the one place that says in which order podgate's features act on
// a pod sandbox, and how each is undone. Read this file first.
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
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/klog/v2"

	"github.com/podgate/podgate/agent/kube"
	"github.com/podgate/podgate/agent/registry"
	"github.com/podgate/podgate/cri"
)

// sandboxStages returns the pipeline's stages in order. This list is the order.
func (p *sandboxPipeline) sandboxStages(sys *sysctlStages, dra *draStages) []stage {
	return []stage{
		sys.checkStage(),   // sysctls: validate the pod's, add the node defaults; may refuse the pod
		dra.prepareStage(), // DRA claims prepared by their drivers: the devices exist before CNI
		p.forwardStage(),   // containerd creates the sandbox: network namespace, CNI, pause
		p.statusStage(),    // the sandbox's verbose status, read once (now, or after the answer)
		sys.verifyStage(),  // sysctls: read back inside the pod; repair, warn or fail
		dra.attachStage(),  // DRA network devices moved into the pod, where configured
		p.recordStage(),    // the pod registry and its checkpoint
	}
}

// rollbackTimeout bounds the undo of a failed RunPodSandbox: removing a fresh sandbox takes
// containerd well under a second, and the kubelet is waiting for the answer.
const rollbackTimeout = 30 * time.Second

// stage is one step of the pod-sandbox pipeline. Only run is required.
type stage struct {
	name string
	// run does the stage's work for a RunPodSandbox. When it fails it leaves nothing of its
	// own behind: the pipeline undoes only the stages that succeeded.
	run func(ctx context.Context, sb *sandboxRun) error
	// undo reverses a successful run when a later stage fails.
	undo func(ctx context.Context, sb *sandboxRun) error
	// stop runs before StopPodSandbox is forwarded, for a sandbox the registry knows.
	stop func(ctx context.Context, rec registry.SandboxRecord) error
	// removed runs once the runtime has removed the sandbox (or says it has none by that ID).
	removed func(ctx context.Context, id string) error
}

// sandboxRun is one RunPodSandbox call on its way through the stages.
type sandboxRun struct {
	// req is what is forwarded. A stage that changes it replaces it with a changed copy: the
	// CRI proxy forwards the kubelet's own bytes when req is left as it came.
	req  *runtimeapi.RunPodSandboxRequest
	next cri.Forward[*runtimeapi.RunPodSandboxRequest, *runtimeapi.RunPodSandboxResponse]
	resp *runtimeapi.RunPodSandboxResponse
	// rec is the sandbox's registry record as the stages build it.
	rec    registry.SandboxRecord
	logger klog.Logger
	// answered holds work that starts once RunPodSandbox has succeeded, just before the
	// kubelet gets the answer (a background verification).
	answered []func()
	// ended holds what runs when the call ends, whether it succeeded or not.
	ended []func()
	// runtimeView reads the sandbox's verbose status once (later calls return the first
	// answer): its netns, pause PID, IPs, and the runtime's error when it did not answer, with
	// its class. Set by the status stage.
	runtimeView func() (registry.SandboxRecord, error)
}

// fromRuntime fills rec with the sandbox's status now, for a stage that needs the sandbox's
// namespaces before RunPodSandbox answers. The error is the runtime's, class kept.
func (sb *sandboxRun) fromRuntime() error {
	if sb.runtimeView == nil {
		return nil
	}
	v, err := sb.runtimeView()
	sb.rec.FillFromRuntime(&v)
	return err
}

// onAnswer adds fn to what runs once every stage has succeeded.
func (sb *sandboxRun) onAnswer(fn func()) { sb.answered = append(sb.answered, fn) }

// onEnd adds fn to what runs when the call ends, after the answer's work or the rollback.
func (sb *sandboxRun) onEnd(fn func()) { sb.ended = append(sb.ended, fn) }

// sandboxPipeline runs the stages on RunPodSandbox, StopPodSandbox and RemovePodSandbox.
type sandboxPipeline struct {
	stages   []stage
	registry *registry.Registry
	// runtime is the backend runtime, for the forward stage's undo and for sandbox status.
	runtime runtimeapi.RuntimeServiceClient

	failures   *prometheus.CounterVec
	undoErrors *prometheus.CounterVec
	duration   *prometheus.HistogramVec
	// background holds the status reads that finish records after their answer.
	background backgroundWork
	// quiet waits until the CRI server has served no call for a moment (cri.Server.Quiet);
	// nil: no wait.
	quiet func(context.Context) error
	// events tells the pod when a stage of podgate's refuses its sandbox or holds it longer
	// than heldAfter; nil without the Kubernetes API.
	events    *kube.EventRecorder
	heldAfter time.Duration
}

func newSandboxPipeline(reg *registry.Registry, rt runtimeapi.RuntimeServiceClient, sys *sysctlStages, dra *draStages, r prometheus.Registerer) *sandboxPipeline {
	p := &sandboxPipeline{
		registry:   reg,
		runtime:    rt,
		background: backgroundWork{name: "sandbox status reads"},
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "podgate", Subsystem: "sandbox", Name: "stage_failures_total",
			Help: "RunPodSandbox calls that failed, by the pipeline stage that failed (forward: the runtime refused).",
		}, []string{"stage"}),
		undoErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "podgate", Subsystem: "sandbox", Name: "undo_errors_total",
			Help: "Undo steps that failed while rolling back a failed RunPodSandbox, by stage; what they left is in the log.",
		}, []string{"stage"}),
	}
	p.duration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: "podgate", Subsystem: "sandbox", Name: "stage_duration_seconds",
		Help:    "Time each pipeline stage of RunPodSandbox takes, successful or not; forward is the runtime's own work (network namespace, CNI, pause), the rest is podgate's.",
		Buckets: []float64{.00001, .00005, .0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
	}, []string{"stage"})
	p.stages = p.sandboxStages(sys, dra)
	sandboxes := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "podgate", Subsystem: "registry", Name: "sandboxes",
		Help: "Pod sandboxes in podgate's pod registry.",
	}, func() float64 { return float64(reg.Len()) })
	r.MustRegister(p.failures, p.undoErrors, p.duration, sandboxes)
	return p
}

// register plugs the pipeline into the CRI server.
func (p *sandboxPipeline) register(s *cri.Server) {
	p.quiet = quietOf(s)
	cri.Intercept(s, cri.RunPodSandbox, p.runPodSandbox)
	cri.Intercept(s, cri.StopPodSandbox, p.stopPodSandbox)
	cri.Intercept(s, cri.RemovePodSandbox, p.removePodSandbox)
}

func (p *sandboxPipeline) runPodSandbox(ctx context.Context, req *runtimeapi.RunPodSandboxRequest, next cri.Forward[*runtimeapi.RunPodSandboxRequest, *runtimeapi.RunPodSandboxResponse]) (*runtimeapi.RunPodSandboxResponse, error) {
	md := req.GetConfig().GetMetadata()
	sb := &sandboxRun{
		req:  req,
		next: next,
		rec: registry.SandboxRecord{
			Pod:            registry.PodRef{UID: types.UID(md.GetUid()), Name: md.GetName(), Namespace: md.GetNamespace(), Attempt: md.GetAttempt()},
			RuntimeHandler: req.GetRuntimeHandler(),
			Origin:         registry.OriginStarted,
			CgroupParent:   req.GetConfig().GetLinux().GetCgroupParent(),
			CreatedAt:      time.Now().UTC(),
		},
		logger: klog.FromContext(ctx).WithValues("pod", klog.KRef(md.GetNamespace(), md.GetName()), "podUID", md.GetUid()),
	}
	ctx = klog.NewContext(ctx, sb.logger)
	defer func() {
		for _, fn := range sb.ended {
			fn()
		}
	}()
	start := time.Now()
	for i, st := range p.stages {
		stageStart := time.Now()
		err := p.runStage(ctx, st, sb)
		p.duration.WithLabelValues(st.name).Observe(time.Since(stageStart).Seconds())
		if err != nil {
			p.failures.WithLabelValues(st.name).Inc()
			sb.logger.Info("Pod sandbox failed", "stage", st.name, "err", err, "duration", time.Since(start))
			p.refused(sb, st.name, err)
			p.rollback(ctx, sb, i)
			return nil, err
		}
	}
	for _, fn := range sb.answered {
		fn()
	}
	// The IPs are not in this line: unless a stage needed them during the call, the sandbox's
	// status is read after the answer (podgate's registry and PodResources show them).
	sb.logger.Info("Pod sandbox started", "podSandboxID", sb.rec.ID, "runtimeHandler", sb.rec.RuntimeHandler,
		"duration", time.Since(start))
	return sb.resp, nil
}

// tracerName names the spans of podgate's own work in the agent.
const tracerName = "github.com/podgate/podgate/agent"

// startSpan starts a span of podgate's work as a child of the span in ctx (the CRI call's,
// made by the tracing stats handler), from that span's provider: a no-op one when tracing is
// off or the call is not sampled.
func startSpan(ctx context.Context, name string, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	return trace.SpanFromContext(ctx).TracerProvider().Tracer(tracerName).Start(ctx, name, trace.WithAttributes(attrs...))
}

// endSpan ends span, marking it failed with err.
func endSpan(span trace.Span, err error) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

// runStage runs one stage in a span of its own ("RunPodSandbox/<stage>", a child of the CRI
// call's span; the forward stage's is the parent of containerd's), and tells the pod when a
// stage of podgate's holds its sandbox longer than heldAfter.
func (p *sandboxPipeline) runStage(ctx context.Context, st stage, sb *sandboxRun) error {
	ctx, span := startSpan(ctx, "RunPodSandbox/"+st.name,
		attribute.String("k8s.pod.name", sb.rec.Pod.Name), attribute.String("k8s.namespace.name", sb.rec.Pod.Namespace),
		attribute.String("k8s.pod.uid", string(sb.rec.Pod.UID)))
	if what, ok := holdingStages[st.name]; ok && p.events != nil && p.heldAfter > 0 {
		pod := kube.PodRef{Namespace: sb.rec.Pod.Namespace, Name: sb.rec.Pod.Name, UID: sb.rec.Pod.UID}
		held := time.AfterFunc(p.heldAfter, func() {
			p.events.Eventf(pod, corev1.EventTypeNormal, "SandboxHeld", "Waiting",
				"podgate's stage %q has held the pod sandbox for %s: %s", st.name, p.heldAfter, what)
		})
		defer held.Stop()
	}
	err := st.run(ctx, sb)
	endSpan(span, err)
	return err
}

// holdingStages are podgate's stages that may hold a sandbox for long, and what they do then.
var holdingStages = map[string]string{
	"sysctl-check":  "checking the pod's sysctls",
	"dra-prepare":   "the DRA drivers prepare the pod's claims",
	"sysctl-verify": "reading the pod's sysctls back in its network namespace",
	"dra-attach":    "moving the pod's DRA network devices into its network namespace",
}

// refusedReasons are the Event reasons of a sandbox refused by a stage of podgate's.
var refusedReasons = map[string]string{
	"sysctl-check":  "FailedSysctlCheck",
	"dra-prepare":   "FailedDRAPrepare",
	"sysctl-verify": "FailedSysctlVerify",
	"dra-attach":    "FailedDRAAttach",
}

// refused tells the pod which stage of podgate's refused its sandbox, and why: the kubelet's
// own FailedCreatePodSandBox says only the error. The runtime's failures (forward) are the
// kubelet's to report.
func (p *sandboxPipeline) refused(sb *sandboxRun, stage string, err error) {
	reason, ok := refusedReasons[stage]
	if !ok || p.events == nil || errors.Is(err, context.Canceled) {
		return // a call the kubelet gave up was not refused
	}
	pod := kube.PodRef{Namespace: sb.rec.Pod.Namespace, Name: sb.rec.Pod.Name, UID: sb.rec.Pod.UID}
	p.events.Eventf(pod, corev1.EventTypeWarning, reason, "RunPodSandbox", "podgate's stage %q refused the pod sandbox: %v", stage, err)
}

// rollback undoes the stages before failed, last first. It runs to the end whatever fails:
// each undo is independent, and what one leaves is logged and counted.
func (p *sandboxPipeline) rollback(ctx context.Context, sb *sandboxRun, failed int) {
	// The kubelet may have given up on the call; the undo must still happen.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
	defer cancel()
	for i := failed - 1; i >= 0; i-- {
		st := p.stages[i]
		if st.undo == nil {
			continue
		}
		if err := st.undo(ctx, sb); err != nil {
			p.undoErrors.WithLabelValues(st.name).Inc()
			sb.logger.Error(err, "Undo pod sandbox stage", "stage", st.name, "podSandboxID", sb.rec.ID)
			continue
		}
		sb.logger.V(2).Info("Undid pod sandbox stage", "stage", st.name, "podSandboxID", sb.rec.ID)
	}
}

func (p *sandboxPipeline) stopPodSandbox(ctx context.Context, req *runtimeapi.StopPodSandboxRequest, next cri.Forward[*runtimeapi.StopPodSandboxRequest, *runtimeapi.StopPodSandboxResponse]) (*runtimeapi.StopPodSandboxResponse, error) {
	id := req.GetPodSandboxId()
	logger := klog.FromContext(ctx).WithValues("podSandboxID", id)
	if rec, ok := p.registry.Sandbox(id); ok {
		logger = logger.WithValues("pod", klog.KRef(rec.Pod.Namespace, rec.Pod.Name))
		for i := len(p.stages) - 1; i >= 0; i-- {
			if st := p.stages[i]; st.stop != nil {
				if err := st.stop(ctx, rec); err != nil {
					return nil, fmt.Errorf("stop pod sandbox %s: %s: %w", id, st.name, err)
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

func (p *sandboxPipeline) removePodSandbox(ctx context.Context, req *runtimeapi.RemovePodSandboxRequest, next cri.Forward[*runtimeapi.RemovePodSandboxRequest, *runtimeapi.RemovePodSandboxResponse]) (*runtimeapi.RemovePodSandboxResponse, error) {
	resp, err := next(ctx, req)
	if err != nil {
		return nil, err
	}
	id := req.GetPodSandboxId()
	logger := klog.FromContext(ctx).WithValues("podSandboxID", id)
	if err := p.removed(ctx, id); err != nil {
		// The runtime removed the sandbox: the kubelet must hear so; podgate's own leftovers
		// are in the log, and the start-up rebuild drops a record the runtime no longer has.
		logger.Error(err, "Forget removed sandbox")
	}
	logger.Info("Pod sandbox removed")
	return resp, nil
}

// removed runs every stage's removed step, last stage first, and joins their errors.
func (p *sandboxPipeline) removed(ctx context.Context, id string) error {
	var errs []error
	for i := len(p.stages) - 1; i >= 0; i-- {
		if st := p.stages[i]; st.removed != nil {
			if err := st.removed(ctx, id); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", st.name, err))
			}
		}
	}
	return errors.Join(errs...)
}

// forwardStage hands the (possibly completed) request to the runtime. Its undo stops and
// removes the sandbox at the runtime.
func (p *sandboxPipeline) forwardStage() stage {
	return stage{
		name: "forward",
		run: func(ctx context.Context, sb *sandboxRun) error {
			resp, err := sb.next(ctx, sb.req)
			if err != nil {
				return err // the runtime cleans up a sandbox it failed to create
			}
			sb.resp = resp
			sb.rec.ID = resp.GetPodSandboxId()
			return nil
		},
		undo: func(ctx context.Context, sb *sandboxRun) error {
			id := sb.rec.ID
			if _, err := p.runtime.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: id}); err != nil {
				return fmt.Errorf("stop sandbox %s (the kubelet will remove it): %w", id, err)
			}
			if _, err := p.runtime.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: id}); err != nil {
				return fmt.Errorf("remove sandbox %s (the kubelet will remove it): %w", id, err)
			}
			sb.logger.Info("Removed pod sandbox podgate failed", "podSandboxID", id)
			// Not recorded yet, but a start-up rebuild may have seen the sandbox meanwhile:
			// forgetting it keeps that rebuild from adopting a sandbox that is gone.
			p.registry.Remove(id)
			return nil
		},
	}
}

// statusStage arranges for the new sandbox's verbose status to be read once, for the stages
// after it and the registry's readers: at once by a stage that needs the sandbox's namespaces
// before the answer (verify: fail, device attach), otherwise after the answer, in the
// background, so that a pod that needs nothing of it does not wait for it, and once the
// kubelet's calls have paused (quiet), so that it does not run beside them: containerd encodes
// the sandbox's whole runtime spec for it. A status the runtime does not give is noted in the
// record, not a failure: the sandbox runs, and what needs its namespace says it has none.
func (p *sandboxPipeline) statusStage() stage {
	return stage{
		name: "status",
		run: func(ctx context.Context, sb *sandboxRun) error {
			id, logger := sb.rec.ID, sb.logger
			base := registry.SandboxRecord{ID: id, RuntimeHandler: sb.rec.RuntimeHandler, CgroupParent: sb.rec.CgroupParent, Origin: sb.rec.Origin}
			// The view may be read after the kubelet's call has ended.
			vctx := context.WithoutCancel(ctx)
			sb.runtimeView = sync.OnceValues(func() (registry.SandboxRecord, error) {
				v := base
				err := registry.InspectSandbox(vctx, p.runtime, &v)
				if err != nil {
					v.Status = err.Error() // what the registry's readers see
					logger.Error(err, "Read new pod sandbox's status", "podSandboxID", id)
				}
				return v, err
			})
			view := sb.runtimeView
			sb.onAnswer(func() {
				p.background.Go(func() {
					if p.quiet != nil {
						_ = p.quiet(vctx) // vctx does not end, and the wait is bounded
					}
					if _, ok := p.registry.Sandbox(id); !ok {
						return // stopped and removed meanwhile: nothing to read
					}
					v, _ := view() // logged by the view
					p.registry.Update(id, func(r *registry.SandboxRecord) { r.FillFromRuntime(&v) })
				})
			})
			return nil
		},
	}
}

// wait waits for the status reads started after answers, until ctx ends.
func (p *sandboxPipeline) wait(ctx context.Context) error { return p.background.wait(ctx) }

// recordStage adds the sandbox to the pod registry, which persists it.
func (p *sandboxPipeline) recordStage() stage {
	return stage{
		name: "record",
		run: func(_ context.Context, sb *sandboxRun) error {
			sb.rec.Ready = true // the runtime just created it
			return p.registry.Add(sb.rec)
		},
		undo: func(_ context.Context, sb *sandboxRun) error {
			p.registry.Remove(sb.rec.ID)
			return nil
		},
		removed: func(_ context.Context, id string) error {
			p.registry.Remove(id)
			return nil
		},
	}
}
