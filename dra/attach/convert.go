package attach

import (
	"slices"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/podgate/podgate/cri/registry"
	"github.com/podgate/podgate/dra"
)

// The registry holds its own plain copies of what an attach records (it imports no feature), and
// an intent its own of the interface's configuration; these convert between them and the dra
// package's types at the attacher's edges.

// configRecord is cfg as an attach intent holds it.
func configRecord(cfg dra.InterfaceConfig) InterfaceConfig {
	return InterfaceConfig{Name: cfg.Name, MTU: cfg.MTU, Addresses: slices.Clone(cfg.Addresses)}
}

// interfaceConfig is the configuration an attach intent recorded.
func interfaceConfig(c InterfaceConfig) dra.InterfaceConfig {
	return dra.InterfaceConfig{Name: c.Name, MTU: c.MTU, Addresses: slices.Clone(c.Addresses)}
}

// attachedRecord is a as the registry's record of an attached device holds it.
func attachedRecord(a dra.Attached) registry.AttachedInterface {
	return registry.AttachedInterface{
		HostName: a.HostName, PodName: a.PodName, MTU: a.MTU, Up: a.Up, Alias: a.Alias,
		HardwareAddr: a.HardwareAddr, Addresses: slices.Clone(a.Addresses),
	}
}

// attached is what giving back a device the registry holds as attached needs.
func attached(a registry.AttachedInterface) dra.Attached {
	return dra.Attached{
		HostName: a.HostName, PodName: a.PodName, MTU: a.MTU, Up: a.Up, Alias: a.Alias,
		HardwareAddr: a.HardwareAddr, Addresses: slices.Clone(a.Addresses),
	}
}

// network is an attached device's network data, as the claim's status shows it.
func network(dev registry.AttachedDevice) dra.DeviceNetwork {
	return attached(dev.Interface).DeviceNetwork(resourceapi.DeviceRequestAllocationResult{Driver: dev.Driver, Pool: dev.Pool, Device: dev.Device})
}
