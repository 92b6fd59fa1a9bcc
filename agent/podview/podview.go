package podview

import (
	"maps"
	"slices"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
	"k8s.io/apimachinery/pkg/types"

	"github.com/podgate/podgate/agent/kube"
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

// Source shows the pod registry, with the features' records of each pod, and the
// pulls waiting in the pull governor, to the PodResources services.
type Source struct {
	Registry  *registry.Registry
	Claims    *manager.Claims
	Pulls     *imagepull.Feature // nil: no pulls shown
	Informer  *kube.PodLookup    // nil without the Kubernetes API
	Resources *resources.Hooks   // nil: no containers shown
}

var _ podresources.Source = (*Source)(nil)

// Pods implements podresources.PodLister.
func (s *Source) Pods() ([]*pb.Pod, uint64) {
	states, rev := s.Registry.Pods()
	out := make([]*pb.Pod, 0, len(states))
	for i := range states {
		out = append(out, s.enrich(Message(&states[i])))
	}
	return out, rev
}

// Pod implements podresources.PodGetter.
func (s *Source) Pod(namespace, name string) (*pb.Pod, bool) {
	st, ok := s.Registry.PodByName(namespace, name)
	if !ok {
		return nil, false
	}
	return s.enrich(Message(&st)), true
}

// Containers implements podresources.ContainerLister: the containers recorded when the pod's
// claims were prepared, else those of the pod in the informer.
func (s *Source) Containers(p *pb.Pod) ([]podresources.Container, bool) {
	uid := types.UID(p.GetUid())
	var cs []manager.ContainerClaims
	if pc, ok := s.Claims.PodClaims(uid); ok && len(pc.Containers) > 0 {
		cs = pc.Containers
	} else if s.Informer != nil {
		pod, ok := s.Informer.Get(uid)
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
func (s *Source) enrich(p *pb.Pod) *pb.Pod {
	if s.Resources != nil {
		s.Resources.Describe(p)
	}
	if s.Pulls != nil {
		p.ImagePulls = pullMessages(s.Pulls.PodPulls(p.GetUid()))
	}
	return p
}

// Changes is the registry's change function that tells the watches of every change of
// a pod.
func Changes(b *podresources.Broadcaster) registry.PodChangeFunc {
	return func(rev uint64, before, after *registry.PodState) {
		if ev := Event(rev, before, after); ev != nil {
			b.Publish(ev)
		}
	}
}

// Event is the watch event of a change; nil when nothing a watcher sees changed.
func Event(rev uint64, before, after *registry.PodState) *pb.WatchEvent {
	switch {
	case before == nil && after == nil:
		return nil
	case before == nil:
		return &pb.WatchEvent{Type: pb.WatchEvent_POD_ADDED, Pod: Message(after), Revision: rev}
	case after == nil:
		return &pb.WatchEvent{Type: pb.WatchEvent_POD_REMOVED, Pod: Message(before), Revision: rev}
	}
	was, is := Message(before), Message(after)
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

// Message is a pod's state as the extension service shows it, the features' records of it
// read from their views in it.
func Message(st *registry.PodState) *pb.Pod {
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
