package cgroup

import "github.com/containerd/cgroups/v3"

// Detect tells the node's cgroup mode (github.com/containerd/cgroups/v3's Mode, decided once
// per process), the controllers of its cgroup v2 hierarchy, and whether memory QoS can apply.
// Log it once at start-up: logger.Info("Cgroups", node.KeysAndValues()...).
func Detect() Node {
	return DetectAt(modeName(cgroups.Mode()), DefaultRoot)
}

// modeName names a cgroups/v3 mode.
func modeName(m cgroups.CGMode) string {
	switch m {
	case cgroups.Unified:
		return ModeUnified
	case cgroups.Hybrid:
		return ModeHybrid
	case cgroups.Legacy:
		return ModeLegacy
	}
	return ModeUnavailable
}
