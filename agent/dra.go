package agent

import (
	"context"
	"fmt"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/klog/v2"

	"github.com/podgate/podgate/agent/config"
	"github.com/podgate/podgate/agent/kube"
	"github.com/podgate/podgate/agent/kubeletinfo"
	"github.com/podgate/podgate/agent/state"
	"github.com/podgate/podgate/dra"
	"github.com/podgate/podgate/dra/attach"
	"github.com/podgate/podgate/dra/manager"
	"github.com/podgate/podgate/podresources"
)

// The Kubernetes adapter has what the DRA feature asks of the API.
var (
	_ dra.ResourceClaimStatusClient = kube.API(nil)
	_ dra.ResourceSliceWatcher      = kube.API(nil)
	_ manager.Pods                  = (*kube.PodLookup)(nil)
)

// draFeature is DRA when it is on: the node's drivers, their network devices' host
// interfaces, the manager that prepares the pods' claims and the attacher that moves their
// network devices into the pods. With DRA off there is none: no stage, no runnable.
type draFeature struct {
	drivers *dra.Drivers
	hostIfs *dra.HostInterfaces
	manager *manager.Manager
	attach  *attach.Attacher
}

// newDRA builds the DRA feature with the Kubernetes API; without it (pods nil) DRA is off,
// which it says once, and newDRA returns nil. podRes, when podgate serves PodResources, is how
// dra.prepare auto asks the kubelet whether it manages a pod; node, whether the kubelet's
// version prepares claims.
func (a *Agent) newDRA(ctx context.Context, st *state.State, pods *kube.PodLookup, rt runtimeapi.RuntimeServiceClient, podRes *podresources.Server, node *kubeletinfo.NodeReader) *draFeature {
	logger := klog.FromContext(ctx)
	if pods == nil {
		logger.Info("DRA off: no kubeconfig; pods' DRA claims are left to the kubelet")
		return nil
	}
	cfg := a.cfg.DRA
	drivers := dra.NewDrivers(
		dra.WithPluginRegistryDir(cfg.PluginRegistryDir),
		dra.WithCallTimeout(cfg.CallTimeout.Duration),
		dra.WithDriverNames(cfg.Drivers...),
		dra.WithRegisterer(a.registry))
	resolver := dra.NewClaimResolver(pods.Client(), cfg.Drivers)
	hostIfs := dra.NewHostInterfaces(pods.Client(), pods.NodeName(), cfg.InterfaceNameAttribute)
	var attachOpts []attach.Option
	if len(cfg.Attach) > 0 {
		attachOpts = append(attachOpts, attach.WithDevices(cfg.Attach, hostIfs, resolver))
		if cfg.PublishNetworkData {
			attachOpts = append(attachOpts, attach.WithPublisher(pods.Client()))
		}
	}
	att := attach.New(st.Sandboxes, st.Intents, a.registry, attachOpts...)
	opts := []manager.Option{
		manager.WithPrepare(prepareMode(cfg.Prepare)),
		manager.WithSettle(a.rebuilt, att),
		manager.WithHostInterfaces(hostIfs),
		manager.WithSandboxHookDrivers(cfg.SandboxHookDrivers...),
		manager.WithKubeletPrepares(node.PreparesDRA),
	}
	if podRes != nil && a.cfg.PodResources.KubeletSocket != nil && *a.cfg.PodResources.KubeletSocket != "" {
		// With auto: the kubelet, asked through podgate's PodResources server, within the
		// kubelet's rate limit.
		opts = append(opts, manager.WithKubelet(kubeletAsker{podRes}))
	}
	m := manager.New(pods, drivers, resolver, st.Claims, st.Sandboxes, rt, a.registry, opts...)
	logger.Info("DRA on: pods' claims are prepared before their sandboxes", "prepare", cfg.Prepare,
		"pluginRegistryDir", cfg.PluginRegistryDir, "drivers", cfg.Drivers, "sandboxHookDrivers", cfg.SandboxHookDrivers)
	warnAutoBlind(logger, a.cfg)
	return &draFeature{drivers: drivers, hostIfs: hostIfs, manager: m, attach: att}
}

// prepareMode is dra.prepare as the DRA manager takes it. The configuration is valid
// (Validate): its words are the operator's contract, the manager's values its behaviour.
func prepareMode(prepare string) manager.Prepare {
	switch prepare {
	case config.PrepareNever:
		return manager.PrepareNever
	case config.PrepareAuto:
		return manager.PrepareAuto
	default:
		return manager.PrepareAlways
	}
}

// runnables are what DRA runs: the drivers' discovery (its failure ends podgate), the
// reconciler, the host interfaces' watch.
func (d *draFeature) runnables() []runnable {
	return []runnable{
		{name: "dra drivers", run: func(ctx context.Context) error {
			if err := d.drivers.Run(ctx); err != nil {
				return fmt.Errorf("dra: %w", err)
			}
			return nil
		}, release: func(context.Context) error { return d.drivers.Close() }},
		{name: "dra", run: loop(d.manager.Run)},
		{name: "dra host interfaces", run: loop(d.hostIfs.Run)},
	}
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
