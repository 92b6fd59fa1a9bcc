package sysctl

import (
	"errors"
	"fmt"
	"os"
	"slices"

	"k8s.io/klog/v2"
)

// ParseNode returns the configured node sysctls (the configuration's sysctls.node), validated
// against the sysctl tree procSys: well-formed names that exist on this node and values
// without control characters. Every bad entry is reported.
func ParseNode(node map[string]string, procSys string) (map[Name]string, error) {
	out := make(map[Name]string, len(node))
	var errs []error
	for k, v := range node {
		n, err := ParseName(k)
		if err == nil {
			err = CheckValue(n, v)
		}
		if err == nil {
			var path string
			if path, err = n.Path(procSys); err == nil {
				_, err = os.Stat(path)
			}
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("sysctls.node %q: %w", k, err))
			continue
		}
		out[n] = v
	}
	return out, errors.Join(errs...)
}

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
