package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/klog/v2"

	"github.com/podgate/podgate/agent/compat"
	"github.com/podgate/podgate/agent/config"
	"github.com/podgate/podgate/agent/kube"
	"github.com/podgate/podgate/agent/kubeletinfo"
	"github.com/podgate/podgate/agent/tracing"
	"github.com/podgate/podgate/cri"
	"github.com/podgate/podgate/cri/imagepull"
	"github.com/podgate/podgate/cri/pipeline"
	"github.com/podgate/podgate/cri/registry"
	"github.com/podgate/podgate/dra"
	"github.com/podgate/podgate/dra/attach"
	"github.com/podgate/podgate/dra/manager"
	"github.com/podgate/podgate/podresources"
	"github.com/podgate/podgate/podresources/cgroup"
	"github.com/podgate/podgate/podresources/resources"
	"github.com/podgate/podgate/sysctl"
)

// Agent is one running podgate.
type Agent struct {
	cfg      *config.Configuration
	registry *prometheus.Registry
	version  string
	// pods is the node's pods from the API server; nil without a kubeconfig.
	pods *kube.PodLookup
	// api, when set (tests), is the Kubernetes API in place of the kubeconfig's.
	api kube.API
	// sandboxes is the pod registry, claims, intents and sysctls the features' sections of its
	// checkpoint; set by Run.
	sandboxes *registry.Registry
	claims    *manager.Claims
	intents   *attach.Intents
	sysctls   *sysctl.Records
	// rebuilt is closed once the registry has been rebuilt from the runtime.
	rebuilt  chan struct{}
	rebuilds *prometheus.CounterVec
	// peers says the kubelet's and the runtime's versions against the tested range.
	peers *compat.Peers
	// events writes pod Events; nil without the Kubernetes API.
	events *kube.EventRecorder
}

// New creates an agent from a validated configuration. version is reported in metrics and logs.
func New(cfg *config.Configuration, version string) *Agent {
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
	return &Agent{cfg: cfg, registry: reg, version: version, rebuilt: make(chan struct{}), rebuilds: rebuilds, peers: compat.NewPeers(reg)}
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

	p, services, tr, runKube, err := a.open(ctx)
	if err != nil {
		return err
	}
	defer closeAll(p.backends)
	list := a.runnables(p, services, tr, runKube)
	running := start(ctx, cancel, list)
	a.serving(logger)

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

// open does start-up up to serving: the checkpoint, the Kubernetes API, tracing, the CRI
// server with every feature, and the listeners, in the order Run's doc gives.
func (a *Agent) open(ctx context.Context) (*proxy, []service, *tracing.Tracing, func(context.Context), error) {
	if err := a.openRegistry(klog.FromContext(ctx)); err != nil {
		return nil, nil, nil, nil, err
	}
	runKube, err := a.startKube(ctx)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	a.startEvents(ctx)
	tr, err := tracing.New(ctx, a.cfg.Tracing, a.version, a.cfg.NodeName)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	p, err := a.buildProxy(ctx, tr)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	services, err := a.openServices(ctx, p)
	if err != nil {
		closeAll(p.backends)
		return nil, nil, nil, nil, err
	}
	if p.resources.MemoryQoS() {
		p.resources.ResolveAllocatable(ctx, p.kubelet.Get().Config, nil) // read once, by the kubelet view
	}
	return p, services, tr, runKube, nil
}

// runnables is everything podgate runs, in the order it starts and stops: the servers (the
// CRI socket first, so that it stops taking calls first, and right after it the work its last
// calls started), then the loops. Releases run in the same order once every run has returned.
func (a *Agent) runnables(p *proxy, services []service, tr *tracing.Tracing, runKube func(context.Context)) []runnable {
	var list []runnable
	for _, s := range services {
		list = append(list, s.runnable())
		if s.name == criServiceName {
			// No call comes in any more: let the work the last calls started end, so that its
			// results reach the registry.
			list = append(list, runnable{name: "last calls' work", stop: waitAll(p.core.Wait, p.sysctls.Wait, p.resources.Wait)})
		}
	}
	list = append(list,
		runnable{name: "tracing", release: tr.Shutdown},
		runnable{name: "kubernetes", run: loop(runKube), release: a.waitFetches},
		runnable{name: "registry", run: loop(func(ctx context.Context) { a.rebuildRegistry(ctx, p.runtime) }),
			release: func(context.Context) error { a.sandboxes.Flush(); return nil }},
		runnable{name: "runtime version", run: loop(func(ctx context.Context) { a.peers.ReadRuntime(ctx, p.runtime, rebuildBackoff) })},
		runnable{name: "image pulls", run: loop(p.pulls.Run), release: func(context.Context) error { p.pulls.Close(); return nil }},
		runnable{name: "resources", run: loop(p.resources.Run)},
	)
	if a.events != nil {
		list = append(list, runnable{name: "pod events", run: loop(a.events.Run)})
	}
	if a.pods != nil {
		list = append(list, runnable{name: "node", run: loop(func(ctx context.Context) { a.readNode(ctx, p) })})
	}
	if p.drivers != nil {
		list = append(list,
			runnable{name: "dra drivers", run: func(ctx context.Context) error {
				if err := p.drivers.Run(ctx); err != nil {
					return fmt.Errorf("dra: %w", err)
				}
				return nil
			}, release: func(context.Context) error { return p.drivers.Close() }},
			runnable{name: "dra", run: loop(p.dra.Run)},
			runnable{name: "dra host interfaces", run: loop(p.hostIfs.Run)},
		)
	}
	return list
}

// waitFetches waits for the pod fetches the last CRI calls started.
func (a *Agent) waitFetches(context.Context) error {
	if a.pods != nil {
		a.pods.WaitFetches()
	}
	return nil
}

// serving says podgate serves, in the log and to systemd.
func (a *Agent) serving(logger klog.Logger) {
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

// openRegistry reads the pod registry's checkpoint from stateDir. A damaged checkpoint stops
// start-up: podgate never starts from a silently emptied registry.
func (a *Agent) openRegistry(logger klog.Logger) error {
	if err := os.MkdirAll(a.cfg.StateDir, 0o700); err != nil {
		return fmt.Errorf("stateDir: %w", err)
	}
	st, err := openState(registry.NewCheckpoint(a.cfg.StateDir))
	if err != nil {
		return fmt.Errorf("stateDir: %w", err)
	}
	a.sandboxes, a.claims, a.intents, a.sysctls = st.sandboxes, st.claims, st.intents, st.sysctls
	writeErrors := prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: "podgate", Subsystem: "registry", Name: "checkpoint_write_errors_total",
		Help: "Background writes of the pod registry's checkpoint that failed; the next change writes it again.",
	})
	a.registry.MustRegister(writeErrors)
	a.sandboxes.OnWriteError(func(err error) {
		writeErrors.Inc()
		logger.Error(err, "Write the pod registry's checkpoint")
	})
	return nil
}

