//go:build !linux

package cgroup

import (
	"context"
	"fmt"

	"github.com/containerd/errdefs"
)

// Read fails: cgroups are Linux's.
func Read(ctx context.Context, cgroupsPath string, opts ...ReadOption) (*Held, error) {
	return nil, fmt.Errorf("%w: cgroups are Linux's", errdefs.ErrNotImplemented)
}
