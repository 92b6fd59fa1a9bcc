package sysctl

import (
	"context"
	"fmt"
	"maps"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/klog/v2"

	"github.com/podgate/podgate/cri"
	"github.com/podgate/podgate/cri/pipeline"
)

// VerifyMode is what podgate does when a pod's sysctl does not hold the value asked for once
// containerd has created the pod (the configuration's sysctls.verify).
type VerifyMode string

// The verification modes; their values are the configuration's.
const (
	VerifyRepair VerifyMode = "repair" // write the value inside the pod's namespace
	VerifyFail   VerifyMode = "fail"   // remove the sandbox and fail RunPodSandbox
	VerifyWarn   VerifyMode = "warn"   // log and count it
)

// Stages are the pipeline's two sysctl stages: the check, which validates a pod's sysctls and
// adds the node's defaults before RunPodSandbox is forwarded, and the verification, which
// reads them back inside the pod once containerd has created it.
//
// With verify: fail the verification is part of RunPodSandbox, which it may fail. With repair
// and warn it is part of RunPodSandbox too when the pause process is found in the sandbox's
// cgroup (containerd's layout); otherwise it runs in the background once RunPodSandbox has
// answered and read the sandbox's status, overlapping with the kubelet's next calls (sandbox
// status, image checks), and CreateContainer for the sandbox waits for it, so no container of
// the pod starts before its sysctls are verified and repaired.
type Stages struct {
	policy *Policy
	verify VerifyMode
	// records are the sandboxes' sysctl records, the feature's section of the checkpoint.
	records *Records
	// cgroupProcs lists a cgroup's processes; nil: the pause process is never looked up there.
	cgroupProcs func(cgroupsPath string) ([]int, error)

	mu      sync.Mutex
	pending map[string]chan struct{} // sandbox ID -> closed when its verification is done
	// calls hold what the check stage made of each RunPodSandbox on its way to the
	// verification, which records it once the sandbox has its ID.
	calls map[*pipeline.Sandbox]Record
	// background holds the verifications running after their RunPodSandbox answered.
	background *pipeline.Background

	rejected      prometheus.Counter
	defaultsAdded prometheus.Counter
	verified      *prometheus.CounterVec
	duration      *prometheus.HistogramVec
}

// StagesOption configures [NewStages].
type StagesOption func(*Stages)

// WithCgroupProcs gives the function that lists the processes of a cgroup (its cgroup.procs),
// cgroupsPath in either cgroup driver's form, as containerd sets it. With it the verification
// finds the pause process in the sandbox's cgroup and runs during RunPodSandbox at the cost of
// a few system calls; without it, it always waits for the sandbox's verbose status.
func WithCgroupProcs(procs func(cgroupsPath string) ([]int, error)) StagesOption {
	return func(g *Stages) { g.cgroupProcs = procs }
}

// NewStages builds the sysctl stages for the pod policy and verify mode: they record each
// sandbox's sysctls in records and register their metrics with reg.
func NewStages(policy *Policy, verify VerifyMode, records *Records, reg prometheus.Registerer, opts ...StagesOption) *Stages {
	g := &Stages{
		policy:     policy,
		verify:     verify,
		records:    records,
		pending:    map[string]chan struct{}{},
		calls:      map[*pipeline.Sandbox]Record{},
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
	for _, o := range opts {
		o(g)
	}
	reg.MustRegister(g.rejected, g.defaultsAdded, g.verified, g.duration)
	return g
}

// CheckStage validates the pod's sysctls and completes them with the node's defaults. A
// refusal is InvalidArgument, before anything reaches the runtime.
func (g *Stages) CheckStage() pipeline.Stage {
	return pipeline.Stage{Name: "sysctl-check", Run: g.check,
		Holds: "checking the pod's sysctls", RefusedReason: "FailedSysctlCheck"}
}

func (g *Stages) check(ctx context.Context, sb *pipeline.Sandbox) error {
	cfg := sb.Req.GetConfig()
	nsOpts := cfg.GetLinux().GetSecurityContext().GetNamespaceOptions()
	pod := Pod{
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
	rec := Record{Asked: maps.Clone(asked), Applied: want, Verification: ResultNone}
	if len(want) > 0 {
		rec.Verification = ResultPending
	}
	g.hold(sb, rec)
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

// hold keeps what the check made of a call for its verification, until the call ends.
func (g *Stages) hold(sb *pipeline.Sandbox, rec Record) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.calls[sb] = rec
	sb.OnEnd(func() {
		g.mu.Lock()
		defer g.mu.Unlock()
		delete(g.calls, sb)
	})
}

// held is what the check made of a call; the empty record when it did not run.
func (g *Stages) held(sb *pipeline.Sandbox) Record {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.calls[sb]
}

// CreateContainer is CreateContainer's hook: it holds a container of a sandbox whose sysctls
// are still being verified in the background.
func (g *Stages) CreateContainer(ctx context.Context, req *runtimeapi.CreateContainerRequest, next cri.Forward[*runtimeapi.CreateContainerRequest, *runtimeapi.CreateContainerResponse]) (*runtimeapi.CreateContainerResponse, error) {
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

var _ cri.Interceptor[*runtimeapi.CreateContainerRequest, *runtimeapi.CreateContainerResponse] = (*Stages)(nil).CreateContainer

// Wait waits for the background verifications, until ctx ends: their results reach the
// registry before podgate stops.
func (g *Stages) Wait(ctx context.Context) error { return g.background.Wait(ctx) }
