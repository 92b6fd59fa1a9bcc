// Package dra prepares a pod's Dynamic Resource Allocation (DRA) claims from podgate, before
// RunPodSandbox reaches the runtime, so that network devices exist when the runtime runs CNI.
// podgate calls the node's DRA drivers as the kubelet's DRA manager does.
//
// # Discovery
//
// [Drivers] keeps the set of DRA drivers on the node. It watches the kubelet's plugin registry
// directory (/var/lib/kubelet/plugins_registry, config dra.pluginRegistryDir) the way the
// kubelet's plugin watcher does: a scan at start, then fsnotify; sub-directories are watched too;
// names starting with "." are ignored; every Unix socket is a registration socket. podgate dials
// each one and asks the Registration service's GetInfo (waiting up to 10 s for the socket to
// accept and answer), and nothing more: it never calls NotifyRegistrationStatus, which stays the
// kubelet's conversation with the driver. A "DRAPlugin" answer names the driver, the socket of
// its DRA service (the endpoint) and, in "supported versions", the gRPC services it serves
// ("v1.DRAPlugin", "v1beta1.DRAPlugin", "v1.DRAResourceHealth", ...).
// Other plugin types (CSI, device plugins) are left alone.
//
// A socket that does not answer, or answers with a registration podgate cannot use, is a log
// line and a count in podgate_dra_driver_discovery_errors_total; it is asked again when its file
// changes, and a socket that failed to answer also after a backoff (500 ms doubling to two
// minutes, as the kubelet retries a registration). A driver whose registration socket is
// removed is forgotten. When two registration sockets name the same driver (a rolling update of
// the driver), the one registered last serves it; the kubelet too prefers the newest.
//
// # Driver client
//
// A [Driver] calls NodePrepareResources and NodeUnprepareResources on the driver's DRA
// service: v1 when the driver advertises it, else v1beta1 (the two carry the same messages).
// Each call has its own timeout, 45 s by default as in the kubelet. Calls share one gRPC
// connection per driver endpoint; a driver that re-registers with another endpoint gets a new
// one. A Driver is a snapshot of one registration: look it up with [Drivers.Get] for each
// operation.
//
// # Errors
//
// Failures are classified with containerd's errdefs, never as gRPC statuses: the CRI boundary
// maps classes to codes once. A driver that is not registered ([Drivers.Lookup]), cannot be
// reached, does not answer in time, fails a whole call or fails one claim gives an [*Error] of
// class errdefs.ErrUnavailable whose message names the driver and, where one failed, the claim.
// The driver's own gRPC status is flattened into that message, so that the kubelet sees
// podgate's class rather than the driver's code. A call whose caller gave up has the class of
// the caller's context error.
//
// Claim resolution (pod to claims to allocated devices, [ClaimResolver]), the network data of
// network devices ([HostInterfaces], the publication in claims' status) and the moves of
// network devices between the host and pods live in this package too, in their own files. The
// sandbox pipeline's stages that use them do not: "dra-prepare" is the DRA manager's (package
// dra/manager, with the claims it holds), "dra-attach" the attacher's (package dra/attach).
package dra
