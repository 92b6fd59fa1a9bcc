package agent

import (
	"context"
	"fmt"
	"maps"
	"slices"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/podgate/podgate/agent/kube"
	"github.com/podgate/podgate/cri"
	"github.com/podgate/podgate/cri/imagepull"
	"github.com/podgate/podgate/cri/registry"
	"github.com/podgate/podgate/dra/attach"
	"github.com/podgate/podgate/dra/manager"
	"github.com/podgate/podgate/podresources"
	pb "github.com/podgate/podgate/podresources/api/v1alpha1"
	"github.com/podgate/podgate/podresources/cgroup"
	"github.com/podgate/podgate/podresources/resources"
	"github.com/podgate/podgate/sysctl"
)

// podResourcesSource shows the pod registry, with the features' records of each pod, and the
// pulls waiting in the pull governor, to the PodResources services.
type podResourcesSource struct {
	registry  *registry.Registry
	claims    *manager.Claims
	pulls     *imagepull.Feature // nil: no pulls shown
	pods      *kube.PodLookup    // nil without the Kubernetes API
	resources *resources.Hooks   // nil: no containers shown
}

var _ podresources.Source = (*podResourcesSource)(nil)

// Pods implements podresources.PodLister.
func (s *podResourcesSource) Pods() ([]*pb.Pod, uint64) {
	states, rev := s.registry.Pods()
	out := make([]*pb.Pod, 0, len(states))
	for i := range states {
		out = append(out, s.enrich(podMessage(&states[i])))
	}
	return out, rev
}

// Pod implements podresources.PodGetter.
func (s *podResourcesSource) Pod(namespace, name string) (*pb.Pod, bool) {
	st, ok := s.registry.PodByName(namespace, name)
	if !ok {
		return nil, false
	}
	return s.enrich(podMessage(&st)), true
}

// Containers implements podresources.ContainerLister: the containers recorded when the pod's
// claims were prepared, else those of the pod in the informer.
func (s *podResourcesSource) Containers(p *pb.Pod) ([]podresources.Container, bool) {
	uid := types.UID(p.GetUid())
	var cs []manager.ContainerClaims
	if pc, ok := s.claims.PodClaims(uid); ok && len(pc.Containers) > 0 {
		cs = pc.Containers
	} else if s.pods != nil {
		pod, ok := s.pods.Get(uid)
		if !ok {
			return nil, false
		}
		cs = manager.SpecContainers(pod)
	} else {
		return nil, false
	}
	out := make([]podresources.Container, 0, len(cs))
	for _, c := range cs {
		out = append(out, podresources.Container{Name: c.Name, Claims: c.Claims})
	}
	return out, true
}

// enrich adds what is not in the registry: the pod's waiting pulls, its containers' resources
// and the node's cgroups.
func (s *podResourcesSource) enrich(p *pb.Pod) *pb.Pod {
	if s.resources != nil {
		s.resources.Describe(p)
	}
	if s.pulls != nil {
		p.ImagePulls = s.pulls.PodPulls(p.GetUid())
	}
	return p
}

// publishChanges tells the watches of every change of the registry.
func publishChanges(reg *registry.Registry, b *podresources.Broadcaster) {
	reg.OnPodChange(func(rev uint64, before, after *registry.PodState) {
		if ev := podEvent(rev, before, after); ev != nil {
			b.Publish(ev)
		}
	})
}

// podEvent is the watch event of a change; nil when nothing a watcher sees changed.
func podEvent(rev uint64, before, after *registry.PodState) *pb.WatchEvent {
	switch {
	case before == nil && after == nil:
		return nil
	case before == nil:
		return &pb.WatchEvent{Type: pb.WatchEvent_POD_ADDED, Pod: podMessage(after), Revision: rev}
	case after == nil:
		return &pb.WatchEvent{Type: pb.WatchEvent_POD_REMOVED, Pod: podMessage(before), Revision: rev}
	}
	was, is := podMessage(before), podMessage(after)
	if proto.Equal(was, is) {
		return nil
	}
	typ := pb.WatchEvent_POD_UPDATED
	if allPrepared(is) && !allPrepared(was) {
		typ = pb.WatchEvent_DEVICES_PREPARED
	}
	return &pb.WatchEvent{Type: typ, Pod: is, Revision: rev}
}

func allPrepared(p *pb.Pod) bool {
	return len(p.GetClaims()) > 0 && !slices.ContainsFunc(p.GetClaims(), func(c *pb.Claim) bool { return !c.GetPrepared() })
}

