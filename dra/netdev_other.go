//go:build !linux

package dra

import (
	"context"
	"fmt"
	"runtime"

	"github.com/containerd/errdefs"
	"github.com/vishvananda/netlink"
)

// errNetdevNeedsLinux is what attaching and detaching return off Linux: they move interfaces
// between Linux network namespaces.
var errNetdevNeedsLinux = errdefs.ErrNotImplemented.WithMessage(fmt.Sprintf("network devices need Linux, this is %s", runtime.GOOS))

// Attach moves a host network interface into a pod's network namespace. Off Linux it fails.
func Attach(context.Context, string, string, InterfaceConfig) (Attached, error) {
	return Attached{}, errNetdevNeedsLinux
}

// Detach gives back an interface that Attach moved into a pod. Off Linux it fails.
func Detach(context.Context, Attached, string) error { return errNetdevNeedsLinux }

// Resume finishes an Attach a crash interrupted. Off Linux Attach moves nothing: nothing is
// found.
func Resume(context.Context, string, string, InterfaceConfig) (Attached, bool, error) {
	return Attached{}, false, nil
}

// ListLinks lists the interfaces of a network namespace. Off Linux there are none to list.
func ListLinks(*netlink.Handle) ([]netlink.Link, error) { return nil, errNetdevNeedsLinux }

// Reclaim gives back what an interrupted Attach left. Off Linux Attach moves nothing: there is
// nothing to give back.
func Reclaim(context.Context, string, string) error { return nil }
