package agent

import (
	"errors"

	"github.com/podgate/podgate/agent/config"
	"github.com/podgate/podgate/sysctl"
)

// sysctlPolicy builds the pod sysctl policy of the sysctls section for the running kernel,
// validating the section; kubeletDefaults are the kubelet's defaultPodSysctls where it applies
// them (nil otherwise), which win over the section's defaults.
func sysctlPolicy(s *config.Sysctls, kubeletDefaults map[string]string) (*sysctl.Policy, error) {
	kernel, err := sysctl.RunningKernel()
	if err != nil {
		return nil, err
	}
	return sysctl.NewPolicy(sysctlConfig(s, kubeletDefaults), kernel, sysctl.ProcSys)
}

// sysctlConfig is the sysctl feature's part of the configuration, with the kubelet's defaults.
func sysctlConfig(s *config.Sysctls, kubeletDefaults map[string]string) sysctl.Config {
	return sysctl.Config{
		PodDefaults:       s.PodDefaults,
		NamespaceDefaults: s.NamespaceDefaults,
		KubeletDefaults:   kubeletDefaults,
		AllowedUnsafe:     s.AllowedUnsafe,
	}
}

// validateSysctls checks the sysctls section against this node's kernel and sysctl tree, as
// start-up builds the pod policy and sets the node sysctls.
func validateSysctls(s *config.Sysctls) error {
	_, policyErr := sysctlPolicy(s, nil)
	_, nodeErr := sysctl.ParseNode(s.Node, sysctl.ProcSys)
	return errors.Join(policyErr, nodeErr)
}
