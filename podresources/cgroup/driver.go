package cgroup

import (
	"fmt"
	"path"
	"strings"

	"github.com/containerd/errdefs"
)

// The runtime's cgroup drivers, as [Driver] names them.
const (
	// DriverSystemd: linux.cgroupsPath is "slice:prefix:name", and systemd places the
	// container's scope under the expanded slice.
	DriverSystemd = "systemd"
	// DriverCgroupfs: linux.cgroupsPath is the cgroup's path below each hierarchy's root.
	DriverCgroupfs = "cgroupfs"
)

// defaultSlice is runc's parent slice for a systemd cgroups path with an empty slice (as
// root; rootless runc uses user.slice).
const defaultSlice = "system.slice"

// Driver tells the runtime's cgroup driver from a runtime spec's linux.cgroupsPath:
// DriverSystemd for the "slice:prefix:name" form (containerd's CRI plugin with the systemd
// driver writes e.g. "kubepods-besteffort-pod123.slice:cri-containerd:abc"), DriverCgroupfs
// for a path (e.g. "/kubepods/besteffort/pod123/abc"); a bare slice, a pod's cgroup parent
// with the systemd driver ("kubepods-besteffort-pod123.slice"), is DriverSystemd too. It does
// not validate: [Read] does.
func Driver(cgroupsPath string) string {
	if _, _, _, ok := splitSystemd(cgroupsPath); ok || isSlice(cgroupsPath) {
		return DriverSystemd
	}
	return DriverCgroupfs
}

// splitSystemd splits the systemd form "slice:prefix:name", as runc does (specconv: exactly
// three parts). A path starting with "/" is a cgroupfs path even with two colons, and so is
// one whose first part is neither empty (runc's default slice) nor a slice.
func splitSystemd(p string) (slice, prefix, name string, ok bool) {
	if strings.HasPrefix(p, "/") {
		return "", "", "", false
	}
	parts := strings.Split(p, ":")
	if len(parts) != 3 || (parts[0] != "" && !strings.HasSuffix(parts[0], ".slice")) {
		return "", "", "", false
	}
	return parts[0], parts[1], parts[2], true
}

// isSlice tells a bare systemd slice name ("kubepods-burstable-pod123.slice"), the form of a
// pod's cgroup parent with the systemd driver.
func isSlice(p string) bool {
	return strings.HasSuffix(p, ".slice") && !strings.ContainsAny(p, ":/")
}

// groupPath is a cgroups path resolved to the cgroup's path below a hierarchy's root
// ("/kubepods.slice/.../cri-containerd-abc.scope"), with the driver it was written for.
type groupPath struct {
	path   string
	driver string
}

// resolve checks a runtime's linux.cgroupsPath and resolves it to the cgroup's path below each
// hierarchy's root, as runc does: a cgroupfs path as it is, a systemd one expanded (slice
// "a-b.slice" is /a.slice/a-b.slice, the unit is "prefix-name.scope"); a bare slice (a pod's
// cgroup parent) is the slice's own cgroup. What could lead outside
// the hierarchy is refused: "..", a path that is not clean, a relative cgroupfs path (runc
// would nest it under its own cgroup), a host path, NUL.
func resolve(cgroupsPath string) (groupPath, error) {
	switch {
	case cgroupsPath == "":
		return groupPath{}, invalid(cgroupsPath, "empty")
	case strings.ContainsRune(cgroupsPath, 0):
		return groupPath{}, invalid(cgroupsPath, "contains NUL")
	}
	if isSlice(cgroupsPath) {
		// A pod's cgroup parent with the systemd driver (LinuxPodSandboxConfig.cgroup_parent):
		// the pod cgroup is the slice itself.
		p, err := expandSlice(cgroupsPath)
		switch {
		case err != nil:
			return groupPath{}, invalid(cgroupsPath, err.Error())
		case p == "/":
			return groupPath{}, invalid(cgroupsPath, "the root slice is no pod's")
		}
		return groupPath{path: p, driver: DriverSystemd}, nil
	}
	if slice, prefix, name, ok := splitSystemd(cgroupsPath); ok {
		p, err := systemdPath(slice, prefix, name)
		if err != nil {
			return groupPath{}, invalid(cgroupsPath, err.Error())
		}
		return groupPath{path: p, driver: DriverSystemd}, nil
	}
	switch {
	case !strings.HasPrefix(cgroupsPath, "/"):
		return groupPath{}, invalid(cgroupsPath, "not absolute, and not slice:prefix:name")
	case hasDotDot(cgroupsPath):
		return groupPath{}, invalid(cgroupsPath, `has a ".." element`)
	case path.Clean(cgroupsPath) != cgroupsPath:
		return groupPath{}, invalid(cgroupsPath, "not clean")
	case cgroupsPath == "/":
		return groupPath{}, invalid(cgroupsPath, "the root cgroup is no container's")
	case cgroupsPath == DefaultRoot || strings.HasPrefix(cgroupsPath, DefaultRoot+"/"):
		return groupPath{}, invalid(cgroupsPath, "a host path; want the path below the cgroup mount")
	}
	return groupPath{path: cgroupsPath, driver: DriverCgroupfs}, nil
}

// systemdPath is the cgroup of unit prefix-name.scope (or of slice name) in slice.
func systemdPath(slice, prefix, name string) (string, error) {
	if slice == "" {
		slice = defaultSlice
	}
	dir, err := expandSlice(slice)
	if err != nil {
		return "", err
	}
	switch {
	case name == "":
		return "", fmt.Errorf("no name")
	case strings.Contains(prefix, "/") || strings.Contains(name, "/"):
		return "", fmt.Errorf(`prefix or name has a "/"`)
	}
	// runc's getUnitName (github.com/opencontainers/cgroups systemd/common.go): a scope,
	// unless the name is a slice.
	unit := prefix + "-" + name + ".scope"
	if strings.HasSuffix(name, ".slice") {
		unit = name
	}
	if unit == "." || unit == ".." {
		return "", fmt.Errorf("unit %q", unit)
	}
	return path.Join(dir, unit), nil
}

// expandSlice turns a systemd slice name into its path below the hierarchy's root, each dash
// a level: "kubepods-besteffort-pod123.slice" is
// /kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod123.slice. It is runc's
// ExpandSlice (github.com/opencontainers/cgroups v0.1.0, systemd/common.go), which is stricter
// than cgroups/v3's dashesToPath: no "/", no empty component ("a--b.slice", "-a.slice").
func expandSlice(slice string) (string, error) {
	const suffix = ".slice"
	if len(slice) < len(suffix) || !strings.HasSuffix(slice, suffix) || strings.Contains(slice, "/") {
		return "", fmt.Errorf("invalid slice name %q", slice)
	}
	name := strings.TrimSuffix(slice, suffix)
	if name == "-" {
		return "/", nil // the root slice
	}
	var p, prefix strings.Builder
	p.Grow(len(slice) * 2)
	for component := range strings.SplitSeq(name, "-") {
		if component == "" {
			return "", fmt.Errorf("invalid slice name %q", slice)
		}
		p.WriteString("/" + prefix.String() + component + suffix)
		prefix.WriteString(component + "-")
	}
	return p.String(), nil
}

// hasDotDot tells whether a slash-separated path has a ".." element.
func hasDotDot(p string) bool {
	for e := range strings.SplitSeq(p, "/") {
		if e == ".." {
			return true
		}
	}
	return false
}

// invalid is the error for a refused cgroups path.
func invalid(cgroupsPath, why string) error {
	return fmt.Errorf("%w: cgroups path %q: %s", errdefs.ErrInvalidArgument, cgroupsPath, why)
}
