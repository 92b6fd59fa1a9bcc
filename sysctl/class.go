package sysctl

import "strings"

// Namespace is the kernel namespace a sysctl belongs to.
type Namespace string

// The namespaces a pod owns. Sysctls in neither are node-wide: a pod must not set them.
const (
	NetNamespace Namespace = "network"
	IPCNamespace Namespace = "ipc"
	NoNamespace  Namespace = ""
)

// NamespaceOf classifies a name as the kubelet does: net.* is per network namespace; the System
// V IPC and POSIX message queue sysctls (kernel.shm*, kernel.msg*, kernel.sem, fs.mqueue.*) are
// per IPC namespace; the rest is the node's.
func NamespaceOf(n Name) Namespace {
	return namespaceOfPrefix(string(n))
}

// namespaceOfPrefix classifies a name or a name prefix (of an allowlist pattern).
func namespaceOfPrefix(s string) Namespace {
	switch {
	case strings.HasPrefix(s, "net."):
		return NetNamespace
	case s == "kernel.sem",
		strings.HasPrefix(s, "kernel.shm"),
		strings.HasPrefix(s, "kernel.msg"),
		strings.HasPrefix(s, "fs.mqueue."):
		return IPCNamespace
	}
	return NoNamespace
}
