package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/klog/v2"

	"github.com/podgate/podgate/agent/compat"
	"github.com/podgate/podgate/agent/config"
	"github.com/podgate/podgate/agent/kube"
	"github.com/podgate/podgate/agent/kubeletinfo"
	"github.com/podgate/podgate/agent/podview"
	"github.com/podgate/podgate/agent/state"
	"github.com/podgate/podgate/agent/tracing"
	"github.com/podgate/podgate/cri"
	"github.com/podgate/podgate/cri/imagepull"
	"github.com/podgate/podgate/cri/pipeline"
	"github.com/podgate/podgate/cri/registry"
	"github.com/podgate/podgate/podresources"
	"github.com/podgate/podgate/podresources/cgroup"
	"github.com/podgate/podgate/podresources/resources"
	"github.com/podgate/podgate/sysctl"
)

// Agent is one running podgate: what New was given, and the metrics it made. What Run builds
// is Run's: each piece is built from the pieces it needs, in the order their types force
// (open), and held by the proxy.
type Agent struct {
	cfg      *config.Configuration
	version  string
	registry *prometheus.Registry
	// api, when set (WithKubernetesAPI), is the Kubernetes API in place of the kubeconfig's.
	api kube.API
	// rebuilt is closed once the registry has been rebuilt from the runtime.
	rebuilt  chan struct{}
	rebuilds *prometheus.CounterVec
	// peers says the kubelet's and the runtime's versions against the tested range.
	peers *compat.Peers
	// serving, when set (tests), is told of what Run built once it serves.
	serving func(*proxy)
}

// Option configures an Agent.
type Option func(*Agent)

// WithKubernetesAPI has the agent use api in place of the kubeconfig's client (tests, with
// test/kubefake): the Kubernetes API is on whatever the configuration's kubeconfig says.
func WithKubernetesAPI(api kube.API) Option { return func(a *Agent) { a.api = api } }

// New creates an agent from a validated configuration. version is reported in metrics and logs.
func New(cfg *config.Configuration, version string, opts ...Option) *Agent {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	buildInfo := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: "podgate", Name: "build_info", Help: "podgate's version; always 1.",
	}, []string{"version"})
	buildInfo.WithLabelValues(version).Set(1)
	rebuilds := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "podgate", Subsystem: "registry", Name: "rebuilds_total",
		Help: "Attempts to rebuild the pod registry from the runtime at start-up, by result (ok, error: the runtime did not answer; podgate retries).",
	}, []string{"result"})
	reg.MustRegister(buildInfo, rebuilds)
	a := &Agent{cfg: cfg, registry: reg, version: version, rebuilt: make(chan struct{}), rebuilds: rebuilds, peers: compat.NewPeers(reg)}
	for _, o := range opts {
		o(a)
	}
	return a
}

// Run serves until ctx ends, then shuts down gracefully: it stops accepting CRI connections,
// ends open streams, lets unary calls finish within the grace period, and returns nil. It
// returns an error when start-up fails or a server fails while running.
//
// Start-up is ordered so that a podgate that cannot run changes nothing: the checkpoint is
// read, the CRI socket is taken (a second podgate stops there), and only then are the node's
// sysctls written and the other servers opened. What runs then is one list (runnables).
func (a *Agent) Run(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)

	p, services, err := a.open(ctx)
	if err != nil {
		return err
	}
	defer closeAll(p.backends)
	list := a.runnables(p, services)
	running := start(ctx, cancel, list)
	a.logServing(logger)
	if a.serving != nil {
		a.serving(p)
	}

	<-ctx.Done()
	cause := context.Cause(ctx)
	if errors.Is(cause, context.Canceled) {
		cause = nil
	}
	logger.Info("Shutting down", "reason", context.Cause(ctx), "gracePeriod", a.cfg.ShutdownGracePeriod.String())
	_, _ = daemon.SdNotify(false, daemon.SdNotifyStopping) // best effort: systemd stops us anyway

	// The parent context is done: shutdown gets its own, bounded one.
	shutdownCtx, done := context.WithTimeoutCause(context.WithoutCancel(ctx), a.cfg.ShutdownGracePeriod.Duration,
		errors.New("shutdown grace period over"))
	defer done()
	shutdown(shutdownCtx, list, running)
	logger.Info("Stopped")
	return cause
}

