// Package cluster runs a real single-node Kubernetes for podgate's end-to-end tests: etcd,
// kube-apiserver and a kubelet whose containerRuntimeEndpoint and imageServiceEndpoint are
// podgate's CRI socket, in front of the rig's containerd (package rig). There is no
// controller-manager, no scheduler and no kube-proxy.
//
// # What it needs
//
// Root, and the binaries in BinDir ($PODGATE_RIG_DIR/cluster/bin, by default
// /var/lib/podgate-rig/cluster/bin). test/rig/install.sh (make rig) builds them by running
// test/cluster/build.sh, which builds only from the Go module proxy:
//
//   - kube-apiserver and kubelet v1.36.3 from the wrapper module test/cluster/k8s. It requires
//     k8s.io/kubernetes and replaces each staging module that kubernetes' go.mod requires at
//     v0.0.0 and points at ./staging (31 of them) with its published k8s.io/<name> v0.36.3:
//     replace directives of a dependency do not apply. (kubernetes' go.mod also replaces
//     k8s.io/sample-controller and k8s.io/sample-cli-plugin, which nothing requires; the latter
//     is not even published.)
//   - etcd v3.6.8 from the wrapper module test/cluster/etcd: go.etcd.io/etcd/server/v3 has
//     replace directives in its go.mod, so `go install` refuses to build it at a version.
//
// Both wrappers are nested modules (podgate's ./... skips them) with committed go.sum files;
// test/cluster/update.sh regenerates them for other versions. build.sh skips a binary whose
// build information (`go version -m`) names the wanted version and the wrapper's current
// go.mod/go.sum and build settings; a first build takes about 12 CPU-minutes (6-7 minutes on
// two cores).
// Start skips the test, with a message saying what is missing, when not root or not installed.
// A cluster started with Options.DeferKubelet needs only etcd and kube-apiserver until
// StartKubelet (`build.sh etcd kube-apiserver`, make rig-control-plane): the demo runs so, and
// registers the Node itself (RegisterNode) for the DRA driver's ResourceSlice.
//
// # How it runs
//
// Everything of a cluster lives in one directory (Options.Dir, by default /tmp/pgc-*): etcd's
// data, the keys, the kubeconfig, each daemon's log (etcd.log, kube-apiserver.log, kubelet.log;
// their last lines go to the test log when the test fails) and the kubelet's --root-dir, so
// that the kubelet's plugin registry (PluginRegistryDir) and DRA socket directory (PluginsDir)
// are private to the test. Keep the directory short: DRA drivers put unix sockets in it.
//
//   - etcd: one member, client and peer URLs on loopback ports picked free, --unsafe-no-fsync.
//   - kube-apiserver: on a loopback port picked free, with a self-signed ECDSA serving
//     certificate that is its own CA (the kubeconfig trusts exactly it); authentication by a
//     static token file holding one admin token in group system:masters; authorization
//     Node,RBAC, which system:masters passes, so that tests may add narrower identities;
//     service-account keys made with Go's crypto. resource.k8s.io/v1 is served by default in
//     1.36 (DRA is GA since 1.34): no --runtime-config or feature gate is needed, and Up fails
//     if the DRA resources are not served.
//   - kubelet: a KubeletConfiguration with failCgroupV1: false, cgroupDriver: cgroupfs,
//     failSwapOn: false (these hosts are cgroup v1/v2 hybrid, without systemd), no static pods,
//     resolvConf holding "nameserver 127.0.0.1" (a lookup in a pod stays on the pod's loopback),
//     its own cgroupRoot (/podgate-cluster/<random>, so that two kubelets do not remove each
//     other's pod cgroups as orphans), its API on a loopback port picked free, image garbage
//     collection and disk-pressure eviction off (no registry could bring an image back), and no
//     iptables chains on the host. The admin kubeconfig identifies it. Up waits until the Node
//     is Ready.
//
// Without a controller-manager, nothing creates a namespace's ServiceAccount "default" (without
// which the ServiceAccount admission plugin refuses pods) or its ConfigMap kube-root-ca.crt
// (which the projected token volume reads): Up adds both to the namespace "default", and
// CreateNamespace adds them to new namespaces. Test pods can still set
// automountServiceAccountToken: false to spare a token request and a mount. Without a
// scheduler, tests set spec.nodeName (NodeName); for DRA they write a ResourceClaim's
// status.allocation and reservedFor themselves, before they create the pod.
//
// # Timings on these machines
//
// The control plane is ready in 3-4 s, the kubelet's Node is Ready under a second later, and a
// busybox pod runs about a second after its creation. Deleting a pod with grace period 0 removes
// it from the API at once and the kubelet stops its sandbox within about 3 s, but it removes the
// sandbox from containerd only in its container garbage collection, which runs once a minute
// from the kubelet's start (ContainerGCPeriod, not configurable): a test that waits for the
// removal waits up to a minute.
//
// # podgate and the order of things
//
// The kubelet needs podgate's socket; podgate needs the cluster's Kubeconfig and NodeName. So a
// test starts the cluster with Options.DeferKubelet and CRIEndpoint set to where podgate will
// listen, starts podgate, then calls StartKubelet. podgate must stop after the cluster, because
// Down has the kubelet stop the pods through it: register podgate's cleanup before calling Start
// (cleanups run last-in first-out), as startNode in cluster_test.go does; the same goes for DRA
// drivers. When podgate is gone first, Down sees its socket refuse connections and kills the
// pods' processes itself instead of waiting for the kubelet. Give podgate the cluster's
// PluginRegistryDir (dra.pluginRegistryDir) rather than the host's, and, for
// podResources.kubeletSocket, PodResourcesSocket.
//
// StopKubelet and StartKubelet let tests take the kubelet away and bring it back: the pods keep
// running, and the Node keeps the status the stopped kubelet last posted (no node lifecycle
// controller marks it Unknown); StartKubelet waits for a Ready=True whose heartbeat is newer than
// the stopped kubelet's, the new kubelet's.
//
// # Cleaning up
//
// Start stops everything when the test ends, failed or not. Down deletes the pods left in the
// API and waits until the kubelet has killed their processes, stops the kubelet, kube-apiserver
// (which gets 3 s: its graceful termination would wait for the watches of podgate and DRA
// drivers) and etcd, kills whatever still runs in the cluster's cgroups and removes them,
// unmounts what the kubelet left mounted in the directory and removes it if Up made it. The
// sandboxes themselves are the rig's to stop and remove: rig.Down removes every pod sandbox of
// its containerd. Every daemon also gets SIGKILL from the kernel if the test binary dies
// (Pdeathsig), so a panic or a timeout does not leave daemons behind.
//
// A test that stops or removes sandboxes itself while the kubelet runs races the kubelet:
// containerd does not serialise two calls that stop one sandbox (StopPodSandbox, and
// RemovePodSandbox, which stops first). Both run CNI DEL, and when one removes the network
// namespace as the other's plugin opens it, the plugin fails ("unknown FS magic on
// .../netns/cni-...: ef53"); a RemoveContainer meeting the kubelet's fails ("container is
// already in removing state"). containerd reports a sandbox NOTREADY when its pause process
// exits, before CNI DEL, and closes its network namespace last: such a test waits for the
// namespace closed (netNamespaceClosed in the verbose status), then stops the kubelet before
// it removes the sandbox, as teardownPods in this package's tests does.
//
// What the kubelet shares with the host whatever its configuration says:
// /var/lib/kubelet/device-plugins (its device-plugin registration socket, a fixed path in the
// kubelet), and the symlinks it makes to container logs in /var/log/containers. Tests use
// neither.
package cluster
