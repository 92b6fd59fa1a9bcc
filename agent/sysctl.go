package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/klog/v2"

	"github.com/podgate/podgate/cri"
	"github.com/podgate/podgate/sysctl"
)

// verifyTimeout bounds a background verification: a status call and a few file reads, which
// take milliseconds unless containerd is stuck.
const verifyTimeout = 30 * time.Second

// cleanupTimeout bounds the removal of a sandbox that failed sysctl verification: containerd
// stops a fresh sandbox in well under a second, and the kubelet is waiting for our answer.
const cleanupTimeout = 30 * time.Second

// sysctlGuard checks and completes a pod's sysctls before RunPodSandbox is forwarded, and
// verifies them inside the pod once containerd has created the sandbox.
//
// With the fail policy the verification is part of RunPodSandbox, which it may fail. With
// repair and warn it runs in the background once RunPodSandbox has answered, overlapping with
// the kubelet's next calls (sandbox status, image checks); CreateContainer for the sandbox waits
// for it, so no container of the pod starts before its sysctls are verified and repaired.
type sysctlGuard struct {
	policy  *sysctl.Policy
	verify  string
	runtime runtimeapi.RuntimeServiceClient

	mu      sync.Mutex
	pending map[string]chan struct{} // sandbox ID -> closed when its verification is done

	rejected      prometheus.Counter
	defaultsAdded prometheus.Counter
	verified      *prometheus.CounterVec
	duration      *prometheus.HistogramVec
}

func newSysctlGuard(policy *sysctl.Policy, verify string, runtime runtimeapi.RuntimeServiceClient, reg prometheus.Registerer) *sysctlGuard {
	g := &sysctlGuard{
		policy:  policy,
		verify:  verify,
		runtime: runtime,
		pending: map[string]chan struct{}{},
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

func (g *sysctlGuard) register(s *cri.Server) {
	cri.Intercept(s, cri.RunPodSandbox, g.runPodSandbox)
	cri.Intercept(s, cri.CreateContainer, g.createContainer)
}

func (g *sysctlGuard) runPodSandbox(ctx context.Context, req *runtimeapi.RunPodSandboxRequest, next cri.Forward[*runtimeapi.RunPodSandboxRequest, *runtimeapi.RunPodSandboxResponse]) (*runtimeapi.RunPodSandboxResponse, error) {
	cfg := req.GetConfig()
	md := cfg.GetMetadata()
	logger := klog.FromContext(ctx).WithValues("pod", klog.KRef(md.GetNamespace(), md.GetName()))
	nsOpts := cfg.GetLinux().GetSecurityContext().GetNamespaceOptions()
	pod := sysctl.Pod{
		Namespace:   md.GetNamespace(),
		HostNetwork: nsOpts.GetNetwork() == runtimeapi.NamespaceMode_NODE,
		HostIPC:     nsOpts.GetIpc() == runtimeapi.NamespaceMode_NODE,
	}
	start := time.Now()
	want, added, err := g.policy.Complete(pod, cfg.GetLinux().GetSysctls())
	g.duration.WithLabelValues("check").Observe(time.Since(start).Seconds())
	if err != nil {
		g.rejected.Inc()
		logger.Info("Refused pod sandbox: sysctl", "err", err)
		return nil, err
	}
	if len(added) > 0 {
		// A changed copy: the cri package forwards the kubelet's bytes when req is unchanged.
		req = proto.Clone(req).(*runtimeapi.RunPodSandboxRequest)
		if req.Config.Linux == nil {
			req.Config.Linux = &runtimeapi.LinuxPodSandboxConfig{}
		}
		req.Config.Linux.Sysctls = want
		g.defaultsAdded.Add(float64(len(added)))
		logger.V(2).Info("Added node default sysctls", "sysctls", added)
	}
	resp, err := next(ctx, req)
	if err != nil || len(want) == 0 {
		return resp, err
	}
	id := resp.GetPodSandboxId()
	if g.verify == VerifyFail {
		if err := g.timedVerify(ctx, logger, id, want); err != nil {
			return nil, err
		}
		return resp, nil
	}
	done := make(chan struct{})
	g.mu.Lock()
	g.pending[id] = done
	g.mu.Unlock()
	// The kubelet's call ends when we answer; the verification must not end with it.
	vctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), verifyTimeout)
	go func() {
		defer cancel()
		_ = g.timedVerify(vctx, logger, id, want) // repair and warn never fail the sandbox
		g.mu.Lock()
		delete(g.pending, id)
		g.mu.Unlock()
		close(done)
	}()
	return resp, nil
}

func (g *sysctlGuard) timedVerify(ctx context.Context, logger klog.Logger, id string, want map[string]string) error {
	start := time.Now()
	defer func() { g.duration.WithLabelValues("verify").Observe(time.Since(start).Seconds()) }()
	return g.verifyPod(ctx, logger, id, want)
}

