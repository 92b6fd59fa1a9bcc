package cgroup

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"

	"github.com/containerd/cgroups/v3"
	"github.com/containerd/cgroups/v3/cgroup1"
	"github.com/containerd/cgroups/v3/cgroup2"
	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"
)

// The limit files Read reads, by controller.
var (
	v1Files = map[cgroup1.Name][]string{
		cgroup1.Cpu:    {"cpu.shares", "cpu.cfs_quota_us", "cpu.cfs_period_us"},
		cgroup1.Cpuset: {"cpuset.cpus", "cpuset.effective_cpus", "cpuset.mems"},
		cgroup1.Memory: {"memory.limit_in_bytes", "memory.memsw.limit_in_bytes"},
	}
	v2Files = map[string][]string{
		"cpu":    {"cpu.weight", "cpu.max"},
		"cpuset": {"cpuset.cpus", "cpuset.cpus.effective", "cpuset.mems"},
		"memory": {"memory.min", "memory.high", "memory.max", "memory.swap.max", "memory.oom.group"},
	}
)

// Read reads what a container's cgroup holds. cgroupsPath is the container's runtime spec
// linux.cgroupsPath, in either driver's form ([Driver]): "/kubepods/besteffort/pod123/abc" or
// "kubepods-besteffort-pod123.slice:cri-containerd:abc" (in the hierarchy at
// /kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod123.slice/cri-containerd-abc.scope).
//
// The cgroup is found through github.com/containerd/cgroups/v3 — cgroup1.Load with a static
// path on cgroup v1 (each controller's hierarchy where the cgroup exists), cgroup2.Load on v2
// — and its limit files are read (see [Held]); in hybrid mode the limits are v1's, and the
// hugetlb limits v2's when v1 has no hugetlb hierarchy. A file that does not exist leaves its
// field unset. A cgroup that exists in no hierarchy is errdefs.ErrNotFound; a refused path or
// unified key errdefs.ErrInvalidArgument; a node without cgroups
// errdefs.ErrFailedPrecondition. Read never writes.
func Read(ctx context.Context, cgroupsPath string, opts ...ReadOption) (*Held, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	c := readConfig{root: DefaultRoot}
	for _, o := range opts {
		o(&c)
	}
	if c.mode == "" {
		c.mode = modeName(cgroups.Mode())
	}
	for _, k := range c.unified {
		if err := checkUnifiedKey(k); err != nil {
			return nil, err
		}
	}
	gp, err := resolve(cgroupsPath)
	if err != nil {
		return nil, err
	}
	r := &reader{buf: make([]byte, 0, 512), held: &Held{
		Mode: c.mode, Driver: gp.driver, Path: gp.path, Dirs: map[string]string{},
		PageSize: int64(os.Getpagesize()), Files: map[string]string{},
	}}
	switch c.mode {
	case ModeUnified:
		r.held.Version = 2
		err = r.readV2(c, gp.path)
	case ModeHybrid, ModeLegacy:
		r.held.Version = 1
		err = r.readV1(c, gp.path)
	default:
		err = fmt.Errorf("%w: no cgroup hierarchy mounted at %s", errdefs.ErrFailedPrecondition, c.root)
	}
	if err = errors.Join(err, r.err); err != nil {
		return nil, err
	}
	slices.Sort(r.held.Absent)
	if err := r.held.fill(); err != nil {
		return nil, err
	}
	klog.FromContext(ctx).V(5).Info("Read cgroup", "cgroupsPath", cgroupsPath, "mode", c.mode, "dirs", r.held.Dirs)
	return r.held, nil
}

// checkUnifiedKey checks a unified key is a file name, as runc does.
func checkUnifiedKey(k string) error {
	if k == "" || k == "." || k == ".." || strings.ContainsAny(k, "/\x00") || !strings.Contains(k, ".") {
		return fmt.Errorf("%w: unified key %q: want a cgroup v2 file name (controller.parameter)", errdefs.ErrInvalidArgument, k)
	}
	return nil
}

// reader reads a cgroup's files into a Held, keeping the first I/O error.
type reader struct {
	held *Held
	buf  []byte // reused by read
	err  error
}

