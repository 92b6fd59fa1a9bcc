// Package crifixture makes CRI sandboxes and containers as the kubelet and containerd list
// them, with the kubelet's labels and annotations in their real sizes, for tests of lists too
// large for one gRPC message (a node with tens of thousands of containers).
package crifixture
