//go:build !linux

package cgroup

// Detect says cgroups are unavailable: they are Linux's.
func Detect() Node {
	return DetectAt(ModeUnavailable, DefaultRoot)
}
