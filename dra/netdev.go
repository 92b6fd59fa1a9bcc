package dra

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"strings"

	"github.com/containerd/errdefs"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/resourceclaim"
)

// Limits of an interface configuration: the kernel's (IFNAMSIZ less the NUL, the smallest MTU
// an IPv4 link may have, the largest an MTU attribute can hold) and the API server's (the IPs a
// device's networkData may list).
const (
	maxInterfaceNameLen = 15
	minMTU              = 68
	maxMTU              = 65535
	maxAddresses        = resourceapi.NetworkDeviceDataMaxIPs
)

// InterfaceConfig is how podgate sets up a host network interface that it moves into a pod.
//
// It comes from the opaque configuration of a claim for the device's driver: the
// "interface" object of the parameters, which the driver shares with podgate (podgate ignores
// every other field, and the driver ignores this one or reads it the same way; dranet's
// configuration has the same shape):
//
//	{"interface": {"name": "net1", "mtu": 1400, "addresses": ["192.0.2.10/24", "2001:db8::10/64"]}}
//
// Each field is optional; an absent field keeps what the interface has.
type InterfaceConfig struct {
	// Name is the interface's name in the pod: a Linux interface name (at most 15 bytes of
	// printable ASCII without white space, '/', ':' or '%'; not "." or ".."), never "lo".
	// Empty: the interface keeps its host name.
	Name string `json:"name,omitempty"`
	// MTU is the interface's MTU in the pod, 68 to 65535; 0 keeps the interface's MTU.
	MTU int `json:"mtu,omitempty"`
	// Addresses are the addresses to give the interface in the pod, in CIDR notation
	// ("192.0.2.10/24"), each once, at most 16 (the IPs a claim's networkData can show);
	// InterfaceConfigFor returns them in canonical form.
	Addresses []string `json:"addresses,omitempty"`
}

// Attached is what podgate needs to give a host interface back after moving it into a pod. It
// is JSON, for podgate's checkpoint.
type Attached struct {
	// HostName is the interface's name on the host, the name it gets back.
	HostName string `json:"hostName"`
	// PodName is the interface's name in the pod.
	PodName string `json:"podName"`
	// MTU is the interface's MTU on the host, restored when it comes back; 0: leave as is.
	MTU int `json:"mtu,omitempty"`
	// Up records that the interface was administratively up on the host.
	Up bool `json:"up,omitempty"`
	// Alias is the interface's alias on the host, restored when it comes back: while the
	// interface is away, its alias is podgate's mark.
	Alias string `json:"alias,omitempty"`
	// HardwareAddr is the interface's MAC address, as the pod sees it.
	HardwareAddr string `json:"hardwareAddr,omitempty"`
	// Addresses are the addresses podgate gave the interface in the pod, in CIDR notation.
	Addresses []string `json:"addresses,omitempty"`
}

// DeviceNetwork returns the network data of a, attached for the allocated device result, to
// publish in the claim's status.
func (a Attached) DeviceNetwork(result resourceapi.DeviceRequestAllocationResult) DeviceNetwork {
	d := DeviceNetwork{
		Driver:          result.Driver,
		Pool:            result.Pool,
		Device:          result.Device,
		InterfaceName:   a.PodName,
		IPs:             a.Addresses,
		HardwareAddress: a.HardwareAddr,
	}
	if result.ShareID != nil {
		d.ShareID = string(*result.ShareID)
	}
	return d
}

// InterfaceConfigFor returns the interface configuration that claim's opaque configuration
// gives the allocated device result: the "interface" objects (see [InterfaceConfig]) of the
// opaque configurations for the result's driver whose requests are empty or name the result's
// request (or its parent request, for a subrequest of a prioritized list).
//
// An allocated claim's configurations are those of status.allocation, which the scheduler
// copied from the device classes and then from the claim's spec; else those of the claim's
// spec. A later configuration wins, field by field, as for DRA drivers: a class can set an
// MTU that a claim's configuration does not mention and the claim's name still applies.
//
// ok is false when no configuration has an "interface" object. A configuration podgate cannot
// parse or a value out of range is an error of class errdefs.ErrInvalidArgument naming the
// claim, the field and the reason.
func InterfaceConfigFor(claim *resourceapi.ResourceClaim, result resourceapi.DeviceRequestAllocationResult) (InterfaceConfig, bool, error) {
	var cfg InterfaceConfig
	found := false
	for _, c := range claimDeviceConfigs(claim) {
		if c.Opaque == nil || c.Opaque.Driver != result.Driver {
			continue
		}
		if len(resourceclaim.ConfigForResult([]resourceapi.DeviceAllocationConfiguration{c.DeviceAllocationConfiguration}, result)) == 0 {
			continue
		}
		p, err := parseInterfaceParameters(c.Opaque.Parameters.Raw)
		if err == nil && p != nil {
			err = p.mergeInto(&cfg)
		}
		if err != nil {
			return InterfaceConfig{}, false, errdefs.ErrInvalidArgument.WithMessage(fmt.Sprintf(
				"claim %s/%s %s: %v", claim.Namespace, claim.Name, c.path, err))
		}
		found = found || p != nil
	}
	return cfg, found, nil
}