// podMessage is a pod's state as the extension service shows it, the features' records of it
// read from their views in it.
func podMessage(st *registry.PodState) *pb.Pod {
	ref := st.Ref()
	p := &pb.Pod{Uid: string(st.UID), Name: ref.Name, Namespace: ref.Namespace}
	if n := len(st.Sandboxes); n > 0 {
		newest := &st.Sandboxes[n-1]
		p.Sandbox = sandboxMessage(newest, sysctl.InPod(st)[newest.ID])
		if path := newest.CgroupsPath; path != "" {
			p.Cgroup = &pb.Cgroup{Driver: cgroup.Driver(path)}
		}
	}
	if pc, ok := manager.InPod(st); ok {
		attached := attach.InPod(st)
		for _, c := range pc.Claims {
			p.Claims = append(p.Claims, claimMessage(c, st.Sandboxes, attached))
		}
	}
	return p
}

// sandboxMessage shows a sandbox with its sysctls' record (the empty one when it has none).
func sandboxMessage(rec *registry.SandboxRecord, sc sysctl.Record) *pb.Sandbox {
	state := pb.Sandbox_NOT_READY
	if rec.Ready {
		state = pb.Sandbox_READY
	}
	return &pb.Sandbox{
		Id: rec.ID, State: state, RuntimeHandler: rec.RuntimeHandler, Adopted: rec.Origin == registry.OriginAdopted,
		Netns: rec.NetNS, HostNetwork: rec.HostNetwork, Ips: slices.Clone(rec.IPs),
		CreatedAt: timestamppb.New(rec.CreatedAt),
		Sysctls: &pb.Sysctls{
			Asked: maps.Clone(sc.Asked), Applied: maps.Clone(sc.Applied),
			Verification: sc.Verification, Mismatches: slices.Clone(sc.Mismatches), Error: sc.Error,
		},
	}
}

// claimMessage shows a claim; a device that podgate attached to one of the pod's sandboxes
// (attached, by sandbox ID) shows what the pod got (its name, addresses and MAC in the pod).
func claimMessage(c manager.ClaimRecord, sandboxes []registry.SandboxRecord, attached map[string][]attach.Device) *pb.Claim {
	m := &pb.Claim{Namespace: c.Namespace, Name: c.Name, Uid: string(c.UID), PodClaimName: c.PodClaimName, Prepared: c.Prepared}
	for _, d := range c.Devices {
		dev := &pb.Device{Driver: d.Driver, Pool: d.Pool, Device: d.Device, Requests: slices.Clone(d.Requests), CdiDeviceIds: slices.Clone(d.CDIDeviceIDs)}
		if n := d.Network; n != nil {
			dev.Network = &pb.NetworkData{HostInterface: n.HostInterface, InterfaceName: n.InterfaceName, Ips: slices.Clone(n.Addresses), Mtu: int32(n.MTU)}
		}
		if att, ok := attachedDevice(c, d, sandboxes, attached); ok {
			if dev.Network == nil {
				dev.Network = &pb.NetworkData{HostInterface: att.Interface.HostName}
			}
			dev.Network.InterfaceName = att.Interface.PodName
			dev.Network.Ips = slices.Clone(att.Interface.Addresses)
			dev.Network.HardwareAddress = att.Interface.HardwareAddr
			dev.Network.Attached = true
		}
		m.Devices = append(m.Devices, dev)
	}
	return m
}

// attachedDevice finds the device among what podgate attached to the pod's newest sandbox
// that holds any.
func attachedDevice(c manager.ClaimRecord, d manager.DeviceRecord, sandboxes []registry.SandboxRecord, attached map[string][]attach.Device) (attach.Device, bool) {
	for i := len(sandboxes) - 1; i >= 0; i-- {
		for _, a := range attached[sandboxes[i].ID] {
			if a.ClaimUID == c.UID && a.Driver == d.Driver && a.Pool == d.Pool && a.Device == d.Device {
				return a, true
			}
		}
	}
	return attach.Device{}, false
}

// newPodResources builds podgate's PodResources server, its watches told of every change of
// the registry; it does not listen yet (openPodResources). nil when podResources.socket is "".
func (a *Agent) newPodResources(ctx context.Context, st *state, pods *kube.PodLookup, pulls *imagepull.Feature, res *resources.Hooks) (*podresources.Server, error) {
	cfg := a.cfg.PodResources
	if !cfg.Enabled() {
		return nil, nil
	}
	b := podresources.NewBroadcaster(podresources.DefaultMaxWatchers, podresources.DefaultWatcherBuffer)
	s, err := podresources.NewServer(podresources.Options{
		Source:        &podResourcesSource{registry: st.sandboxes, claims: st.claims, pulls: pulls, pods: pods, resources: res},
		Pulls:         pulls,
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
	publishChanges(st.sandboxes, b)
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
