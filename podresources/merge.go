package podresources

import (
	"cmp"
	"slices"

	v1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	pb "github.com/podgate/podgate/podresources/api/v1alpha1"
)

// mergePod builds the v1 answer for a pod podgate knows: the kubelet's answer for it (nil
// when the kubelet did not answer or does not know the pod) with podgate's DRA claims added.
//
// The rules:
//   - the containers are the kubelet's, in its order, then those of the pod's spec it did not
//     list (a pod whose RunPodSandbox is in flight may not be in the kubelet's answer yet);
//   - devices, CPUs and memory, at pod and container level, are the kubelet's, untouched;
//   - each prepared claim is listed under the containers whose spec names it, and a claim no
//     container names (a pod-level claim, such as a network device's) once, under the first
//     container; without the spec, every claim goes once under the first container. Once,
//     because the readers of pod-level claims are CNI plugins, which read a pod's containers
//     together: multus v4.3.0 collects a claim's CDI devices from every container listing it,
//     so a claim under two containers gave a second network on it the first one's device again;
//   - a claim the kubelet already lists under a container is not listed twice.
func mergePod(p *pb.Pod, spec []Container, specOK bool, kubelet *v1.PodResources) *v1.PodResources {
	out := &v1.PodResources{Name: p.GetName(), Namespace: p.GetNamespace()}
	if kubelet != nil {
		out.CpuIds, out.Memory = kubelet.GetCpuIds(), kubelet.GetMemory()
		for _, c := range kubelet.GetContainers() {
			out.Containers = append(out.Containers, &v1.ContainerResources{
				Name: c.GetName(), Devices: c.GetDevices(), CpuIds: c.GetCpuIds(), Memory: c.GetMemory(),
				DynamicResources: slices.Clone(c.GetDynamicResources()),
			})
		}
	}
	for _, c := range spec {
		if !slices.ContainsFunc(out.Containers, func(o *v1.ContainerResources) bool { return o.GetName() == c.Name }) {
			out.Containers = append(out.Containers, &v1.ContainerResources{Name: c.Name})
		}
	}
	for _, claim := range p.GetClaims() {
		if !claim.GetPrepared() {
			continue // its devices are not known yet
		}
		dr := dynamicResource(claim)
		listed := func(c *v1.ContainerResources) bool {
			return slices.ContainsFunc(c.DynamicResources, func(d *v1.DynamicResource) bool {
				return d.GetClaimNamespace() == claim.GetNamespace() && d.GetClaimName() == claim.GetName()
			})
		}
		names := func(s Container) bool { return slices.Contains(s.Claims, claim.GetPodClaimName()) }
		if !specOK || !slices.ContainsFunc(spec, names) {
			if len(out.Containers) > 0 && !slices.ContainsFunc(out.Containers, listed) {
				out.Containers[0].DynamicResources = append(out.Containers[0].DynamicResources, dr)
			}
			continue
		}
		for _, c := range out.Containers {
			naming := slices.ContainsFunc(spec, func(s Container) bool { return s.Name == c.GetName() && names(s) })
			if naming && !listed(c) {
				c.DynamicResources = append(c.DynamicResources, dr)
			}
		}
	}
	return out
}

// dynamicResource is a prepared claim as the v1 API shows it.
func dynamicResource(c *pb.Claim) *v1.DynamicResource {
	dr := &v1.DynamicResource{ClaimName: c.GetName(), ClaimNamespace: c.GetNamespace()}
	for _, d := range c.GetDevices() {
		cr := &v1.ClaimResource{DriverName: d.GetDriver(), PoolName: d.GetPool(), DeviceName: d.GetDevice()}
		for _, id := range d.GetCdiDeviceIds() {
			cr.CdiDevices = append(cr.CdiDevices, &v1.CDIDevice{Name: id})
		}
		dr.ClaimResources = append(dr.ClaimResources, cr)
	}
	return dr
}

// mergeList merges podgate's pods into the kubelet's List answer (nil when the kubelet did not
// answer): a pod both know is merged by mergePod, a pod only the kubelet knows is passed on
// as it is, a pod only podgate knows is added. The answer is ordered by namespace and name.
func mergeList(pods []*pb.Pod, containers ContainerLister, kubelet []*v1.PodResources) []*v1.PodResources {
	type key struct{ namespace, name string }
	fromKubelet := make(map[key]*v1.PodResources, len(kubelet))
	for _, pr := range kubelet {
		fromKubelet[key{pr.GetNamespace(), pr.GetName()}] = pr
	}
	// Two pods of one name (one being deleted, its successor starting): the v1 API, keyed by
	// name, shows the newer.
	ours := make(map[key]*pb.Pod, len(pods))
	for _, p := range pods {
		k := key{p.GetNamespace(), p.GetName()}
		if prev, ok := ours[k]; !ok || Newer(p, prev) {
			ours[k] = p
		}
	}
	out := make([]*v1.PodResources, 0, len(fromKubelet)+len(ours))
	for k, p := range ours {
		spec, ok := containers.Containers(p)
		out = append(out, mergePod(p, spec, ok, fromKubelet[k]))
		delete(fromKubelet, k)
	}
	for _, pr := range fromKubelet {
		out = append(out, pr)
	}
	slices.SortFunc(out, func(a, b *v1.PodResources) int {
		return cmp.Or(cmp.Compare(a.GetNamespace(), b.GetNamespace()), cmp.Compare(a.GetName(), b.GetName()))
	})
	return out
}

// Newer reports whether pod a is newer than pod b of the same name: a pod whose sandbox is
// not created yet is the newest, then the one whose sandbox was created last.
func Newer(a, b *pb.Pod) bool {
	as, bs := a.GetSandbox(), b.GetSandbox()
	switch {
	case as == nil:
		return bs != nil
	case bs == nil:
		return false
	}
	return as.GetCreatedAt().AsTime().After(bs.GetCreatedAt().AsTime())
}
