package cgroup

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// The modes of a node's cgroup hierarchies, as [Node.Mode] and [Held.Mode] name them. They are
// the modes of github.com/containerd/cgroups/v3's Mode.
const (
	// ModeUnified is cgroup v2 alone, mounted at the root.
	ModeUnified = "unified"
	// ModeHybrid is cgroup v1 controllers at the root with a cgroup v2 mount at root/unified.
	ModeHybrid = "hybrid"
	// ModeLegacy is cgroup v1 alone.
	ModeLegacy = "legacy"
	// ModeUnavailable is no cgroup hierarchy at the root.
	ModeUnavailable = "unavailable"
)

// DefaultRoot is where a node's cgroup hierarchies are mounted.
const DefaultRoot = "/sys/fs/cgroup"

// controllersFile lists a cgroup v2 cgroup's controllers.
const controllersFile = "cgroup.controllers"

// Node is what podgate can do with a node's cgroups.
type Node struct {
	// Mode is ModeUnified, ModeHybrid, ModeLegacy or ModeUnavailable.
	Mode string
	// V2Mountpoint is where the cgroup v2 hierarchy is mounted: the root in unified mode,
	// root/unified in hybrid mode; empty otherwise.
	V2Mountpoint string
	// V2Controllers are the controllers of the cgroup v2 hierarchy (its root's
	// cgroup.controllers), sorted.
	V2Controllers []string
	// MemoryQoS is whether memory QoS (cgroup v2 memory.min and memory.high) can apply: only
	// in unified mode with the memory controller, as the kubelet requires.
	MemoryQoS bool
	// MemoryQoSReason says why memory QoS cannot apply; empty when it can.
	MemoryQoSReason string
}

// DetectAt is [Detect] for a given mode (one of the Mode constants) and root, where the
// cgroup hierarchies are mounted ([DefaultRoot] on a node); tests lay out a root of their own.
func DetectAt(mode, root string) Node {
	n := Node{Mode: mode, V2Mountpoint: v2Mountpoint(mode, root)}
	var readErr error
	if n.V2Mountpoint != "" {
		n.V2Controllers, readErr = readControllers(n.V2Mountpoint)
	}
	n.MemoryQoS, n.MemoryQoSReason = memoryQoSApplies(n, root, readErr)
	return n
}

// KeysAndValues are the node's facts as one log line's key/value pairs:
// logger.Info("Cgroups", node.KeysAndValues()...).
func (n Node) KeysAndValues() []any {
	kv := []any{"mode", n.Mode, "v2Controllers", n.V2Controllers, "memoryQoS", n.MemoryQoS}
	if n.MemoryQoSReason != "" {
		kv = append(kv, "memoryQoSReason", n.MemoryQoSReason)
	}
	return kv
}

// v2Mountpoint is where mode mounts cgroup v2 under root; "" when it does not.
func v2Mountpoint(mode, root string) string {
	switch mode {
	case ModeUnified:
		return root
	case ModeHybrid:
		return filepath.Join(root, "unified")
	}
	return ""
}

// readControllers reads the cgroup.controllers of a cgroup v2 directory, sorted.
func readControllers(dir string) ([]string, error) {
	b, err := os.ReadFile(filepath.Join(dir, controllersFile))
	if err != nil {
		return nil, err
	}
	c := strings.Fields(string(b))
	slices.Sort(c)
	return c, nil
}

// memoryQoSApplies says whether memory QoS applies to n, and why not when it does not.
func memoryQoSApplies(n Node, root string, readErr error) (bool, string) {
	has := "v2 has: " + controllerList(n.V2Controllers)
	memory := slices.Contains(n.V2Controllers, "memory")
	switch n.Mode {
	case ModeUnified:
		switch {
		case readErr != nil:
			return false, "unified hierarchy, but its controllers cannot be read: " + describe(readErr)
		case !memory:
			return false, "unified hierarchy, but the memory controller is not enabled (" + has + ")"
		}
		return true, ""
	case ModeHybrid:
		switch {
		case readErr != nil:
			return false, "hybrid hierarchy: the memory controller is on cgroup v1 (the v2 controllers cannot be read: " + describe(readErr) + ")"
		case memory:
			// The kubelet does memory QoS only in unified mode, and runc sets a
			// hybrid node's memory limits on v1.
			return false, "hybrid hierarchy: memory QoS needs the unified hierarchy, and memory limits are set on cgroup v1 here (" + has + ")"
		}
		return false, "hybrid hierarchy: the memory controller is on cgroup v1 (" + has + ")"
	case ModeLegacy:
		return false, "legacy hierarchy: cgroup v1 only, which has no memory.min or memory.high"
	}
	return false, "no cgroup hierarchy mounted at " + root
}

// controllerList shows controllers for a person.
func controllerList(c []string) string {
	if len(c) == 0 {
		return "none"
	}
	return strings.Join(c, " ")
}

// describe shortens a file error for a reason: the path is in the error already.
func describe(err error) string {
	if errors.Is(err, os.ErrNotExist) {
		var pe *os.PathError
		if errors.As(err, &pe) {
			return pe.Path + " does not exist"
		}
	}
	return err.Error()
}
