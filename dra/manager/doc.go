// Package manager is podgate's DRA manager, as the kubelet's cm/dra/manager.go is the
// kubelet's: it prepares a pod's DRA claims before its sandbox is created (the pipeline's
// "dra-prepare" stage), each shared claim once however many sandboxes ask at the same moment,
// records them in the pod registry before any driver is called, and unprepares them once the
// last pod using them is gone (its reconciler). Beside a kubelet whose own DRA manager
// prepares claims (dra.prepare auto, never) it records the devices the kubelet prepared
// instead of calling the drivers.
//
// Package dra holds what it works with: the driver clients, their discovery, the resolution
// of a pod's claims and the network data of network devices.
package manager