// open does start-up up to serving, in the order Run's doc gives and the types force: the
// state on disk and the Kubernetes API (each on its own), the pod Events (from the API), then
// the CRI server with every feature (from all three and tracing), then the listeners.
func (a *Agent) open(ctx context.Context) (*proxy, []service, error) {
	changes := a.newChanges()
	st, err := a.openState(klog.FromContext(ctx), changes)
	if err != nil {
		return nil, nil, err
	}
	pods, err := a.newKube(ctx)
	if err != nil {
		return nil, nil, err
	}
	events := a.newEvents(ctx, pods)
	tr, err := tracing.New(ctx, a.cfg.Tracing, a.version, a.cfg.NodeName)
	if err != nil {
		return nil, nil, err
	}
	p, err := a.buildProxy(ctx, st, changes, pods, events, tr)
	if err != nil {
		return nil, nil, err
	}
	services, err := a.openServices(ctx, p)
	if err != nil {
		closeAll(p.backends)
		return nil, nil, err
	}
	if p.resources.MemoryQoS() {
		p.resources.ResolveAllocatable(ctx, p.kubelet.Get().Config, nil) // read once, by the kubelet view
	}
	return p, services, nil
}

// runnables is everything podgate runs, in the order it starts and stops: the servers (the
// CRI socket first, so that it stops taking calls first, and right after it the work its last
// calls started), then the loops. Releases run in the same order once every run has returned.
func (a *Agent) runnables(p *proxy, services []service) []runnable {
	var list []runnable
	for _, s := range services {
		list = append(list, s.runnable())
		if s.name == criServiceName {
			// No call comes in any more: let the work the last calls started end, so that its
			// results reach the registry.
			list = append(list, runnable{name: "last calls' work", stop: waitAll(p.core.Wait, p.sysctls.Wait, p.resources.Wait)})
		}
	}
	sandboxes := p.state.Sandboxes
	list = append(list, runnable{name: "tracing", release: p.tracing.Shutdown})
	if pods := p.pods; pods != nil {
		list = append(list, runnable{name: "kubernetes", run: loop(func(ctx context.Context) { runKube(ctx, pods) }),
			release: func(context.Context) error { pods.WaitFetches(); return nil }})
	}
	list = append(list,
		runnable{name: "registry", run: loop(func(ctx context.Context) { a.rebuildRegistry(ctx, sandboxes, p.runtime) }),
			release: func(context.Context) error { sandboxes.Flush(); return nil }},
		runnable{name: "runtime version", run: loop(func(ctx context.Context) { a.peers.ReadRuntime(ctx, p.runtime, rebuildBackoff) })},
		runnable{name: "image pulls", run: loop(p.pulls.Run), release: func(context.Context) error { p.pulls.Close(); return nil }},
		runnable{name: "resources", run: loop(p.resources.Run)},
	)
	if p.events != nil {
		list = append(list, runnable{name: "pod events", run: loop(p.events.Run)})
	}
	if p.node != nil {
		list = append(list, runnable{name: "node", run: loop(func(ctx context.Context) { p.node.Run(ctx, rebuildBackoff) })})
	}
	if p.dra != nil {
		list = append(list, p.dra.runnables()...)
	}
	return list
}

// logServing says podgate serves, in the log and to systemd.
func (a *Agent) logServing(logger klog.Logger) {
	logger.Info("podgate serving CRI", "version", a.version, "socket", a.cfg.CRISocket,
		"runtimeEndpoint", a.cfg.RuntimeEndpoint, "imageEndpoint", a.cfg.ImageBackend(),
		"metricsAddress", *a.cfg.MetricsAddress, "stateDir", a.cfg.StateDir)
	// Tell systemd podgate is ready only now that the socket accepts calls, so a kubelet
	// ordered After=podgate.service finds it.
	if ok, err := daemon.SdNotify(false, daemon.SdNotifyReady); err != nil {
		logger.Error(err, "Notify systemd")
	} else if ok {
		logger.V(2).Info("Notified systemd: ready")
	}
}

// openState reads the pod registry's checkpoint from stateDir, its write errors counted and
// logged, every change of a pod told to changes (nil: none). A damaged checkpoint stops
// start-up: podgate never starts from a silently emptied registry.
func (a *Agent) openState(logger klog.Logger, changes *podresources.Broadcaster) (*state.State, error) {
	if err := os.MkdirAll(a.cfg.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("stateDir: %w", err)
	}
	writeErrors := prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: "podgate", Subsystem: "registry", Name: "checkpoint_write_errors_total",
		Help: "Background writes of the pod registry's checkpoint that failed; the next change writes it again.",
	})
	a.registry.MustRegister(writeErrors)
	opts := []registry.Option{registry.WithWriteErrors(func(err error) {
		writeErrors.Inc()
		logger.Error(err, "Write the pod registry's checkpoint")
	})}
	if changes != nil {
		opts = append(opts, registry.WithPodChanges(podview.Changes(changes)))
	}
	st, err := state.Read(registry.NewCheckpoint(a.cfg.StateDir), opts...)
	if err != nil {
		return nil, fmt.Errorf("stateDir: %w", err)
	}
	return st, nil
}

