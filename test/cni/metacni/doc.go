// Command metacni (binary pgmetacni) is a small meta-CNI plugin for podgate's end-to-end tests,
// modelled on how multus uses PodResources: it asks podgate, while CNI ADD runs, which DRA
// network devices the pod has, and moves each into the pod with the real host-device plugin.
//
// On ADD it reads the pod (K8S_POD_NAMESPACE, K8S_POD_NAME) from CNI_ARGS and calls, on the
// socket named by "podResourcesSocket", with multus's client settings (10 s per call, answers up
// to 16 MiB):
//
//   - podgate's extension, podgate.podresources.v1alpha1.PodResources/Get. For each device whose
//     network data has a host_interface (and that podgate did not attach itself), it delegates
//     ADD to host-device with {"cniVersion": <this network's>, "name": <this network's>,
//     "type": "host-device", "device": <host_interface>} and CNI_IFNAME = interface_name, and
//     adds the interfaces host-device reports to the previous plugin's result, which it prints.
//     A pod podgate does not know (NOT_FOUND) has no devices: the previous result passes through.
//     Any other error fails the ADD (fail closed: a pod must not start without its devices).
//   - the kubelet-compatible v1.PodResourcesLister/Get, as multus calls the kubelet's socket; it
//     only records the DRA claims listed under each container (an error fails the ADD too).
//
// Before the first host-device ADD it writes what it will delegate to <cacheDir>/<container
// ID>.json. DEL works from that file alone, because it may come when podgate no longer knows the
// pod: for each delegation whose interface is still in the pod's network namespace it delegates
// DEL to host-device with the same configuration and CNI_IFNAME, which renames the interface
// back and returns it to the host; then it removes the file. No file, a namespace that is gone,
// or an interface no longer in the pod is success (host-device's own DEL fails on each), so
// DEL is idempotent. CHECK validates the configuration. GC and STATUS succeed.
//
// Every ADD, DEL and CHECK appends one JSON line (Entry) to "recordFile": the time, command,
// CNI_CONTAINERID, CNI_NETNS, CNI_IFNAME, the pod, what the extension answered ("extension":
// found, uid, sandboxID, devices with claim, driver, pool, device and network data), what v1
// answered ("v1": found, containers with their dynamicResources), the delegations made or
// skipped ("delegated": plugin, hostInterface, ifName, conf, skipped, error) and the errors.
//
// Configuration, chained after the plugin that makes the pod's main interface:
//
//	"plugins": [
//	  {"type": "bridge", ...},
//	  {"type": "pgmetacni", "podResourcesSocket": "/var/lib/kubelet/pod-resources/podgate.sock",
//	   "recordFile": "/tmp/pgx/metacni.jsonl", "cacheDir": "/tmp/pgx/metacni-cache"}
//	]
//
// All three keys are required and absolute. Install it beside host-device, in a directory of
// the runtime's CNI bin_dirs (CNI_PATH must also hold host-device):
//
//	go build -o <bin dir>/pgmetacni ./test/cni/metacni
//
// It speaks CNI 0.3.0 to 1.0.0, the versions Debian's host-device 1.1.1 shares.
package main
