package config

import (
	"errors"
	"fmt"
	"os"

	"github.com/podgate/podgate/sysctl"
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

// procSys is the sysctl tree configuration is checked against; tests point it elsewhere.
var procSys = sysctl.ProcSys

// SysctlPolicy builds the pod sysctl policy for the running kernel, validating the section.
func (s *Sysctls) SysctlPolicy() (*sysctl.Policy, error) {
	kernel, err := sysctl.RunningKernel()
	if err != nil {
		return nil, err
	}
	return sysctl.NewPolicy(sysctl.Config{
		PodDefaults:       s.PodDefaults,
		NamespaceDefaults: s.NamespaceDefaults,
		AllowedUnsafe:     s.AllowedUnsafe,
	}, kernel, procSys)
}

// NodeSysctls returns the node sysctls, validated: well-formed names that exist on this node and
// values without control characters.
func (s *Sysctls) NodeSysctls() (map[sysctl.Name]string, error) {
	out := make(map[sysctl.Name]string, len(s.Node))
	var errs []error
	for k, v := range s.Node {
		n, err := sysctl.ParseName(k)
		if err == nil {
			err = sysctl.CheckValue(n, v)
		}
		if err == nil {
			var path string
			if path, err = n.Path(procSys); err == nil {
				_, err = os.Stat(path)
			}
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("sysctls.node %q: %w", k, err))
			continue
		}
		out[n] = v
	}
	return out, errors.Join(errs...)
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
	if _, err := s.SysctlPolicy(); err != nil {
		errs = append(errs, err)
	}
	if _, err := s.NodeSysctls(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
