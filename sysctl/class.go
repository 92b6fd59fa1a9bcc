package sysctl

import (
	utilsysctl "k8s.io/component-helpers/node/util/sysctl"
)

// Namespace is the kernel namespace a sysctl belongs to.
type Namespace string

// The namespaces a pod owns that podgate reads and writes sysctls in. Sysctls in none of the
// namespaces are node-wide: a pod must not set them.
const (
	NetNamespace Namespace = "network"
	IPCNamespace Namespace = "ipc"
	NoNamespace  Namespace = ""
)

// Namespaces the kubelet also knows sysctls of, but which podgate does not enter: it refuses
// their sysctls rather than let one through unchecked.
const (
	UTSNamespace  Namespace = "uts"
	UserNamespace Namespace = "user"
)

// NamespaceOf classifies a name with the kubelet's own function: net.* is per network
// namespace; the System V IPC sysctls the kubelet lists (kernel.shm{all,max,mni,_rmid_forced},
// kernel.msg{max,mnb,mni}, kernel.sem) and fs.mqueue.* are per IPC namespace;
// kernel.domainname is per UTS namespace and user.* per user namespace; the rest is the node's.
func NamespaceOf(n Name) Namespace {
	return patternNamespace(string(n))
}

// patternNamespace classifies a name or an allowlist pattern ("kernel.shm*": the namespace of
// its part before the '*') as the kubelet classifies --allowed-unsafe-sysctls.
func patternNamespace(s string) Namespace {
	ns, _, _ := utilsysctl.GetNamespace(s)
	switch ns {
	case utilsysctl.NetNamespace:
		return NetNamespace
	case utilsysctl.IPCNamespace:
		return IPCNamespace
	case utilsysctl.UTSNamespace:
		return UTSNamespace
	case utilsysctl.UserNamespace:
		return UserNamespace
	}
	return NoNamespace
}

// podNamespace is the namespace a pod's sysctl n lives in as far as the kubelet is concerned.
// The kubelet admits a pod's sysctl in the namespace of the allowlist entry that admits it, and
// an entry "kernel.shm*" admits names its library does not list (kernel.shm_next_id) as IPC.
// So n is in the namespace of its longest prefix that the library classifies; for a name the
// library lists, that is NamespaceOf(n).
func podNamespace(n Name) Namespace {
	s := string(n)
	for i := len(s); i > 0; i-- {
		if ns := patternNamespace(s[:i]); ns != NoNamespace {
			return ns
		}
	}
	return NoNamespace
}
