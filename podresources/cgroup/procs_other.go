//go:build !linux

package cgroup

import (
	"fmt"

	"github.com/containerd/errdefs"
)

// Procs fails: cgroups are Linux's.
func Procs(cgroupsPath string) ([]int, error) {
	return nil, fmt.Errorf("%w: cgroups are Linux's", errdefs.ErrNotImplemented)
}
