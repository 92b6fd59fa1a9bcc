// Package kubeletinfo describes the node's kubelet as podgate decides from it: its version
// (the Node's kubeletVersion), the parts of its configuration file that overlap podgate's
// features (feature gates, defaultPodSysctls, serializeImagePulls, maxParallelImagePulls),
// and whether the node runs cgroup v2. From that it says, per feature, who does the work on
// this node (Decision): the kubelet, podgate, or nobody, so that every value has exactly one
// writer. NodeReader reads the Node until one read succeeds and hands it to what agent learns
// from it, the kubelet's version into the View first.
//
// It is a leaf: it imports no feature, and features never import it; agent reads the
// description and hands each feature plain values through its constructor's options.
package kubeletinfo
