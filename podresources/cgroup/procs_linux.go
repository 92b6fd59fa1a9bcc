package cgroup

import (
	"fmt"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/containerd/cgroups/v3"
	"github.com/containerd/errdefs"
)

// v1ProcsHierarchies are the cgroup v1 hierarchies Procs looks in, in order: runc puts every
// container in each of them.
var v1ProcsHierarchies = []string{"pids", "memory", "cpu,cpuacct", "cpu"}

// Procs lists the processes in a container's cgroup (its cgroup.procs), cgroupsPath in either
// driver's form, as [Read] takes it: on cgroup v1 (legacy or hybrid) from the pids hierarchy
// (or memory, cpu when there is none), on v2 from the unified one. It costs a few system
// calls, where the runtime's verbose status of a container costs a JSON encoding of its whole
// runtime spec. A cgroup that exists nowhere is errdefs.ErrNotFound.
func Procs(cgroupsPath string) ([]int, error) {
	return procs(modeName(cgroups.Mode()), DefaultRoot, cgroupsPath)
}

func procs(mode, root, cgroupsPath string) ([]int, error) {
	gp, err := resolve(cgroupsPath)
	if err != nil {
		return nil, err
	}
	var mounts []string
	switch mode {
	case ModeUnified:
		mounts = []string{root}
	case ModeHybrid, ModeLegacy:
		for _, h := range v1ProcsHierarchies {
			mounts = append(mounts, filepath.Join(root, h))
		}
	default:
		return nil, fmt.Errorf("%w: no cgroup hierarchy mounted at %s", errdefs.ErrFailedPrecondition, root)
	}
	var other error // a failure other than the cgroup's or the hierarchy's absence
	for _, m := range mounts {
		d, err := openBeneath(m, gp.path)
		if err != nil {
			if !errdefs.IsNotFound(err) && !errdefs.IsFailedPrecondition(err) && other == nil {
				other = err
			}
			continue
		}
		file := filepath.Join(m, gp.path, "cgroup.procs")
		b, err := readAt(d, "cgroup.procs", make([]byte, 0, 64))
		d.Close()
		if err != nil {
			return nil, fileError(file, err)
		}
		var pids []int
		for _, f := range strings.Fields(string(b)) {
			pid, err := strconv.Atoi(f)
			if err != nil {
				return nil, fmt.Errorf("%s: %q is no pid", file, f)
			}
			pids = append(pids, pid)
		}
		return pids, nil
	}
	if other != nil {
		return nil, other
	}
	return nil, fmt.Errorf("%w: cgroup %s in no hierarchy under %s", errdefs.ErrNotFound, gp.path, root)
}
