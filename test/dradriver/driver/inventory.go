package driver

import (
	"fmt"
	"strconv"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/resourceslice"
)

const (
	// InterfaceNameAttribute is the device attribute, published in the ResourceSlice, that names
	// the host interface the driver creates for the device.
	InterfaceNameAttribute resourceapi.QualifiedName = "interfaceName"

	// PeerSuffix is appended to a device's interface name to name the other end of its veth pair.
	PeerSuffix = "p"

	// maxInterfaceName is IFNAMSIZ-1: the kernel refuses longer interface names.
	maxInterfaceName = 15
)

// Device is one network device of the driver and the host interface that stands for it.
type Device struct {
	// Name is the device's name in the ResourceSlice and in allocation results ("nic0").
	Name string `json:"device"`
	// Interface is the name of the host interface created on prepare ("pgnic0").
	Interface string `json:"interface"`
	// Peer is the name of the other end of the veth pair ("pgnic0p").
	Peer string `json:"peer"`
}

// Inventory returns the n devices of a driver whose interfaces are named prefix0..prefix(n-1).
func Inventory(n int, prefix string) ([]Device, error) {
	if n < 1 {
		return nil, fmt.Errorf("device count %d: must be at least 1", n)
	}
	if prefix == "" {
		return nil, fmt.Errorf("empty interface prefix")
	}
	devices := make([]Device, n)
	for i := range devices {
		ifName := prefix + strconv.Itoa(i)
		if len(ifName+PeerSuffix) > maxInterfaceName {
			return nil, fmt.Errorf("interface name %q: with its peer suffix longer than %d bytes", ifName, maxInterfaceName)
		}
		devices[i] = Device{Name: "nic" + strconv.Itoa(i), Interface: ifName, Peer: ifName + PeerSuffix}
	}
	return devices, nil
}

// driverResources is what the driver publishes: one pool named after the node, one slice, every
// device with its interface name as attribute.
func driverResources(pool string, devices []Device) resourceslice.DriverResources {
	slice := resourceslice.Slice{Devices: make([]resourceapi.Device, 0, len(devices))}
	for _, dev := range devices {
		ifName := dev.Interface
		slice.Devices = append(slice.Devices, resourceapi.Device{
			Name: dev.Name,
			Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
				InterfaceNameAttribute: {StringValue: &ifName},
			},
		})
	}
	return resourceslice.DriverResources{
		Pools: map[string]resourceslice.Pool{pool: {Slices: []resourceslice.Slice{slice}}},
	}
}
