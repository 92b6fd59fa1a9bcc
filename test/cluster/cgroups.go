//go:build linux

package cluster

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// cgroupParent holds the cgroup roots of all test clusters, one per kubelet.
const cgroupParent = "/podgate-cluster"

// killTimeout bounds the wait for processes killed in a cluster's cgroups to be gone.
const killTimeout = 30 * time.Second

// cgroupMounts returns the mount points of the host's cgroup hierarchies (v1 controllers and the
// v2 unified hierarchy) that show their whole hierarchy.
func cgroupMounts() ([]string, error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	var mounts []string
	for line := range strings.SplitSeq(string(b), "\n") {
		// id parent major:minor root mountpoint options [optional...] - fstype source superoptions
		pre, post, ok := strings.Cut(line, " - ")
		f, g := strings.Fields(pre), strings.Fields(post)
		if !ok || len(f) < 5 || len(g) < 1 || (g[0] != "cgroup" && g[0] != "cgroup2") || f[3] != "/" {
			continue
		}
		mp := unescapeMountinfo(f[4])
		if strings.HasPrefix(mp, "/sys/fs/cgroup") && !slices.Contains(mounts, mp) {
			mounts = append(mounts, mp)
		}
	}
	if len(mounts) == 0 {
		return nil, errors.New("no cgroup hierarchy mounted under /sys/fs/cgroup")
	}
	return mounts, nil
}

// makeCgroupRoot creates root (a cgroupfs path such as /podgate-cluster/0a1b2c3d) in every
// hierarchy: the kubelet refuses to start unless its cgroupRoot exists in each.
func makeCgroupRoot(root string) error {
	var err error
	// Another cluster's removeCgroupRoot may remove the shared parent between our two mkdirs.
	for range 3 {
		if err = makeCgroupDirs(root); !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	return err
}

func makeCgroupDirs(root string) error {
	mounts, err := cgroupMounts()
	if err != nil {
		return err
	}
	for _, m := range mounts {
		// Each level separately: a v1 cpuset cgroup starts with no CPUs and no memory nodes,
		// and takes no process until given its parent's.
		dir := m
		for part := range strings.SplitSeq(strings.Trim(root, "/"), "/") {
			parent := dir
			dir = filepath.Join(dir, part)
			if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
				return fmt.Errorf("create cgroup %s: %w", dir, err)
			}
			for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
				if err := copyIfEmpty(filepath.Join(parent, f), filepath.Join(dir, f)); err != nil {
					return fmt.Errorf("create cgroup %s: %w", dir, err)
				}
			}
		}
	}
	return nil
}

// copyIfEmpty copies a cgroup file's value from the parent when the child's is empty; a file that
// does not exist (not the cpuset hierarchy) is fine.
func copyIfEmpty(from, to string) error {
	cur, err := os.ReadFile(to)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil || strings.TrimSpace(string(cur)) != "" {
		return err
	}
	v, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	return os.WriteFile(to, v, 0o644)
}

// cgroupDirs returns every directory of root's subtree in every hierarchy, deepest first.
func cgroupDirs(root string) ([]string, error) {
	mounts, err := cgroupMounts()
	if err != nil {
		return nil, err
	}
	var dirs []string
	for _, m := range mounts {
		err := filepath.WalkDir(filepath.Join(m, root), func(p string, d fs.DirEntry, err error) error {
			if errors.Is(err, fs.ErrNotExist) {
				return nil // removed meanwhile
			}
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return err
		})
		if err != nil {
			return nil, err
		}
	}
	slices.SortFunc(dirs, func(a, b string) int { return strings.Count(b, "/") - strings.Count(a, "/") })
	return dirs, nil
}

// removeCgroupRoot kills every process left in root's subtree (containers of pods the kubelet did
// not stop) and removes the subtree in every hierarchy. The parent of all roots goes too when no
// other cluster uses it.
func removeCgroupRoot(ctx context.Context, root string) error {
	var pids []int
	var dirErr error
	err := wait.PollUntilContextTimeout(ctx, pollInterval, killTimeout, true, func(context.Context) (bool, error) {
		dirs, err := cgroupDirs(root)
		if err != nil {
			dirErr = err
			return false, err
		}
		pids = cgroupPids(dirs)
		for _, pid := range pids {
			// Gone already is fine: it is what we want.
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		return len(pids) == 0, nil
	})
	switch {
	case dirErr != nil:
		return dirErr
	case err != nil:
		return fmt.Errorf("processes %v still in cgroup %s after %s: %w", pids, root, killTimeout, err)
	}
	dirs, err := cgroupDirs(root)
	if err != nil {
		return err
	}
	var errs []error
	for _, d := range dirs {
		if err := syscall.Rmdir(d); err != nil && !errors.Is(err, syscall.ENOENT) {
			errs = append(errs, fmt.Errorf("remove cgroup %s: %w", d, err))
		}
	}
	if mounts, err := cgroupMounts(); err == nil {
		for _, m := range mounts {
			// Fails while another cluster's root is in it; makeCgroupRoot recreates it.
			_ = syscall.Rmdir(filepath.Join(m, cgroupParent))
		}
	}
	return errors.Join(errs...)
}

// cgroupPids returns the processes in the given cgroups.
func cgroupPids(dirs []string) []int {
	var pids []int
	for _, d := range dirs {
		b, err := os.ReadFile(filepath.Join(d, "cgroup.procs"))
		if err != nil {
			continue // removed meanwhile
		}
		for f := range strings.FieldsSeq(string(b)) {
			if pid, err := strconv.Atoi(f); err == nil && !slices.Contains(pids, pid) {
				pids = append(pids, pid)
			}
		}
	}
	return pids
}