// proxy is the CRI server, every feature, and what they were built from; buildProxy makes it
// whole.
type proxy struct {
	// What the proxy was built from: the state on disk, the Kubernetes API's pods and the pod
	// Events (each nil without the API), tracing.
	state   *state.State
	pods    *kube.PodLookup
	events  *kube.EventRecorder
	tracing *tracing.Tracing

	server   *cri.Server
	backends []*cri.Backend
	runtime  runtimeapi.RuntimeServiceClient
	// kubelet is the node's kubelet, from which each feature's share of the work is decided.
	kubelet *kubeletinfo.View
	// node reads the Node (the kubelet's version) for kubelet and what else depends on it;
	// nil without the Kubernetes API.
	node *kubeletinfo.NodeReader

	sysctls *sysctl.Stages
	// core is the pipeline's own stages; pipeline runs every stage on the sandbox calls.
	core     *pipeline.Core
	pipeline *pipeline.Runner
	// dra is the DRA feature; nil when it is off (no Kubernetes API).
	dra *draFeature
	// pulls is the image-pull feature: PullImage's hook, the pulls' progress and Events.
	pulls *imagepull.Feature
	// resources: memory QoS and cgroup verification of containers.
	resources *resources.Hooks
	// podResources is podgate's PodResources server, listening once openServices opened its
	// socket; nil when podResources.socket is "".
	podResources *podresources.Server
}

// cgroupProcs lists the processes of a cgroup, for the sysctl verification's pause process
// lookup (cgroup.Procs; tests replace it).
var cgroupProcs = cgroup.Procs

// detectCgroups finds the node's cgroups, which decide what the resources feature can do
// (cgroup.Detect; tests replace it to run memory QoS on a node without the cgroup v2 memory
// controller).
var detectCgroups = cgroup.Detect

// buildProxy connects the backends and builds the CRI server with the sandbox pipeline and
// podgate's other interceptors, from the state on disk, the Kubernetes API's pods and the
// pod Events (nil without the API).
func (a *Agent) buildProxy(ctx context.Context, st *state.State, changes *podresources.Broadcaster, pods *kube.PodLookup, events *kube.EventRecorder, tr *tracing.Tracing) (_ *proxy, err error) {
	logger := klog.FromContext(ctx)
	metrics := cri.NewMetrics(a.registry)
	backends, err := a.connectBackends(ctx, metrics, tr)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			closeAll(backends)
		}
	}()
	node := detectCgroups()
	kubelet := newKubeletView(logger, a.cfg.Resources.KubeletConfig, node)
	kubeletDefaults, _ := kubelet.Get().DefaultPodSysctls()
	policy, err := sysctlPolicy(&a.cfg.Sysctls, kubeletDefaults)
	if err != nil {
		return nil, err
	}
	server := cri.NewServer(backends[0], backends[len(backends)-1], append(tr.ServerOptions(), cri.WithMetrics(metrics), cri.WithLogger(logger),
		cri.WithLimits(criLimits(a.cfg.CRISocketLimits)))...)
	runtime := server.RuntimeClient()
	sysctls := sysctl.NewStages(policy, sysctl.VerifyMode(a.cfg.Sysctls.Verify), st.Sysctls, a.registry, sysctl.WithCgroupProcs(cgroupProcs))
	core := pipeline.NewCore(st.Sandboxes, runtime, pipeline.Quiet(server))
	res := resources.New(resourcesConfig(a.cfg.Resources), node, st.Sandboxes, runtime, a.registry,
		resourcesOptions(pods, pipeline.Quiet(server), kubelet)...)
	pulls, err := a.newImagePulls(ctx, pods, events, kubelet)
	if err != nil {
		return nil, err
	}
	podRes, err := a.newPodResources(ctx, st, changes, pods, pulls, res)
	if err != nil {
		return nil, err
	}
	var nodeRead *kubeletinfo.NodeReader
	if pods != nil {
		nodeRead = kubeletinfo.NewNodeReader(logger, pods, kubelet, a.learnNode(kubelet, res))
	}
	draF := a.newDRA(ctx, st, pods, runtime, podRes, nodeRead)
	var runnerOpts []pipeline.RunnerOption
	if events != nil {
		runnerOpts = append(runnerOpts, pipeline.WithEvents(sandboxEvents(events), a.cfg.Events.SandboxHeldAfter.Duration))
	}
	p := &proxy{
		state: st, pods: pods, events: events, tracing: tr,
		server: server, backends: backends, runtime: runtime, kubelet: kubelet, node: nodeRead,
		sysctls: sysctls, core: core, dra: draF, pulls: pulls, resources: res, podResources: podRes,
		pipeline: pipeline.NewRunner(sandboxStages(core, sysctls, draF, res), st.Sandboxes, a.registry, runnerOpts...),
	}
	res.LogNode(logger)
	logKubeletDecisions(ctx, kubelet.Get(), a.cfg, res.MemoryQoS())
	p.register()
	return p, nil
}

