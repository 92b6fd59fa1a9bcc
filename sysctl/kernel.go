package sysctl

import (
	"fmt"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// KernelVersion is a kernel's major and minor version.
type KernelVersion struct{ Major, Minor int }

func (v KernelVersion) String() string { return fmt.Sprintf("%d.%d", v.Major, v.Minor) }

// AtLeast reports whether v is at least o.
func (v KernelVersion) AtLeast(o KernelVersion) bool {
	return v.Major > o.Major || (v.Major == o.Major && v.Minor >= o.Minor)
}

// ParseKernelVersion reads "6.18.44-fc-v595" as 6.18.
func ParseKernelVersion(release string) (KernelVersion, error) {
	major, rest, ok := strings.Cut(release, ".")
	if !ok {
		return KernelVersion{}, fmt.Errorf("kernel release %q: want major.minor", release)
	}
	minor := rest
	if i := strings.IndexFunc(rest, func(r rune) bool { return r < '0' || r > '9' }); i >= 0 {
		minor = rest[:i]
	}
	ma, err1 := strconv.Atoi(major)
	mi, err2 := strconv.Atoi(minor)
	if err1 != nil || err2 != nil {
		return KernelVersion{}, fmt.Errorf("kernel release %q: want major.minor", release)
	}
	return KernelVersion{ma, mi}, nil
}

// RunningKernel returns the version of the kernel podgate runs on.
func RunningKernel() (KernelVersion, error) {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return KernelVersion{}, fmt.Errorf("uname: %w", err)
	}
	return ParseKernelVersion(unix.ByteSliceToString(u.Release[:]))
}
