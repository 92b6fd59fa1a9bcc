// Command dradriver is a real DRA (Dynamic Resource Allocation) driver for podgate's end-to-end
// tests: a kubelet plugin built with k8s.io/dynamic-resource-allocation/kubeletplugin whose
// devices are host network interfaces (veth pairs). The logic lives in package
// test/dradriver/driver.
//
// What the e2e test uses it for: the DRA e2e test creates a ResourceClaim allocated to devices of
// this driver (status.allocation with driver net.podgate.test, pool = node name, device nicN,
// and reservedFor the pod) and a pod that uses it. podgate must prepare the claim through this
// driver before containerd runs CNI ADD; the CNI recorder (test/cni) then shows that the device's
// interface (pgnicN) already existed at CNI ADD. As the kubelet prepares the claim itself just
// before the sandbox, the driver's events file and counters also say who prepared the claim and
// when: each entry names the calling process (pid and command name, "podgate" or "kubelet", read
// with SO_PEERCRED), and "created" lists the interfaces that prepare made — podgate's prepare
// should be the one that created them, the kubelet's a repeat that finds them.
//
// Usage:
//
//	dradriver --node-name NODE [--kubeconfig FILE]
//	          [--driver-name net.podgate.test] [--devices 4] [--interface-prefix pgnic]
//	          [--registry-dir /var/lib/kubelet/plugins_registry]
//	          [--plugin-dir /var/lib/kubelet/plugins/<driver-name>]
//	          [--netns PATH] [--cdi-dir /var/run/cdi]
//	          [--events-file FILE] [--status-address 127.0.0.1:PORT] [-v N]
//
// It registers <registry-dir>/<driver-name>-reg.sock with the kubelet (and anything else that
// watches that directory, such as podgate), serves the DRA gRPC API (v1 and v1beta1) on
// <plugin-dir>/dra.sock, and publishes one ResourceSlice for the node: pool = node name, devices
// nic0..nicN-1, each with the string attribute interfaceName = <prefix>N. The Node object must
// exist for the slice to be published.
//
// NodePrepareResources creates, for each allocated device, a veth pair <prefix>N / <prefix>Np,
// both up, in the namespace given by --netns (default: the driver's own, i.e. the host's when run
// on the host); an existing pair is success. NodeUnprepareResources deletes the pairs; an unknown
// claim or a missing interface is success. Which claim holds which device is kept in
// <plugin-dir>/state.json, so that a restarted driver can unprepare. With --cdi-dir, each
// prepared claim gets <cdi-dir>/<driver-name>-<claim UID>.json and the kubelet receives CDI device
// IDs <driver-name>/nic=<claim UID>-nicN (containerd with CDI enabled resolves them into the
// environment variable PODGATE_NET_NICN=<prefix>N); with --cdi-dir "" no CDI IDs are returned.
//
// Observing it:
//
//   - a log line per claim: "Prepared claim" / "Unprepared claim" with claim, uid, devices,
//     interfaces, caller (and, on prepare, the interfaces that call created);
//   - --events-file: one JSON line per claim prepared or unprepared (driver.Event: time, op,
//     namespace, name, uid, caller {pid, comm}, devices, interfaces, created, error);
//     driver.ReadEvents parses it;
//   - --status-address: GET http://ADDR/stats returns driver.Stats as JSON (prepareCalls,
//     prepareCallsByCaller, unprepareCalls, claimPrepares, claimPrepareErrors, claimUnprepares,
//     prepared claims).
//
// It stops on SIGTERM or SIGINT, removing its sockets; interfaces and state stay for the next run.
package main
