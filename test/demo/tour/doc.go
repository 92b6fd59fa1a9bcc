// Package tour is what `make demo` shows, as steps a program or a test can run: a real node
// (the rig's containerd with a CNI chain that records what CNI ADD saw, an API server with etcd,
// the test DRA driver, two throttled local registries) with podgate in front of containerd, and
// the steps that show, one line each, what podgate does there and why it matters: governed
// image pulls, pods started as the kubelet starts them (sysctl defaults and verification, a DRA
// network claim prepared before CNI and moved into the pod, the pull queue), a refused
// node-wide sysctl, PodResources as a meta-CNI plugin reads it, and a timeline of each pod
// start built from podgate's own timings (package timeline).
//
// The demo plays the kubelet: it calls podgate's CRI socket with k8s.io/cri-client, the
// kubelet's own client, for pods it creates in the API server. No kubelet runs: podgate's DRA
// and pull cancellation need the API server, not a kubelet, and the kubelet's build would
// double the demo's first run.
package tour