// connectBackends connects the runtime's endpoint and, when it is another, the image
// service's: the runtime first, the image service last (the same one when they are one).
func (a *Agent) connectBackends(ctx context.Context, metrics *cri.Metrics, tr *tracing.Tracing) ([]*cri.Backend, error) {
	runtime, err := cri.NewBackend(ctx, "runtime", a.cfg.RuntimeEndpoint,
		append(tr.BackendOptions(), cri.WithStateFunc(metrics.BackendState("runtime", a.cfg.RuntimeEndpoint)))...)
	if err != nil {
		return nil, fmt.Errorf("runtimeEndpoint: %w", err)
	}
	if a.cfg.ImageEndpoint == "" || a.cfg.ImageEndpoint == a.cfg.RuntimeEndpoint {
		return []*cri.Backend{runtime}, nil
	}
	image, err := cri.NewBackend(ctx, "image", a.cfg.ImageEndpoint,
		append(tr.BackendOptions(), cri.WithStateFunc(metrics.BackendState("image", a.cfg.ImageEndpoint)))...)
	if err != nil {
		closeAll([]*cri.Backend{runtime})
		return nil, fmt.Errorf("imageEndpoint: %w", err)
	}
	return []*cri.Backend{runtime, image}, nil
}

// resourcesConfig is the resources feature's part of the configuration.
func resourcesConfig(c config.Resources) resources.Config {
	return resources.Config{
		MemoryQoS: c.MemoryQoS, MemoryThrottlingFactor: c.MemoryThrottlingFactor, MemoryReservationPolicy: c.MemoryReservationPolicy,
		VerifyFail: c.Verify == config.ResourcesVerifyFail, RecheckPeriod: c.RecheckPeriod.Duration,
	}
}

var _ resources.Pods = (*kube.PodLookup)(nil)

// resourcesOptions wire the resources feature: the pods for memory QoS (none without the
// Kubernetes API: memory QoS is off), the CRI server's quiet, the kubelet's own memory QoS.
func resourcesOptions(pods *kube.PodLookup, quiet func(context.Context) error, kubelet *kubeletinfo.View) []resources.Option {
	opts := []resources.Option{resources.WithQuiet(quiet), resources.WithKubeletMemoryQoS(kubelet.WritesMemoryQoS)}
	if pods != nil {
		opts = append(opts, resources.WithPods(pods))
	}
	return opts
}

// checkNotSelf refuses a backend endpoint that is podgate's own socket under another name (a
// symlink, a bind mount): every call would be forwarded to podgate again, without end.
// Validate catches the same path spelled differently; only the files can tell the rest.
func (a *Agent) checkNotSelf() error {
	self, err := os.Stat(a.cfg.CRISocket)
	if err != nil {
		return fmt.Errorf("criSocket: %w", err)
	}
	for _, ep := range []struct{ name, value string }{{"runtimeEndpoint", a.cfg.RuntimeEndpoint}, {"imageEndpoint", a.cfg.ImageEndpoint}} {
		p, err := cri.ParseEndpoint(ep.value)
		if err != nil {
			continue // empty imageEndpoint; Validate refused anything else
		}
		if fi, err := os.Stat(p); err == nil && os.SameFile(fi, self) {
			return fmt.Errorf("%s: %q is podgate's own criSocket: podgate would forward to itself", ep.name, ep.value)
		}
	}
	return nil
}

func closeAll(backends []*cri.Backend) {
	for _, b := range backends {
		_ = b.Close() // closing a client connection has nothing to report
	}
}

// probeTimeout bounds /readyz's call to the runtime: a probe must answer before the prober's
// own timeout (kubelet and systemd probes use about 1-5s).
const probeTimeout = 2 * time.Second
