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
// memory come from the kubelet's own PodResources socket, merged per pod and container.
//
// # The kubelet under a burst
//
// A meta-CNI plugin asks on every CNI ADD, so the pods of a drained node ask together, and the
// kubelet's socket refuses what is over its token bucket (100 QPS, burst 10, shared by its
// clients). Identical v1 calls therefore share the kubelet's answer, and a v1 call is answered
// only by a kubelet call sent after it arrived, so no answer hides a pod the kubelet admitted
// before the call (flightGroup). podgate's own token bucket, at most half the kubelet's
// (podResources.kubeletQPS, podResources.kubeletBurst), with as many calls in flight as its
// burst, keeps podgate within the kubelet's limit. When the kubelet refuses, restarts or does
// not answer, a v1 call waits and tries again within its caller's deadline, then fails
// Unavailable saying why: never an answer without the kubelet's part, except when there is no
// kubelet socket at all.
//
// # Protection
//
// The services are read-only. Calls are rate limited per client: a token bucket (100 QPS with
// a burst of 100 by default, podResources.qps and podResources.burst) for each process, told
// by the socket's peer credentials (uid and pid, read as a connection is accepted and carried
// as its gRPC AuthInfo), taken as the call's stream opens (a tap, before the request is read);
// a call over the limit is ResourceExhausted, and one client's flood leaves the others served.
// Each user (uid) has a bucket too, twice a process's, which all its processes take from, so
// that forking does not multiply the rate. At most 64 connections are open
// (podResources.maxConnections: one over it is closed as it is accepted), 16 calls on each
// (podResources.maxStreams); a connection idle for 2 minutes is closed
// (podResources.idleTimeout), and one that opened no call within 10 s of being accepted
// (podResources.headerTimeout: half-open) too. Inside those totals each process holds at most
// a quarter of the connections and of the watches, and 32 open calls, and each user three
// quarters (the per-process quotas bite first: a CNI plugin and a process that misbehaves
// beside it are often both root); a refusal's log line names the process that holds the slots,
// and podgate_podresources_slots the processes that hold the most. Header blocks are at most 64 KiB, requests at most 64 KiB
// and answers at most 16 MiB (multus's limit); names are checked before use
// (InvalidArgument). Every refusal is counted by reason (podgate_podresources_refusals_total)
// and logged with the client's pid and uid, at most once a minute per client and reason and a
// few lines a second in all, so that no client can flood the log. At most 64 watches run at once; a
// watcher that falls 256 events behind is ended with ResourceExhausted, and one whose client
// reads nothing for 30 s (podResources.watchSendTimeout) is ended, so a slow client never
// makes podgate hold more. Server reflection and the standard gRPC health service are served on
// the same socket.
package podresources
