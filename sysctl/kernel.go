package sysctl

import (
	"fmt"

	"k8s.io/apimachinery/pkg/util/version"
)

// KernelVersion is a kernel's major and minor version: the kubelet's kernel gates for sysctls
// name no more than that ("4.5"), so the patch level never decides.
type KernelVersion struct{ Major, Minor uint }

func (v KernelVersion) version() *version.Version { return version.MajorMinor(v.Major, v.Minor) }

func (v KernelVersion) String() string { return v.version().String() }

// AtLeast reports whether v is at least o.
func (v KernelVersion) AtLeast(o KernelVersion) bool { return v.version().AtLeast(o.version()) }

// ParseKernelVersion reads a kernel release as the kubelet does (version.ParseGeneric):
// "6.18.44-fc-v595" is 6.18.44, kept as 6.18.
func ParseKernelVersion(release string) (KernelVersion, error) {
	v, err := version.ParseGeneric(release)
	if err != nil {
		return KernelVersion{}, fmt.Errorf("kernel release %q: %w", release, err)
	}
	return KernelVersion{Major: v.Major(), Minor: v.Minor()}, nil
}

// mustKernel is a kernel gate written as the kubelet writes its own ("4.15").
func mustKernel(s string) KernelVersion {
	v := version.MustParseGeneric(s)
	return KernelVersion{Major: v.Major(), Minor: v.Minor()}
}
