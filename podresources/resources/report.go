package resources

import (
	"maps"
	"math"
	"slices"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/protobuf/types/known/timestamppb"
	"k8s.io/apimachinery/pkg/types"

	"github.com/podgate/podgate/cri/registry"
	pb "github.com/podgate/podgate/podresources/api/v1alpha1"
	"github.com/podgate/podgate/podresources/cgroup"
)

// Describe adds the node's cgroups, its containers' resources (asked, held, verification) and
// its pod-level resources to a pod's message of the PodResources extension, whose readers see no other view of them.
func (s *Hooks) Describe(p *pb.Pod) {
	reason := s.qosOff
	switch {
	case s.memoryQoS || reason != "":
	case !s.node.MemoryQoS:
		reason = s.node.MemoryQoSReason // not asked for, and not applicable here either
	default:
		reason = "resources.memoryQoS is off"
	}
	cg := &pb.Cgroup{
		Mode: s.node.Mode, V2Controllers: slices.Clone(s.node.V2Controllers),
		MemoryQos: s.memoryQoS, MemoryQosReason: reason,
		Driver: p.GetCgroup().GetDriver(), // from the sandbox's runtime spec
	}
	ctrs := s.containers.PodContainers(types.UID(p.GetUid()))
	slices.SortFunc(ctrs, func(a, b registry.ContainerRecord) int { return strings.Compare(a.Name+a.ID, b.Name+b.ID) })
	for _, c := range ctrs {
		if c.CgroupsPath != "" && cg.Driver == "" {
			cg.Driver = cgroup.Driver(c.CgroupsPath)
		}
		e, _ := s.records.get(c.ID)
		m := &pb.Container{
			Id: c.ID, Name: c.Name, Asked: askedResources(e.asked), Held: heldResources(e.held),
			Verification: e.verification, Mismatches: e.mismatches, Error: e.err, CgroupsPath: c.CgroupsPath,
		}
		if !e.verifiedAt.IsZero() {
			m.VerifiedAt = timestamppb.New(e.verifiedAt)
		}
		p.Containers = append(p.Containers, m)
	}
	p.Cgroup = cg
	p.PodResources = s.describePod(p.GetSandbox().GetId())
}

// describePod shows the sandbox's pod-level resources; nil when podgate saw neither its
// RunPodSandbox nor a resize.
func (s *Hooks) describePod(id string) *pb.PodLevelResources {
	e, ok := s.podLevel.get(id)
	if !ok || id == "" {
		return nil
	}
	out := &pb.PodLevelResources{
		Asked: askedResources(podSpec(e.resources, e.overhead)), Overhead: askedResources(cgroup.SpecResources(e.overhead, cgroup.WithSwapController(false), cgroup.WithHugetlbController(false))),
		Held: heldResources(e.held), Verification: e.verification, Mismatches: slices.Clone(e.mismatches), Error: e.err,
		CgroupParent: e.cgroupParent, Resizes: e.resizes,
	}
	out.Requests, out.Limits = podQuantities(e.resources, e.overhead, s.pageSize)
	if !e.verifiedAt.IsZero() {
		out.VerifiedAt = timestamppb.New(e.verifiedAt)
	}
	return out
}

// askedResources shows a runtime spec's resources.
func askedResources(r *specs.LinuxResources) *pb.Resources {
	if r == nil {
		return nil
	}
	out := &pb.Resources{}
	if c := r.CPU; c != nil {
		out.CpuShares, out.CpuQuota, out.CpuPeriod = c.Shares, c.Quota, c.Period
		out.CpusetCpus, out.CpusetMems = c.Cpus, c.Mems
	}
	if m := r.Memory; m != nil {
		out.MemoryMax, out.MemorySwap = m.Limit, m.Swap
	}
	for _, h := range r.HugepageLimits {
		if out.Hugepages == nil {
			out.Hugepages = map[string]uint64{}
		}
		out.Hugepages[h.Pagesize] = h.Limit
	}
	if len(r.Unified) > 0 {
		out.Unified = maps.Clone(r.Unified)
	}
	return out
}

// heldResources shows what a container's cgroup held.
func heldResources(h *cgroup.Held) *pb.Resources {
	if h == nil {
		return nil
	}
	out := &pb.Resources{
		CpuShares: h.CPUShares, CpuWeight: h.CPUWeight, CpuQuota: h.CPUQuota, CpuPeriod: h.CPUPeriod,
		CpusetCpus: h.CPUs, CpusetCpusEffective: h.EffectiveCPUs, CpusetMems: h.Mems,
		MemoryMax: h.MemoryLimit, MemoryMin: h.MemoryMin, MemoryHigh: h.MemoryHigh, MemorySwap: h.Swap,
	}
	for size, limit := range h.Hugepages {
		if out.Hugepages == nil {
			out.Hugepages = map[string]uint64{}
		}
		if limit < 0 {
			out.Hugepages[size] = math.MaxUint64 // unlimited, as the proto says
			continue
		}
		out.Hugepages[size] = uint64(limit)
	}
	if h.Version == 2 && len(h.Files) > 0 {
		out.Unified = maps.Clone(h.Files)
	}
	return out
}