// readV1 reads the cgroup from the cgroup v1 hierarchies under c.root.
func (r *reader) readV1(c readConfig, path string) error {
	subsystems := v1Hierarchy(c.root)
	cg, err := cgroup1.Load(cgroup1.StaticPath(path), cgroup1.WithHierarchy(func() ([]cgroup1.Subsystem, error) {
		return subsystems, nil
	}))
	if errors.Is(err, cgroup1.ErrCgroupDeleted) {
		return fmt.Errorf("%w: cgroup %s in no cgroup v1 hierarchy under %s", errdefs.ErrNotFound, path, c.root)
	}
	if err != nil {
		return fmt.Errorf("%w: load cgroup %s: %w", errdefs.ErrUnknown, path, err)
	}
	found := map[cgroup1.Name]bool{}
	for _, s := range cg.Subsystems() {
		p, ok := s.(pather)
		if !ok {
			continue
		}
		dir, err := openBeneath(p.Path("/"), path)
		if err != nil {
			return err // removed meanwhile, or worse
		}
		found[s.Name()] = true
		r.held.Dirs[string(s.Name())] = p.Path(path)
		r.readV1Controller(dir, s.Name())
		_ = dir.Close() // read-only
	}
	for name, files := range v1Files {
		if !found[name] {
			r.held.Absent = append(r.held.Absent, files...)
		}
	}
	if c.mode == ModeHybrid && !found[cgroup1.Hugetlb] {
		r.readHybridHugetlb(c, path)
	}
	return nil
}

// pather is a cgroup1 subsystem with a directory (its Path is cgroup1's unexported pather).
type pather interface {
	cgroup1.Subsystem
	Path(path string) string
}

// readV1Controller reads a cgroup v1 controller's limit files.
func (r *reader) readV1Controller(dir *os.File, name cgroup1.Name) {
	if name == cgroup1.Hugetlb {
		r.readHugetlb(dir, ".limit_in_bytes")
		return
	}
	for _, f := range v1Files[name] {
		r.read(dir, f)
	}
}

// readHybridHugetlb reads the hugetlb limits from cgroup v2 of a hybrid node, where the
// hugetlb controller can be (this one's v2 has only hugetlb): when the cgroup exists there
// and has the controller.
func (r *reader) readHybridHugetlb(c readConfig, path string) {
	mount := c.v2Mountpoint()
	dir, err := openBeneath(mount, path)
	if err != nil {
		return // not in v2: the hugetlb limits stay unset
	}
	defer dir.Close()
	ctrls, err := loadV2Controllers(mount, path)
	if err != nil || !slices.Contains(ctrls, "hugetlb") {
		return
	}
	r.held.Dirs["hugetlb"] = filepath.Join(mount, path)
	r.readHugetlb(dir, ".max")
}

// readV2 reads the cgroup from the cgroup v2 hierarchy.
func (r *reader) readV2(c readConfig, path string) error {
	mount := c.v2Mountpoint()
	dir, err := openBeneath(mount, path)
	if err != nil {
		return err
	}
	defer dir.Close()
	ctrls, err := loadV2Controllers(mount, path)
	if err != nil {
		return err
	}
	r.held.Dirs["unified"] = filepath.Join(mount, path)
	for _, ctrl := range []string{"cpu", "cpuset", "memory"} {
		if !slices.Contains(ctrls, ctrl) {
			r.held.Absent = append(r.held.Absent, v2Files[ctrl]...)
			continue
		}
		for _, f := range v2Files[ctrl] {
			r.read(dir, f)
		}
	}
	if slices.Contains(ctrls, "hugetlb") {
		r.readHugetlb(dir, ".max")
	}
	for _, k := range c.unified {
		if _, done := r.held.Files[k]; !done && !slices.Contains(r.held.Absent, k) {
			r.read(dir, k)
		}
	}
	return nil
}

// loadV2Controllers loads the cgroup with cgroups/v3 and returns its controllers.
func loadV2Controllers(mount, path string) ([]string, error) {
	m, err := cgroup2.Load(path, cgroup2.WithMountpoint(mount))
	if err != nil {
		return nil, fmt.Errorf("%w: cgroup %s: %w", errdefs.ErrInvalidArgument, path, err)
	}
	ctrls, err := m.Controllers()
	if err != nil {
		return nil, fileError(filepath.Join(mount, path), err)
	}
	return ctrls, nil
}

// readHugetlb reads the hugetlb limit files (hugetlb.<size><suffix>) of a directory.
func (r *reader) readHugetlb(dir *os.File, suffix string) {
	names, err := dir.Readdirnames(-1)
	if err != nil {
		r.setErr(fileError(dir.Name(), err))
		return
	}
	for _, name := range names {
		if _, ok := hugepageSize(name, suffix); ok {
			r.read(dir, name)
		}
	}
}

