// Package e2e holds podgate's end-to-end tests: the real podgate binary in front of a real
// containerd, runc and CNI (package rig), driven with k8s.io/cri-client as the kubelet drives
// its runtime. The tests need root and an installed rig (make rig); they skip otherwise.
package e2e
