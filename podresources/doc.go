// Package podresources serves podgate's PodResources gRPC services on a unix socket, for
// meta-CNI plugins such as multus (which ask for a pod's devices while CNI runs) and for
// people debugging with grpcurl:
//
//   - the kubelet's v1.PodResourcesLister (List, Get, GetAllocatableResources), compatible
//     with the kubelet's own socket and the clients written for it, with every DRA claim
//     podgate prepared listed under the pod's containers — pod-level claims, which the
//     kubelet's answer leaves out, under every container;
//   - podgate's extension, podgate.podresources.v1alpha1.PodResources (List, Get, Watch), which
//     shows per pod the sandbox, network namespace, IPs, sysctls, DRA devices with their
//     network data, and the image pulls waiting for it.
//
// # Sources
//
// podgate's knowledge comes from the agent through small interfaces ([PodLister],
// [PodGetter], [ContainerLister]), so this package never imports the agent. Devices, CPUs and
// memory come from the kubelet's own PodResources socket when it answers,
// merged per pod and container; when it does not, the answer holds what podgate knows, and a
// log line and podgate_podresources_kubelet_requests_total say so — never an error for the
// whole call.
//
// # Protection
//
// The services are read-only. Calls are rate limited like the kubelet's PodResources server
// (a token bucket, 100 QPS with a burst of 10 by default); a call over the limit is
// ResourceExhausted. Requests are at most 64 KiB and answers at most 16 MiB (multus's limit);
// names are checked before use (InvalidArgument). At most 64 watches run at once, and a
// watcher that falls 256 events behind is ended with ResourceExhausted, so a slow client never
// makes podgate hold more. Server reflection and the standard gRPC health service are served on
// the same socket.
package podresources
