// Package driver is the library behind test/dradriver: a small but real DRA (Dynamic Resource
// Allocation) network driver built on the upstream k8s.io/dynamic-resource-allocation/kubeletplugin
// helper, so that podgate's end-to-end tests exercise the same registration, gRPC and
// ResourceSlice machinery that production drivers use.
//
// A [Driver] owns N devices ("nic0".."nicN-1"). Each device stands for one host network interface
// that the driver creates when a claim allocated to the device is prepared: a veth pair whose first
// end carries the device's interface name (attribute "interfaceName" in the ResourceSlice, e.g.
// "pgnic0") and whose second end is the same name with a "p" suffix ("pgnic0p"). The veth pair
// stands in for a NIC because these hosts have no dummy link type. Unprepare deletes the pair.
//
// What the end-to-end tests rely on:
//
//   - Prepare and unprepare are idempotent: a repeated prepare finds the interfaces and succeeds, an
//     unprepare of a claim the driver does not know, or whose interfaces are gone, succeeds.
//   - Which claim holds which devices is kept in memory and in a checkpoint file (state.json in the
//     plugin data directory), written before any interface is created, so that a restarted driver
//     can still unprepare.
//   - Every prepare and unprepare is logged with the claim and its devices, counted ([Stats], also
//     served as JSON by [Driver.ServeHTTP]) and, if configured, appended to a JSON-lines events file
//     ([Event]) whose timestamps can be compared with what the CNI recorder (test/cni) saw.
//   - Each of those names its [Caller], the process on the other end of the gRPC connection (pid
//     and command name from SO_PEERCRED), because the kubelet prepares a pod's claims too, just
//     before the sandbox: only the caller of the prepare that created an interface shows whether
//     podgate prepared it first.
//   - Interfaces are created in one network namespace, the driver's own by default. Unit tests
//     point the driver at a namespace they made, so they never touch the host's interfaces.
//   - If a CDI directory is configured, each prepared claim gets a CDI spec file there with one
//     device per allocated device (an environment variable naming the interface), so that a
//     container runtime with CDI enabled can resolve the CDI device IDs the driver returns.
package driver
