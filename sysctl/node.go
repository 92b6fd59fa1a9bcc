package sysctl

import (
	"fmt"
	"slices"

	"k8s.io/klog/v2"
)

// ApplyNode sets the configured node sysctls where they differ, logging each change, and
// returns the ones it changed: a value already in place is not written again, so podgate's
// restarts leave the node alone.
func ApplyNode(logger klog.Logger, values map[Name]string) ([]Name, error) {
	names := make([]Name, 0, len(values))
	for n := range values {
		names = append(names, n)
	}
	slices.Sort(names)
	var changed []Name
	for _, n := range names {
		old, err := ReadNode(n)
		if err != nil {
			return changed, fmt.Errorf("sysctls.node %s: %w", n, err)
		}
		if SameValue(n, old, values[n]) {
			continue
		}
		if err := WriteNode(n, values[n]); err != nil {
			return changed, fmt.Errorf("sysctls.node %s: %w", n, err)
		}
		logger.Info("Set node sysctl", "sysctl", n, "from", old, "to", values[n])
		changed = append(changed, n)
	}
	return changed, nil
}