// createContainer holds a container of a sandbox whose sysctls are still being verified.
func (g *sysctlGuard) createContainer(ctx context.Context, req *runtimeapi.CreateContainerRequest, next cri.Forward[*runtimeapi.CreateContainerRequest, *runtimeapi.CreateContainerResponse]) (*runtimeapi.CreateContainerResponse, error) {
	g.mu.Lock()
	done := g.pending[req.GetPodSandboxId()]
	g.mu.Unlock()
	if done != nil {
		start := time.Now()
		select {
		case <-done:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		g.duration.WithLabelValues("wait").Observe(time.Since(start).Seconds())
	}
	return next(ctx, req)
}

// verifyPod reads the sandbox's sysctls inside its namespaces and applies the verify policy.
func (g *sysctlGuard) verifyPod(ctx context.Context, logger klog.Logger, id string, want map[string]string) error {
	logger = logger.WithValues("podSandboxID", id)
	wantByName := make(map[sysctl.Name]string, len(want))
	for k, v := range want {
		n, _ := sysctl.ParseName(k) // Complete accepted every name
		wantByName[n] = v
	}
	mismatch, target, err := g.mismatches(ctx, id, wantByName)
	if err != nil {
		g.verified.WithLabelValues("error").Inc()
		if g.verify == VerifyFail {
			return g.removeSandbox(ctx, logger, id, fmt.Errorf("verify sysctls: %w", err))
		}
		logger.Error(err, "Could not verify pod sysctls")
		return nil
	}
	if len(mismatch) == 0 {
		g.verified.WithLabelValues("ok").Inc()
		return nil
	}
	switch g.verify {
	case VerifyRepair:
		fix := make(map[sysctl.Name]string, len(mismatch))
		for _, m := range mismatch {
			fix[m.name] = wantByName[m.name]
		}
		if err := sysctl.Write(target, fix); err != nil {
			g.verified.WithLabelValues("error").Inc()
			logger.Error(err, "Could not repair pod sysctls", "mismatches", mismatch)
			return nil
		}
		g.verified.WithLabelValues("repaired").Inc()
		logger.Info("Repaired pod sysctls inside the pod", "mismatches", mismatch)
	case VerifyFail:
		g.verified.WithLabelValues("failed").Inc()
		return g.removeSandbox(ctx, logger, id, fmt.Errorf("sysctls do not hold in the pod: %v", mismatch))
	default:
		g.verified.WithLabelValues("mismatch").Inc()
		logger.Info("Pod sysctls do not hold in the pod", "mismatches", mismatch)
	}
	return nil
}

type sysctlMismatch struct {
	name      sysctl.Name
	got, want string
}

func (m sysctlMismatch) String() string { return fmt.Sprintf("%s=%q (want %q)", m.name, m.got, m.want) }

func (g *sysctlGuard) mismatches(ctx context.Context, id string, want map[sysctl.Name]string) ([]sysctlMismatch, sysctl.Target, error) {
	target, err := g.sandboxTarget(ctx, id)
	if err != nil {
		return nil, target, err
	}
	names := make([]sysctl.Name, 0, len(want))
	for n := range want {
		names = append(names, n)
	}
	slices.Sort(names)
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

// sandboxTarget finds the sandbox's namespaces from containerd's verbose status: the network
// namespace path of its runtime spec (what CNI used), else its pause process's.
func (g *sysctlGuard) sandboxTarget(ctx context.Context, id string) (sysctl.Target, error) {
	st, err := g.runtime.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: id, Verbose: true})
	if err != nil {
		return sysctl.Target{}, fmt.Errorf("sandbox status: %w", err)
	}
	var info struct {
		Pid         int `json:"pid"`
		RuntimeSpec struct {
			Linux struct {
				Namespaces []struct{ Type, Path string } `json:"namespaces"`
			} `json:"linux"`
		} `json:"runtimeSpec"`
	}
	if err := json.Unmarshal([]byte(st.GetInfo()["info"]), &info); err != nil {
		return sysctl.Target{}, fmt.Errorf("sandbox status info: %w", err)
	}
	if info.Pid <= 0 {
		return sysctl.Target{}, errors.New("sandbox status info has no pid")
	}
	target := sysctl.ForPID(info.Pid)
	for _, ns := range info.RuntimeSpec.Linux.Namespaces {
		if ns.Type == "network" && ns.Path != "" {
			target.NetNS = ns.Path
		}
	}
	return target, nil
}

// removeSandbox undoes a sandbox that failed verification, so the kubelet's retry starts clean,
// and returns the failure for the kubelet.
func (g *sysctlGuard) removeSandbox(ctx context.Context, logger klog.Logger, id string, cause error) error {
	// The kubelet may have given up on the call; the cleanup must still happen.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	logger.Info("Failing pod sandbox: sysctl verification failed", "err", cause)
	if _, err := g.runtime.StopPodSandbox(cctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: id}); err != nil {
		logger.Error(err, "Stop sandbox after failed sysctl verification; the kubelet will remove it")
	} else if _, err := g.runtime.RemovePodSandbox(cctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: id}); err != nil {
		logger.Error(err, "Remove sandbox after failed sysctl verification; the kubelet will remove it")
	}
	return status.Error(codes.FailedPrecondition, cause.Error())
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