// deviceConfig is one device configuration of a claim and where it is, for messages.
type deviceConfig struct {
	resourceapi.DeviceAllocationConfiguration
	path string
}

// claimDeviceConfigs returns claim's device configurations in the order they apply.
func claimDeviceConfigs(claim *resourceapi.ResourceClaim) []deviceConfig {
	var out []deviceConfig
	if a := claim.Status.Allocation; a != nil {
		for i, c := range a.Devices.Config {
			out = append(out, deviceConfig{c, fmt.Sprintf("status.allocation.devices.config[%d].opaque.parameters", i)})
		}
		return out
	}
	for i, c := range claim.Spec.Devices.Config {
		out = append(out, deviceConfig{
			resourceapi.DeviceAllocationConfiguration{Source: resourceapi.AllocationConfigSourceClaim, Requests: c.Requests, DeviceConfiguration: c.DeviceConfiguration},
			fmt.Sprintf("spec.devices.config[%d].opaque.parameters", i),
		})
	}
	return out
}

// interfaceParameters is podgate's part of a driver's opaque parameters. Pointers tell an
// absent field from a zero one.
type interfaceParameters struct {
	Name      *string   `json:"name"`
	MTU       *int      `json:"mtu"`
	Addresses *[]string `json:"addresses"`
}

// parseInterfaceParameters returns the "interface" object of raw, nil when there is none.
func parseInterfaceParameters(raw []byte) (*interfaceParameters, error) {
	if len(raw) == 0 {
		return nil, nil
	}
	var params struct {
		Interface *interfaceParameters `json:"interface"`
	}
	if err := json.Unmarshal(raw, &params); err != nil {
		return nil, fmt.Errorf("not podgate's interface configuration: %w", err)
	}
	return params.Interface, nil
}

// mergeInto checks p's fields and sets those present in cfg.
func (p *interfaceParameters) mergeInto(cfg *InterfaceConfig) error {
	if p.Name != nil {
		if err := checkInterfaceName(*p.Name); err != nil {
			return fmt.Errorf("interface.name %q: %w", *p.Name, err)
		}
		cfg.Name = *p.Name
	}
	if p.MTU != nil {
		if err := checkMTU(*p.MTU); err != nil {
			return fmt.Errorf("interface.mtu: %w", err)
		}
		cfg.MTU = *p.MTU
	}
	if p.Addresses != nil {
		addrs, err := canonicalAddresses(*p.Addresses)
		if err != nil {
			return fmt.Errorf("interface.addresses: %w", err)
		}
		cfg.Addresses = addrs
	}
	return nil
}

// validate checks a configuration that did not come from InterfaceConfigFor.
func (c InterfaceConfig) validate() error {
	if c.Name != "" {
		if err := checkInterfaceName(c.Name); err != nil {
			return fmt.Errorf("interface name %q: %w", c.Name, err)
		}
	}
	if c.MTU != 0 {
		if err := checkMTU(c.MTU); err != nil {
			return fmt.Errorf("interface MTU: %w", err)
		}
	}
	if _, err := canonicalAddresses(c.Addresses); err != nil {
		return fmt.Errorf("interface addresses: %w", err)
	}
	return nil
}

// checkInterfaceName accepts the names the kernel accepts as they are (dev_valid_name; '%'
// would make the kernel pick a name from a pattern), in printable ASCII, except "lo".
func checkInterfaceName(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("must not be empty")
	case len(name) > maxInterfaceNameLen:
		return fmt.Errorf("longer than %d bytes", maxInterfaceNameLen)
	case name == "." || name == "..":
		return fmt.Errorf("not an interface name")
	case name == "lo":
		return fmt.Errorf("is the loopback interface's")
	}
	for _, r := range name {
		if r <= ' ' || r > '~' || strings.ContainsRune("/:%", r) {
			return fmt.Errorf("must be printable ASCII without white space, '/', ':' or '%%'")
		}
	}
	return nil
}

func checkMTU(mtu int) error {
	if mtu < minMTU || mtu > maxMTU {
		return fmt.Errorf("%d: must be between %d and %d", mtu, minMTU, maxMTU)
	}
	return nil
}

// canonicalAddresses checks addrs and returns them in canonical form, as the API server wants
// them in a claim's networkData.
func canonicalAddresses(addrs []string) ([]string, error) {
	if len(addrs) > maxAddresses {
		return nil, fmt.Errorf("%d addresses, at most %d", len(addrs), maxAddresses)
	}
	out := make([]string, 0, len(addrs))
	for _, a := range addrs {
		p, err := netip.ParsePrefix(a)
		if err != nil {
			return nil, fmt.Errorf("%q: not an address in CIDR notation", a)
		}
		ip := p.Addr()
		if ip.Is4In6() || ip.IsUnspecified() || ip.IsMulticast() {
			return nil, fmt.Errorf("%q: not a unicast IPv4 or IPv6 address", a)
		}
		s := p.String()
		for _, prev := range out {
			if prev == s {
				return nil, fmt.Errorf("%q: listed twice", a)
			}
		}
		out = append(out, s)
	}
	return out, nil
}
