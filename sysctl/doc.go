// Package sysctl is podgate's pod sysctl policy and its reading and writing of sysctls inside a
// pod's namespaces.
//
// A pod's sysctls (LinuxPodSandboxConfig.sysctls) are checked before RunPodSandbox is forwarded:
// names are normalised and classified by namespace with the kubelet's own functions
// (k8s.io/component-helpers/node/util/sysctl), malformed names are refused before they can become
// paths (the kubelet's functions do not validate), each name must belong to a namespace the pod
// owns (network or IPC), must be on the kubelet's safe list (with the kernel version that
// namespaced it) or match an operator's unsafe pattern, and known sysctls get their value format
// checked. Node defaults are then added for sysctls the pod does not set. After containerd
// answers, the values are read back inside the pod's namespaces and repaired, failed or reported
// according to policy.
//
// A sysctl name maps to a file under /proc/sys. Every name accepted here maps to a path inside
// that tree: see [Name.Path].
//
// A refusal is a [RejectedError], an errdefs.ErrInvalidArgument; the package speaks no gRPC.
// Reading and writing sysctls (and [RunningKernel]) need Linux; elsewhere the package builds and
// those functions fail.
package sysctl
