package agent

import (
	"errors"
	"fmt"
	"maps"
	"os"

	"github.com/podgate/podgate/agent/config"
	"github.com/podgate/podgate/agent/kube"
	"github.com/podgate/podgate/agent/state"
	"github.com/podgate/podgate/cri"
	"github.com/podgate/podgate/cri/imagepull"
	"github.com/podgate/podgate/cri/registry"
	"github.com/podgate/podgate/podresources/cgroup"
)

// Validate checks a configuration as start-up needs it, every bad field named by its key: the
// checks the file alone can make (config's Validate), then each feature's rules for its
// section. This is the one place the whole validation is composed; cmd/podgate runs it on the
// file and the flags before New, which takes a validated configuration.
func Validate(c *config.Configuration) error {
	return errors.Join(c.Validate(),
		imagepull.ValidatePerRegistry("imagePulls.perRegistry", c.ImagePulls.PerRegistry),
		imagepull.ValidateRegistryHosts("imagePulls.perRegistryRate", maps.Keys(c.ImagePulls.PerRegistryRate)),
		validateSysctls(&c.Sysctls),
		validateResources(&c.Resources))
}

// validateResources checks the resources section against the cgroup rules of the resources
// feature.
func validateResources(r *config.Resources) error {
	return errors.Join(
		prefixed("resources.memoryThrottlingFactor", cgroup.ValidateThrottlingFactor(r.MemoryThrottlingFactor)),
		prefixed("resources.memoryReservationPolicy", cgroup.ValidateReservationPolicy(r.MemoryReservationPolicy)),
	)
}

// Check (podgate check-config) runs Validate and then resolves what start-up resolves without
// the running node: the CRI socket's group, the kubeconfig file and the checkpoint in
// stateDir. Validate already parses the endpoints and checks the sysctl names against this
// kernel. Every error is reported, each prefixed with its key, so that a configuration Check
// accepts is one podgate can start with, as far as the file alone can tell.
func Check(c *config.Configuration) error {
	return errors.Join(
		Validate(c),
		prefixed("criSocketGroup", cri.CheckSocketGroup(c.CRISocketGroup)),
		prefixed("podResources.socketGroup", cri.CheckSocketGroup(c.PodResources.SocketGroup)),
		prefixed("kubeconfig", kube.CheckKubeconfig(c.Kubeconfig)),
		prefixed("stateDir", checkStateDir(c.StateDir)),
		prefixed("resources.kubeletConfig", checkKubeletConfig(c.Resources.KubeletConfig)),
	)
}

// checkStateDir checks stateDir and its checkpoint as start-up reads it: the file, and each
// feature's section of it.
func checkStateDir(dir string) error {
	if err := registry.CheckStateDir(dir); err != nil {
		return err
	}
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		return nil // does not exist yet: podgate creates it
	}
	_, err := state.Read(registry.NewCheckpoint(dir))
	return err
}

func prefixed(key string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%s: %w", key, err)
}

// checkKubeletConfig reads the kubelet's configuration file as start-up does.
func checkKubeletConfig(path string) error {
	if path == "" {
		return nil
	}
	_, err := cgroup.ReadKubeletConfig(path)
	return err
}
