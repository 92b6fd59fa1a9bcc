package config

import (
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"time"
)

// DRA defaults.
const (
	DefaultPluginRegistryDir = "/var/lib/kubelet/plugins_registry"
	// DefaultDRACallTimeout bounds one NodePrepareResources or NodeUnprepareResources call,
	// as the kubelet's DRA manager does (45 s): a driver may set up hardware, and the kubelet
	// gives RunPodSandbox minutes.
	DefaultDRACallTimeout = 45 * time.Second
	// DefaultInterfaceNameAttribute is DefaultInterfaceNameAttribute, config's own so that
	// config imports no feature (agent's tests hold them equal).
	DefaultInterfaceNameAttribute = "interfaceName"
)

// dra.prepare: who prepares a pod's claims. These words are the configuration's, written only
// here; the agent maps them onto the DRA manager's own values (manager.Prepare), as config
// imports no feature.
const (
	// PrepareAuto: podgate prepares a pod's claims unless the kubelet that manages the pod
	// prepares them itself (a kubelet ≥ 1.34, whose DRA is on by default, that knows the pod);
	// then podgate only records their devices.
	PrepareAuto = "auto"
	// PrepareAlways: podgate prepares every pod's claims before its sandbox, whoever the CRI
	// client is (a kubelet that prepares too makes it a repeat, which drivers accept).
	PrepareAlways = "always"
	// PrepareNever: podgate never calls a driver; it records the claims' devices from their
	// allocation, for attach, network data and PodResources.
	PrepareNever = "never"
)

// DRA is the dra section of the configuration: preparing a pod's Dynamic Resource Allocation
// claims before its sandbox is created. It needs the Kubernetes API (kubeconfig).
type DRA struct {
	// PluginRegistryDir is the kubelet's plugin registry, where DRA drivers register.
	PluginRegistryDir string `json:"pluginRegistryDir,omitempty"`
	// Drivers limits podgate to these drivers' devices; empty means every DRA driver on the
	// node.
	Drivers []string `json:"drivers,omitempty"`
	// CallTimeout bounds each call to a driver.
	CallTimeout Duration `json:"callTimeout,omitempty"`
	// Attach names the drivers whose prepared devices are host network interfaces that
	// podgate moves into the pod once CNI has run (named, sized and addressed as the claim's
	// opaque configuration asks), and gives back to the host when the pod stops.
	Attach []string `json:"attach,omitempty"`
	// InterfaceNameAttribute is the device attribute, in the drivers' ResourceSlices, that
	// names a device's host interface; default "interfaceName" (dranet: "dra.net/ifName").
	InterfaceNameAttribute string `json:"interfaceNameAttribute,omitempty"`
	// Prepare says who prepares a pod's claims: auto (default), always or never (Prepare*).
	Prepare string `json:"prepare,omitempty"`
	// PublishNetworkData writes an attached device's network data (interface name, IPs, MAC)
	// into its claim's status.devices (needs update on resourceclaims/status).
	PublishNetworkData bool `json:"publishNetworkData,omitempty"`
	// SandboxHookDrivers names the drivers that do their part when the sandbox starts, in a
	// runtime hook (dranet moves its interfaces in NRI's RunPodSandbox): podgate refuses the
	// sandbox of a pod with their claims unless each answers, whoever prepared the claims.
	// Such a driver moves its devices itself, so it cannot be in Attach too.
	SandboxHookDrivers []string `json:"sandboxHookDrivers,omitempty"`
}

func (d *DRA) setDefaults() {
	if d.PluginRegistryDir == "" {
		d.PluginRegistryDir = DefaultPluginRegistryDir
	}
	if d.CallTimeout.Duration == 0 {
		d.CallTimeout.Duration = DefaultDRACallTimeout
	}
	if d.InterfaceNameAttribute == "" {
		d.InterfaceNameAttribute = DefaultInterfaceNameAttribute
	}
	if d.Prepare == "" {
		d.Prepare = PrepareAuto
	}
}

func (d *DRA) validate() error {
	var errs []error
	if !filepath.IsAbs(d.PluginRegistryDir) {
		errs = append(errs, fmt.Errorf("dra.pluginRegistryDir: %q: want an absolute path", d.PluginRegistryDir))
	}
	if d.CallTimeout.Duration < 0 {
		errs = append(errs, fmt.Errorf("dra.callTimeout: %s: must not be negative", d.CallTimeout))
	}
	if !slices.Contains([]string{PrepareAuto, PrepareAlways, PrepareNever}, d.Prepare) {
		errs = append(errs, fmt.Errorf("dra.prepare: %q: want auto, always or never", d.Prepare))
	}
	errs = append(errs, validDriverList("dra.drivers", d.Drivers)...)
	errs = append(errs, validDriverList("dra.attach", d.Attach)...)
	for i, name := range d.Attach {
		if len(d.Drivers) > 0 && name != "" && !slices.Contains(d.Drivers, name) {
			errs = append(errs, fmt.Errorf("dra.attach[%d]: %q is not in dra.drivers, so podgate never prepares its devices", i, name))
		}
	}
	errs = append(errs, validDriverList("dra.sandboxHookDrivers", d.SandboxHookDrivers)...)
	for i, name := range d.SandboxHookDrivers {
		switch {
		case name == "":
		case slices.Contains(d.Attach, name):
			errs = append(errs, fmt.Errorf("dra.sandboxHookDrivers[%d]: %q is in dra.attach too: the driver and podgate would both move its devices", i, name))
		case len(d.Drivers) > 0 && !slices.Contains(d.Drivers, name):
			errs = append(errs, fmt.Errorf("dra.sandboxHookDrivers[%d]: %q is not in dra.drivers, so podgate never looks at its claims", i, name))
		}
	}
	return errors.Join(errs...)
}

func validDriverList(field string, names []string) []error {
	var errs []error
	for i, name := range names {
		switch {
		case name == "":
			errs = append(errs, fmt.Errorf("%s[%d]: empty driver name", field, i))
		case slices.Index(names, name) != i:
			errs = append(errs, fmt.Errorf("%s[%d]: %q listed twice", field, i, name))
		}
	}
	return errs
}
