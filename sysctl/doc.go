// Package sysctl is podgate's pod sysctl policy and its reading and writing of sysctls inside a
// pod's namespaces.
//
// A pod's sysctls (LinuxPodSandboxConfig.sysctls) are checked before RunPodSandbox is forwarded:
// names are normalised and classified by namespace with the kubelet's own functions
// (k8s.io/component-helpers/node/util/sysctl), malformed names are refused before they can become
// paths (the kubelet's functions do not validate), each name must belong to a namespace the pod
// owns (network or IPC), and a safe one must be namespaced by the running kernel (the version
// is on the kubelet's safe list). An unsafe sysctl was admitted by the kubelet against its own
// allowedUnsafeSysctls and is trusted, unless the operator lists unsafe patterns: then it must
// match one. Known sysctls get their value format checked. Node defaults, which no kubelet
// admitted, must be safe or match a pattern; they are added for sysctls the pod does not set.
// After containerd answers, the values are read back inside the pod's namespaces and repaired,
// failed or reported according to policy.
//
// A sysctl name maps to a file under /proc/sys. Every name accepted here maps to a path inside
// that tree: see [Name.Path].
//
// The sysctl feature's part in podgate is [Stages]: the sandbox pipeline's sysctl-check and
// sysctl-verify stages and CreateContainer's wait for a background verification. [ApplyNode]
// sets the node's own sysctls at start-up.
//
// A refusal is a [RejectedError], an errdefs.ErrInvalidArgument: the policy speaks no gRPC. A
// failed verification keeps the class the runtime's error had, or is FailedPrecondition.
// Reading and writing sysctls (and [RunningKernel]) need Linux; elsewhere the package builds and
// those functions fail.
package sysctl
