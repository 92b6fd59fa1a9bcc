package sysctl

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// RunningKernel returns the version of the kernel podgate runs on.
func RunningKernel() (KernelVersion, error) {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return KernelVersion{}, fmt.Errorf("uname: %w", err)
	}
	return ParseKernelVersion(unix.ByteSliceToString(u.Release[:]))
}