// state is what the checkpoint holds: the pod registry, and the features' records, each its
// section of the checkpoint.
type state struct {
	sandboxes *registry.Registry
	// claims are the DRA claims, intents the DRA devices attached to sandboxes or being
	// attached, sysctls each sandbox's sysctl results.
	claims  *manager.Claims
	intents *attach.Intents
	sysctls *sysctl.Records
}

// openState reads the checkpoint cp into the pod registry and the features' sections of it
// (the claims, the attach records, the sysctl records), each registered before anything
// changes the registry: a record the rebuild from the runtime drops leaves its attached devices
// as intents, an adopted sandbox gets the sysctls the runtime applied, and the PodResources
// service shows the pods' claims from the start. Every section podgate has is registered, so
// that a checkpoint is written back as it was read.
func openState(cp *registry.Checkpoint) (state, error) {
	d, err := cp.ReadAll()
	if err != nil {
		return state{}, err
	}
	st := state{sandboxes: registry.NewRegistry(cp, d)}
	if st.claims, err = manager.NewClaims(st.sandboxes); err != nil {
		return state{}, err
	}
	if st.intents, err = attach.NewIntents(st.sandboxes); err != nil {
		return state{}, err
	}
	if st.sysctls, err = sysctl.NewRecords(st.sandboxes); err != nil {
		return state{}, err
	}
	return st, nil
}

// proxy is the CRI server and what it was built from.
type proxy struct {
	server   *cri.Server
	backends []*cri.Backend
	runtime  runtimeapi.RuntimeServiceClient
	sysctls  *sysctl.Stages
	// core is the pipeline's own stages; pipeline runs every stage on the sandbox calls.
	core     *pipeline.Core
	pipeline *pipeline.Runner
	// dra prepares pods' DRA claims, attach moves their network devices into the pods.
	dra    *manager.Manager
	attach *attach.Attacher
	// drivers finds the node's DRA drivers, hostIfs their network devices' host interfaces;
	// nil when DRA is off.
	drivers *dra.Drivers
	hostIfs *dra.HostInterfaces
	// podResources is podgate's PodResources server once open, which dra.prepare auto asks
	// whether the kubelet manages a pod.
	podResources atomic.Pointer[podresources.Server]
	// pulls is the image-pull feature: PullImage's hook, the pulls' progress and Events.
	pulls *imagepull.Feature
	// resources: memory QoS and cgroup verification of containers.
	resources *resources.Hooks
	// kubelet is the node's kubelet, from which each feature's share of the work is decided.
	kubelet *kubeletinfo.View
}

