package registry

import (
	"path"
	"path/filepath"
	"strings"
)

// ContainerdCgroupsPath is the linux.cgroupsPath containerd gives a container (or a sandbox's
// pause container) with this cgroup parent (internal/cri/server getCgroupsPath):
// "slice:cri-containerd:id" under a systemd slice, parent/id otherwise; without a parent the
// CRI plugin sets none and its default spec's /k8s.io/id stays (oci populateDefaultUnixSpec:
// /namespace/id). Taking it from
// the CreateContainer request saves the check after StartContainer a verbose ContainerStatus
// (a JSON encoding of the whole runtime spec) beside the kubelet's own next call; a cgroup not
// found there is looked up in the runtime's status after all (the resources feature).
func ContainerdCgroupsPath(parent, id string) string {
	if parent == "" {
		return path.Join("/", criNamespace, id)
	}
	if base := path.Base(parent); strings.HasSuffix(base, ".slice") {
		return base + ":cri-containerd:" + id
	}
	return filepath.Join(parent, id)
}

// criNamespace is the containerd namespace of containerd's CRI plugin.
const criNamespace = "k8s.io"