// read reads a file of dir, trimmed, into Held.Files; a file that does not exist is Absent.
func (r *reader) read(dir *os.File, name string) {
	b, err := readAt(dir, name, r.buf)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		r.held.Absent = append(r.held.Absent, name)
	case err != nil:
		r.setErr(fileError(filepath.Join(dir.Name(), name), err))
	default:
		r.buf = b
		r.held.Files[name] = string(bytes.TrimSpace(b))
	}
}

func (r *reader) setErr(err error) {
	if r.err == nil {
		r.err = err
	}
}

// v2Mountpoint is where c reads cgroup v2.
func (c readConfig) v2Mountpoint() string {
	if c.v2Mount != "" {
		return c.v2Mount
	}
	return v2Mountpoint(c.mode, c.root)
}

// openBeneath opens the directory of the cgroup at path (below a hierarchy's root) beneath the
// hierarchy's mount: with os.Root, nothing on the way, not even a symlink, leads outside it.
func openBeneath(mount, path string) (*os.File, error) {
	m, err := os.OpenRoot(mount)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w: no cgroup mount at %s", errdefs.ErrFailedPrecondition, mount)
	}
	if err != nil {
		return nil, fileError(mount, err)
	}
	defer m.Close()
	rel := strings.TrimPrefix(path, "/")
	if rel == "" {
		rel = "."
	}
	d, err := m.OpenFile(rel, os.O_RDONLY|syscall.O_DIRECTORY, 0)
	if err != nil {
		return nil, fileError(filepath.Join(mount, rel), err)
	}
	return d, nil
}

// readAt reads file name (one path element) of directory dir into buf, growing it. It costs
// three system calls, half of what os.ReadFile costs (no poller registration, no fstat, no
// read at EOF): this is the cost of every verification. A short read is the end of the file,
// as with cgroupfs' single-value files and with regular files.
func readAt(dir *os.File, name string, buf []byte) ([]byte, error) {
	var fd int
	err := ignoringEINTR(func() (err error) {
		fd, err = unix.Openat(int(dir.Fd()), name, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
		return err
	})
	if err != nil {
		return nil, &fs.PathError{Op: "openat", Path: filepath.Join(dir.Name(), name), Err: err}
	}
	defer unix.Close(fd) // read-only: nothing to lose
	out := buf[:0]
	for {
		if len(out) == cap(out) {
			out = slices.Grow(out, max(cap(out), 512))
		}
		var n int
		err := ignoringEINTR(func() (err error) {
			n, err = unix.Read(fd, out[len(out):cap(out)])
			return err
		})
		if err != nil {
			return nil, &fs.PathError{Op: "read", Path: filepath.Join(dir.Name(), name), Err: err}
		}
		short := n < cap(out)-len(out)
		out = out[:len(out)+n]
		if n == 0 || short {
			return out, nil
		}
	}
}

// ignoringEINTR retries f interrupted by a signal.
func ignoringEINTR(f func() error) error {
	for {
		if err := f(); !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}

// fileError classifies an error of a cgroup's file or directory.
func fileError(path string, err error) error {
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("%w: cgroup %s does not exist", errdefs.ErrNotFound, path)
	case errors.Is(err, fs.ErrPermission):
		return fmt.Errorf("%w: %w", errdefs.ErrPermissionDenied, err)
	}
	return fmt.Errorf("%w: %s: %w", errdefs.ErrUnknown, path, err)
}

// v1Hierarchies are the cgroup v1 subsystems Read looks at, by root: built once, as
// cgroup1.NewHugetlb reads the node's page sizes.
var v1Hierarchies sync.Map // root → []cgroup1.Subsystem

// v1Hierarchy is the cgroup v1 subsystems under root that hold the limits Read reads. A
// controller not mounted there is skipped by cgroup1.Load, which keeps the subsystems in
// which the cgroup exists.
func v1Hierarchy(root string) []cgroup1.Subsystem {
	if s, ok := v1Hierarchies.Load(root); ok {
		return s.([]cgroup1.Subsystem)
	}
	s := []cgroup1.Subsystem{cgroup1.NewCpu(root), cgroup1.NewCpuset(root), cgroup1.NewMemory(root)}
	if h, err := cgroup1.NewHugetlb(root); err == nil {
		s = append(s, h)
	}
	v, _ := v1Hierarchies.LoadOrStore(root, s)
	return v.([]cgroup1.Subsystem)
}
