package manager

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/podgate/podgate/dra"
)

// SpecContainers lists a pod's containers as the kubelet's PodResources lists them (the
// restartable init containers, then the containers), with the claims each uses.
func SpecContainers(pod *corev1.Pod) []ContainerClaims {
	var out []ContainerClaims
	add := func(c *corev1.Container) {
		cc := ContainerClaims{Name: c.Name}
		for _, rc := range c.Resources.Claims {
			cc.Claims = append(cc.Claims, rc.Name)
		}
		out = append(out, cc)
	}
	for i := range pod.Spec.InitContainers {
		if c := &pod.Spec.InitContainers[i]; c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways {
			add(c)
		}
	}
	for i := range pod.Spec.Containers {
		add(&pod.Spec.Containers[i])
	}
	return out
}

// describeNetwork fills in the network data of the claims' prepared devices that are network
// interfaces: the host interface from the driver's ResourceSlice, the name, MTU and addresses
// from the claim's configuration. A meta-CNI plugin reads them from the PodResources service
// while CNI runs. A device that is no network interface (or whose data cannot be read) keeps
// none; that is not an error of the prepare.
func (d *Manager) describeNetwork(ctx context.Context, claims []ClaimRecord) {
	if d.hostIfs == nil {
		return
	}
	logger := klog.FromContext(ctx)
	for i := range claims {
		c := &claims[i]
		if !c.Prepared || len(c.Devices) == 0 {
			continue
		}
		claim, err := d.claims.Claim(ctx, c.Namespace, c.Name)
		if err != nil {
			logger.V(4).Info("No network data for the claim's devices", "claim", klog.KRef(c.Namespace, c.Name), "err", err)
			continue
		}
		for j := range c.Devices {
			dev := &c.Devices[j]
			host, ok, err := d.hostIfs.Describe(ctx, dev.Driver, dev.Pool, dev.Device)
			if err != nil {
				logger.Info("Cannot read the device's host interface; it is shown without network data", "device", dev.Driver+"/"+dev.Pool+"/"+dev.Device, "err", err)
			}
			if !ok {
				continue
			}
			n := &DeviceNetworkRecord{HostInterface: host, InterfaceName: host}
			if result, ok := dra.AllocationResult(claim, dev.Driver, dev.Pool, dev.Device); ok {
				cfg, _, err := dra.InterfaceConfigFor(claim, result)
				if err != nil {
					logger.Info("Claim's interface configuration is invalid; its network data shows the host interface only",
						"claim", klog.KRef(c.Namespace, c.Name), "device", dev.Driver+"/"+dev.Pool+"/"+dev.Device, "err", err)
				} else {
					if cfg.Name != "" {
						n.InterfaceName = cfg.Name
					}
					n.MTU, n.Addresses = cfg.MTU, cfg.Addresses
				}
			}
			dev.Network = n
		}
	}
}
