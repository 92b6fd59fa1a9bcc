package config

import (
	"errors"
	"fmt"
)

// Sysctl verification policies: what podgate does when a pod's sysctl does not hold the value
// asked for once the sandbox runs.
const (
	VerifyRepair = "repair" // write the value inside the pod's namespace
	VerifyFail   = "fail"   // remove the sandbox and fail RunPodSandbox
	VerifyWarn   = "warn"   // log and count it
)

// Sysctls is the sysctls section of the configuration.
type Sysctls struct {
	// PodDefaults are sysctls given to every pod that does not set them (net.* not to
	// host-network pods), e.g. {net.ipv4.tcp_keepalive_time: "600"}.
	PodDefaults map[string]string `json:"podDefaults,omitempty"`
	// NamespaceDefaults are per Kubernetes namespace and win over PodDefaults.
	NamespaceDefaults map[string]map[string]string `json:"namespaceDefaults,omitempty"`
	// AllowedUnsafe are sysctl names, or prefixes ending in "*", that pods may set beyond the
	// kubelet's safe set. Unset or empty (the default), podgate trusts the kubelet, which has
	// already admitted each pod against its own allowedUnsafeSysctls: any namespaced sysctl is
	// accepted, and only what could never work or would change the node is refused. Set, podgate
	// enforces this list as well, for nodes where other CRI clients than the kubelet run pods;
	// keep it then in step with the kubelet's allowedUnsafeSysctls. podDefaults and
	// namespaceDefaults must be safe or in this list either way.
	AllowedUnsafe []string `json:"allowedUnsafe,omitempty"`
	// Verify is repair (default), fail or warn.
	Verify string `json:"verify,omitempty"`
	// Node sysctls are set on the node at start-up when they differ, e.g. the conntrack
	// settings kube-proxy would otherwise manage.
	Node map[string]string `json:"node,omitempty"`
}

func (s *Sysctls) setDefaults() {
	if s.Verify == "" {
		s.Verify = VerifyRepair
	}
}

func (s *Sysctls) validate() error {
	var errs []error
	switch s.Verify {
	case VerifyRepair, VerifyFail, VerifyWarn:
	default:
		errs = append(errs, fmt.Errorf("sysctls.verify: %q: want repair, fail or warn", s.Verify))
	}
	// The sysctl names and values are the sysctl feature's rules, for the running kernel:
	// agent.Validate checks them.
	return errors.Join(errs...)
}