// cgroupProcs lists the processes of a cgroup, for the sysctl verification's pause process
// lookup (cgroup.Procs; tests replace it).
var cgroupProcs = cgroup.Procs

// buildProxy connects the backends and creates the CRI server with the sandbox pipeline and
// podgate's other interceptors.
func (a *Agent) buildProxy(ctx context.Context, tr *tracing.Tracing) (*proxy, error) {
	metrics := cri.NewMetrics(a.registry)
	runtime, err := cri.NewBackend(ctx, "runtime", a.cfg.RuntimeEndpoint,
		append(tr.BackendOptions(), cri.WithStateFunc(metrics.BackendState("runtime", a.cfg.RuntimeEndpoint)))...)
	if err != nil {
		return nil, fmt.Errorf("runtimeEndpoint: %w", err)
	}
	p := &proxy{backends: []*cri.Backend{runtime}}
	image := runtime
	if a.cfg.ImageEndpoint != "" && a.cfg.ImageEndpoint != a.cfg.RuntimeEndpoint {
		image, err = cri.NewBackend(ctx, "image", a.cfg.ImageEndpoint,
			append(tr.BackendOptions(), cri.WithStateFunc(metrics.BackendState("image", a.cfg.ImageEndpoint)))...)
		if err != nil {
			closeAll(p.backends)
			return nil, fmt.Errorf("imageEndpoint: %w", err)
		}
		p.backends = append(p.backends, image)
	}
	node := cgroup.Detect()
	p.kubelet = newKubeletView(klog.FromContext(ctx), a.cfg.Resources.KubeletConfig, node)
	kubeletDefaults, _ := p.kubelet.Get().DefaultPodSysctls()
	policy, err := sysctlPolicy(&a.cfg.Sysctls, kubeletDefaults)
	if err != nil {
		closeAll(p.backends)
		return nil, err
	}
	p.server = cri.NewServer(runtime, image, append(tr.ServerOptions(), cri.WithMetrics(metrics), cri.WithLogger(klog.FromContext(ctx)),
		cri.WithLimits(criLimits(a.cfg.CRISocketLimits)))...)
	p.runtime = p.server.RuntimeClient()
	p.sysctls = sysctl.NewStages(policy, sysctl.VerifyMode(a.cfg.Sysctls.Verify), a.sysctls, a.registry, sysctl.WithCgroupProcs(cgroupProcs))
	a.buildDRA(ctx, p)
	p.core = pipeline.NewCore(a.sandboxes, p.runtime, pipeline.Quiet(p.server))
	var opts []pipeline.RunnerOption
	if a.events != nil {
		opts = append(opts, pipeline.WithEvents(sandboxEvents(a.events), a.cfg.Events.SandboxHeldAfter.Duration))
	}
	p.resources = resources.New(resourcesConfig(a.cfg.Resources), node, a.sandboxes, p.runtime, a.registry,
		resources.WithPods(a.pods), resources.WithQuiet(pipeline.Quiet(p.server)),
		resources.WithKubeletMemoryQoS(p.kubelet.WritesMemoryQoS))
	p.pipeline = pipeline.NewRunner(sandboxStages(p.core, p.sysctls, p.dra, p.attach, p.resources), a.sandboxes, a.registry, opts...)
	p.resources.LogNode(klog.FromContext(ctx))
	logKubeletDecisions(ctx, p.kubelet.Get(), a.cfg, p.resources.MemoryQoS())
	if err := a.newImagePulls(ctx, p); err != nil {
		closeAll(p.backends)
		return nil, err
	}
	p.register()
	return p, nil
}

// resourcesConfig is the resources feature's part of the configuration.
func resourcesConfig(c config.Resources) resources.Config {
	return resources.Config{
		MemoryQoS: c.MemoryQoS, MemoryThrottlingFactor: c.MemoryThrottlingFactor, MemoryReservationPolicy: c.MemoryReservationPolicy,
		VerifyFail: c.Verify == config.ResourcesVerifyFail, RecheckPeriod: c.RecheckPeriod.Duration,
	}
}

