package agent

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
}

func (d *DRA) setDefaults() {
	if d.PluginRegistryDir == "" {
		d.PluginRegistryDir = DefaultPluginRegistryDir
	}
	if d.CallTimeout.Duration == 0 {
		d.CallTimeout.Duration = DefaultDRACallTimeout
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
	for i, name := range d.Drivers {
		switch {
		case name == "":
			errs = append(errs, fmt.Errorf("dra.drivers[%d]: empty driver name", i))
		case slices.Index(d.Drivers, name) != i:
			errs = append(errs, fmt.Errorf("dra.drivers[%d]: %q listed twice", i, name))
		}
	}
	return errors.Join(errs...)
}
