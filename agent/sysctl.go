package agent

import (
	"errors"

	"github.com/podgate/podgate/agent/config"
	"github.com/podgate/podgate/sysctl"
)

// sysctlPolicy builds the pod sysctl policy of the sysctls section for the running kernel,
// validating the section.
func sysctlPolicy(s *config.Sysctls) (*sysctl.Policy, error) {
	kernel, err := sysctl.RunningKernel()
	if err != nil {
		return nil, err
	}
	return sysctl.NewPolicy(sysctl.Config{
		PodDefaults:       s.PodDefaults,
		NamespaceDefaults: s.NamespaceDefaults,
		AllowedUnsafe:     s.AllowedUnsafe,
	}, kernel, sysctl.ProcSys)
}

// validateSysctls checks the sysctls section against this node's kernel and sysctl tree, as
// start-up builds the pod policy and sets the node sysctls.
func validateSysctls(s *config.Sysctls) error {
	_, policyErr := sysctlPolicy(s)
	_, nodeErr := sysctl.ParseNode(s.Node, sysctl.ProcSys)
	return errors.Join(policyErr, nodeErr)
}
