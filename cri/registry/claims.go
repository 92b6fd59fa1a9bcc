package registry

import (
	"slices"

	"k8s.io/apimachinery/pkg/types"
)

// DeviceRecord is one device a DRA driver prepared for a claim.
type DeviceRecord struct {
	Driver string `json:"driver"`
	Pool   string `json:"pool"`
	Device string `json:"device"`
	// Requests are the claim's requests the device serves.
	Requests     []string `json:"requests,omitempty"`
	CDIDeviceIDs []string `json:"cdiDeviceIDs,omitempty"`
	// Network is the device's network interface, when it is one: what a CNI plugin needs to
	// move it into the pod. Nil for other devices.
	Network *DeviceNetworkRecord `json:"network,omitempty"`
}

// DeviceNetworkRecord is a prepared network device's interface: its host name (from the
// driver's ResourceSlice) and what the claim's configuration asks of it in the pod.
type DeviceNetworkRecord struct {
	HostInterface string `json:"hostInterface,omitempty"`
	// InterfaceName, MTU and Addresses are the claim's configuration (dra.InterfaceConfig).
	InterfaceName string   `json:"interfaceName,omitempty"`
	MTU           int      `json:"mtu,omitempty"`
	Addresses     []string `json:"addresses,omitempty"`
}

// ContainerClaims names a container of the pod and the pod's claims it uses
// (resources.claims), as the pod's spec had them when the claims were prepared.
type ContainerClaims struct {
	Name   string   `json:"name"`
	Claims []string `json:"claims,omitempty"`
}

// ClaimRecord is one ResourceClaim of a pod that podgate prepares, as the pod sees it.
type ClaimRecord struct {
	UID       types.UID `json:"uid"`
	Namespace string    `json:"namespace"`
	Name      string    `json:"name"`
	// PodClaimName is the pod's name for the claim (spec.resourceClaims[].name).
	PodClaimName string `json:"podClaimName"`
	// Drivers are the drivers podgate calls for the claim.
	Drivers []string `json:"drivers"`
	// Prepared: every driver prepared the claim; Devices holds what they returned.
	Prepared bool           `json:"prepared"`
	Devices  []DeviceRecord `json:"devices,omitempty"`
}

// PodClaims is one pod's view of its DRA claims: each claim's shared record with the pod's name
// for it, and the pod's containers. The claims' section (package manager's, one record per
// claim) builds it on demand; checkpoints written before that kept one PodClaims per pod.
type PodClaims struct {
	Pod    PodRef        `json:"pod"`
	Claims []ClaimRecord `json:"claims"`
	// Containers are the pod's containers (restartable init containers first), so that the
	// PodResources service lists each claim under the right ones.
	Containers []ContainerClaims `json:"containers,omitempty"`
}

// Clone returns a deep copy of p.
func (p *PodClaims) Clone() PodClaims {
	c := PodClaims{Pod: p.Pod, Claims: slices.Clone(p.Claims), Containers: CloneContainers(p.Containers)}
	for i := range c.Claims {
		c.Claims[i].Drivers = slices.Clone(c.Claims[i].Drivers)
		c.Claims[i].Devices = CloneDevices(c.Claims[i].Devices)
	}
	return c
}

// CloneDevices returns a deep copy of devs.
func CloneDevices(devs []DeviceRecord) []DeviceRecord {
	out := slices.Clone(devs)
	for j := range out {
		out[j].Requests = slices.Clone(out[j].Requests)
		out[j].CDIDeviceIDs = slices.Clone(out[j].CDIDeviceIDs)
		if n := out[j].Network; n != nil {
			nc := *n
			nc.Addresses = slices.Clone(n.Addresses)
			out[j].Network = &nc
		}
	}
	return out
}

// CloneContainers returns a deep copy of cs.
func CloneContainers(cs []ContainerClaims) []ContainerClaims {
	out := slices.Clone(cs)
	for i := range out {
		out[i].Claims = slices.Clone(out[i].Claims)
	}
	return out
}

// PodClaimsGetter returns the DRA claims of a pod.
type PodClaimsGetter interface {
	PodClaims(uid types.UID) (PodClaims, bool)
}
