package agent

import (
	"context"
	"fmt"

	"k8s.io/klog/v2"

	"github.com/podgate/podgate/agent/kube"
	"github.com/podgate/podgate/agent/podview"
	"github.com/podgate/podgate/agent/state"
	"github.com/podgate/podgate/cri"
	"github.com/podgate/podgate/cri/imagepull"
	"github.com/podgate/podgate/dra/manager"
	"github.com/podgate/podgate/podresources"
	"github.com/podgate/podgate/podresources/resources"
)

// newChanges is what podgate's PodResources watches are told of the registry's changes; nil
// when podResources.socket is "".
func (a *Agent) newChanges() *podresources.Broadcaster {
	if !a.cfg.PodResources.Enabled() {
		return nil
	}
	return podresources.NewBroadcaster(podresources.DefaultMaxWatchers, podresources.DefaultWatcherBuffer)
}

// newPodResources builds podgate's PodResources server, its watches told of every change of
// the registry through b (newChanges); it does not listen yet (openPodResources). nil when
// podResources.socket is "".
func (a *Agent) newPodResources(ctx context.Context, st *state.State, b *podresources.Broadcaster, pods *kube.PodLookup, pulls *imagepull.Feature, res *resources.Hooks) (*podresources.Server, error) {
	cfg := a.cfg.PodResources
	if !cfg.Enabled() {
		return nil, nil
	}
	s, err := podresources.NewServer(podresources.Options{
		Source:        &podview.Source{Registry: st.Sandboxes, Claims: st.Claims, Pulls: pulls, Informer: pods, Resources: res},
		Pulls:         podview.Pulls{Feature: pulls},
		Broadcaster:   b,
		KubeletSocket: *cfg.KubeletSocket,
		QPS:           cfg.QPS, Burst: cfg.Burst,
		KubeletQPS: cfg.KubeletQPS, KubeletBurst: cfg.KubeletBurst,
		MaxConnections: cfg.MaxConnections, MaxStreams: cfg.MaxStreams, IdleTimeout: cfg.IdleTimeout.Duration,
		MaxConnectionsPerProcess: cfg.MaxConnectionsPerProcess, MaxConnectionsPerUser: cfg.MaxConnectionsPerUser,
		MaxStreamsPerProcess: cfg.MaxStreamsPerProcess, MaxStreamsPerUser: cfg.MaxStreamsPerUser,
		MaxWatchesPerProcess: cfg.MaxWatchesPerProcess, MaxWatchesPerUser: cfg.MaxWatchesPerUser,
		QPSPerUser: cfg.QPSPerUser, BurstPerUser: cfg.BurstPerUser,
		HeaderTimeout: cfg.HeaderTimeout.Duration, WatchSendTimeout: cfg.WatchSendTimeout.Duration,
		Registerer: a.registry,
		Logger:     klog.FromContext(ctx),
	})
	if err != nil {
		return nil, err
	}
	return s, nil
}

// openPodResources takes the PodResources socket for s.
func (a *Agent) openPodResources(ctx context.Context, s *podresources.Server) (service, error) {
	cfg := a.cfg.PodResources
	l, err := cri.Listen(*cfg.Socket, cri.SocketOptions{Mode: 0o660, Group: cfg.SocketGroup})
	if err != nil {
		return service{}, fmt.Errorf("podResources.socket: %w", err)
	}
	klog.FromContext(ctx).Info("Serving PodResources", "socket", *cfg.Socket, "kubeletSocket", *cfg.KubeletSocket, "qps", cfg.QPS, "burst", cfg.Burst,
		"kubeletQPS", cfg.KubeletQPS, "kubeletBurst", cfg.KubeletBurst, "maxConnections", cfg.MaxConnections, "maxStreams", cfg.MaxStreams, "idleTimeout", cfg.IdleTimeout,
		"perProcess", fmt.Sprintf("%d connections, %d calls, %d watches", cfg.MaxConnectionsPerProcess, cfg.MaxStreamsPerProcess, cfg.MaxWatchesPerProcess),
		"perUser", fmt.Sprintf("%d connections, %d calls, %d watches, qps %v, burst %d", cfg.MaxConnectionsPerUser, cfg.MaxStreamsPerUser, cfg.MaxWatchesPerUser, cfg.QPSPerUser, cfg.BurstPerUser),
		"headerTimeout", cfg.HeaderTimeout, "watchSendTimeout", cfg.WatchSendTimeout)
	return service{
		name:  "PodResources",
		serve: func() error { return s.Serve(l) },
		shutdown: func(ctx context.Context) error {
			s.Shutdown(ctx)
			return nil
		},
		close: func() { l.Close() },
	}, nil
}

// kubeletAsker is podgate's PodResources server as the DRA manager asks the kubelet.
type kubeletAsker struct{ *podresources.Server }

var _ manager.KubeletPods = kubeletAsker{}

// NotListening implements manager.KubeletPods.
func (kubeletAsker) NotListening(err error) bool { return podresources.IsKubeletNotListening(err) }