// buildDRA sets up the DRA stages: on with the Kubernetes API, off (saying so once) without.
func (a *Agent) buildDRA(ctx context.Context, p *proxy) {
	if a.pods == nil {
		p.dra, p.attach = manager.Off("no kubeconfig"), attach.Off()
		klog.FromContext(ctx).Info("DRA off: no kubeconfig; pods' DRA claims are left to the kubelet")
		return
	}
	p.drivers = dra.NewDrivers(
		dra.WithPluginRegistryDir(a.cfg.DRA.PluginRegistryDir),
		dra.WithCallTimeout(a.cfg.DRA.CallTimeout.Duration),
		dra.WithDriverNames(a.cfg.DRA.Drivers...),
		dra.WithRegisterer(a.registry))
	resolver := dra.NewClaimResolver(a.pods.Client(), a.cfg.DRA.Drivers)
	p.hostIfs = dra.NewHostInterfaces(a.pods.Client(), a.pods.NodeName(), a.cfg.DRA.InterfaceNameAttribute)
	var attachOpts []attach.Option
	if len(a.cfg.DRA.Attach) > 0 {
		attachOpts = append(attachOpts, attach.WithDevices(a.cfg.DRA.Attach, p.hostIfs, resolver, a.registry))
		if a.cfg.DRA.PublishNetworkData {
			attachOpts = append(attachOpts, attach.WithPublisher(a.pods.Client()))
		}
	}
	p.attach = attach.New(a.sandboxes, a.intents, attachOpts...)
	p.dra = manager.New(a.pods, p.drivers, resolver, a.claims, a.sandboxes, p.runtime, a.registry,
		manager.WithPrepare(a.cfg.DRA.Prepare),
		manager.WithKubelet(p.kubeletPods), // with auto: the kubelet, through the PodResources socket
		manager.WithSettle(a.rebuilt, p.attach),
		manager.WithHostInterfaces(p.hostIfs))
	klog.FromContext(ctx).Info("DRA on: pods' claims are prepared before their sandboxes", "prepare", a.cfg.DRA.Prepare,
		"pluginRegistryDir", a.cfg.DRA.PluginRegistryDir, "drivers", a.cfg.DRA.Drivers)
	warnAutoBlind(klog.FromContext(ctx), a.cfg)
}

// warnAutoBlind warns when dra.prepare auto has no kubelet to ask whether it manages a pod:
// auto asks the kubelet's PodResources socket through podgate's own PodResources service, and
// without either it prepares every pod's claims itself, beside a kubelet ≥ 1.34 that prepares
// them too: each claim is prepared twice, silently.
func warnAutoBlind(logger klog.Logger, cfg *config.Configuration) {
	if cfg.DRA.Prepare != config.PrepareAuto {
		return
	}
	var off string
	switch {
	case !cfg.PodResources.Enabled():
		off = "podResources.socket"
	case cfg.PodResources.KubeletSocket == nil || *cfg.PodResources.KubeletSocket == "":
		off = "podResources.kubeletSocket"
	default:
		return
	}
	logger.Error(nil, "dra.prepare auto cannot ask the kubelet whether it prepared a pod's claims: podgate prepares every pod's claims itself, and beside a kubelet 1.34 or later, which prepares them too, each claim is prepared twice. Set "+off+", or dra.prepare never beside such a kubelet",
		"off", off, "prepare", cfg.DRA.Prepare)
}

// readNode reads this node's Node object once — one GET at start-up, retried with a backoff
// while the API server does not answer — and hands it to what depends on it: the kubelet's
// version (logged against the tested range; dra.prepare auto; whether the kubelet writes memory
// QoS itself), memory QoS's ceiling without the kubelet's config file.
func (a *Agent) readNode(ctx context.Context, p *proxy) {
	logger := klog.FromContext(ctx)
	var node *corev1.Node
	err := wait.ExponentialBackoffWithContext(ctx, rebuildBackoff, func(ctx context.Context) (bool, error) {
		gctx, cancel := context.WithTimeout(ctx, nodeGetTimeout)
		defer cancel()
		n, err := a.pods.Client().GetNode(gctx, a.pods.NodeName())
		if err != nil {
			logger.V(1).Info("Node not read yet", "node", a.pods.NodeName(), "err", err)
			return false, nil
		}
		node = n
		return true, nil
	})
	if err != nil {
		return // ctx ended
	}
	a.peers.See(ctx, "kubelet", "kubelet", compat.Kubelet.Check(node.Status.NodeInfo.KubeletVersion))
	p.kubelet.LearnVersion(logger, node.Status.NodeInfo.KubeletVersion, p.resources.MemoryQoS())
	if p.resources.MemoryQoS() && p.kubelet.Get().Config == nil { // no kubelet configuration read: the Node is better than MemTotal
		p.resources.ResolveAllocatable(ctx, nil, node)
	}
	if p.drivers != nil {
		p.dra.SetKubeletVersion(ctx, node)
	}
}

// nodeGetTimeout bounds one GET of the Node: one small object.
const nodeGetTimeout = 10 * time.Second

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
