//go:build linux

package cluster

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"

	"github.com/podgate/podgate/test/rig"
)

// DefaultNodeName is the node's name when Options.NodeName is empty. Each cluster has its own
// API server, so clusters running side by side do not collide on it.
const DefaultNodeName = "podgate-node"

// adminUser is the user of the admin token, in group system:masters.
const adminUser = "podgate-admin"

const (
	// etcdTimeout and apiServerTimeout bound each daemon's start-up: etcd answers in about a
	// second and kube-apiserver is ready in 5-10s on an idle machine; two cores shared with
	// other test packages under -race take several times as long.
	etcdTimeout      = 1 * time.Minute
	apiServerTimeout = 3 * time.Minute
	// kubeletTimeout bounds a kubelet start until its Node is Ready (10-20s when idle).
	kubeletTimeout = 3 * time.Minute
	// stopGrace is how long a daemon has to exit on SIGTERM before it is killed.
	stopGrace = 20 * time.Second
	// apiServerGrace is kube-apiserver's stopGrace: see Down.
	apiServerGrace = 3 * time.Second
	// drainTimeout bounds Down's wait for the kubelet to stop the pods left in the API.
	drainTimeout = 1 * time.Minute
	// downTimeout bounds a whole Down in Start's cleanup.
	downTimeout = 3 * time.Minute
	// portAttempts: a port picked free can be taken by another process before the daemon binds
	// it; the start is then tried again with new ports.
	portAttempts = 3
)

// ErrNotInstalled means the cluster's binaries are missing: run test/rig/install.sh.
var ErrNotInstalled = errors.New("cluster not installed: run test/rig/install.sh (make rig)")

// binaries are the programs test/cluster/build.sh puts in BinDir; controlPlane those a cluster
// without a kubelet (Options.DeferKubelet) needs.
var (
	binaries     = []string{"etcd", "kube-apiserver", "kubelet"}
	controlPlane = binaries[:2]
)

// BinDir is where build.sh puts etcd, kube-apiserver and kubelet: the cluster/bin directory of
// the rig's install directory ($PODGATE_RIG_DIR, by default /var/lib/podgate-rig).
func BinDir() string { return filepath.Join(rig.InstallDir(), "cluster", "bin") }

// KubeletVersionEnv names the kubelet release a cell of the tested matrix runs (make matrix,
// make test's skew lane): one test/rig/install.sh built into cluster/kubelet/VERSION. Unset, the
// kubelet is the default one in BinDir, of the control plane's release.
const KubeletVersionEnv = "PODGATE_KUBELET_VERSION"

// binPath is where the cluster's binary name is: the kubelet of KubeletVersionEnv's release, or
// BinDir's.
func binPath(name string) string {
	if v := os.Getenv(KubeletVersionEnv); name == "kubelet" && v != "" {
		return filepath.Join(rig.InstallDir(), "cluster", "kubelet", v, name)
	}
	return filepath.Join(BinDir(), name)
}

// CheckInstalled reports, wrapping ErrNotInstalled, the first missing binary.
func CheckInstalled() error { return checkInstalled(binaries) }

// CheckControlPlaneInstalled reports, wrapping ErrNotInstalled, the first missing binary of the
// control plane (etcd and kube-apiserver): what Up needs with Options.DeferKubelet, as long as
// StartKubelet is not called.
func CheckControlPlaneInstalled() error { return checkInstalled(controlPlane) }

func checkInstalled(binaries []string) error {
	for _, b := range binaries {
		p := binPath(b)
		if err := unix.Access(p, unix.X_OK); err != nil {
			return fmt.Errorf("%w (%s: %w)", ErrNotInstalled, p, err)
		}
	}
	return nil
}

// Options configure a cluster.
type Options struct {
	// CRIEndpoint is the kubelet's containerRuntimeEndpoint (unix://path): podgate's socket, or
	// containerd's for a kubelet without podgate. Required unless DeferKubelet is set, and then
	// required by StartKubelet.
	CRIEndpoint string
	// ImageEndpoint is the kubelet's imageServiceEndpoint; empty means CRIEndpoint.
	ImageEndpoint string
	// Dir holds everything of the cluster: etcd's data, certificates and keys, the kubeconfig,
	// every daemon's log (etcd.log, kube-apiserver.log, kubelet.log) and the kubelet's root
	// directory (kubelet/). Keep it short: DRA drivers put unix sockets under it. Empty means a
	// new directory /tmp/pgc-*, removed by Down; a given Dir is left in place with the logs.
	Dir string
	// NodeName is the kubelet's node name (--hostname-override); empty means DefaultNodeName.
	NodeName string
	// DeferKubelet starts only etcd and kube-apiserver: the test starts the kubelet with
	// StartKubelet, e.g. once podgate runs with the cluster's Kubeconfig.
	DeferKubelet bool
	// FeatureGates are set on kube-apiserver and on the kubelet.
	FeatureGates map[string]bool
	// KubeletConfig holds KubeletConfiguration fields (by their JSON names) that replace the
	// defaults of kubeletConfig, e.g. {"maxPods": 10}.
	KubeletConfig map[string]any
	// APIServerArgs are more kube-apiserver arguments; a flag given twice takes the last value.
	APIServerArgs []string
	// AuditLog has kube-apiserver write an audit log at AuditLogPath: one JSON line per request
	// at the Metadata level (user, user agent, verb, resource, status; no bodies), for tests that
	// count each client's requests (ReadAudit).
	AuditLog bool
}

// Cluster is a running single-node Kubernetes: etcd, kube-apiserver and a kubelet.
type Cluster struct {
	opts       Options
	dir        string
	ownsDir    bool
	nodeName   string
	pki        *pki
	restConfig *rest.Config
	client     kubernetes.Interface
	kubeconfig string
	// cgroupRoot is the kubelet's cgroupRoot: the cgroups of this cluster's pods are under it.
	cgroupRoot string

	etcd, apiServer *process
	etcdURL         string
	// thaw lets a frozen kube-apiserver go on (FreezeAPIServer); nil when never frozen.
	thaw func() error

	mu      sync.Mutex // guards kubelet
	kubelet *process
}

// Start starts a cluster for the test and stops it when the test ends, failed or not; on failure
// the test log gets the tail of every daemon's log. It skips the test unless it runs as root with
// the cluster's binaries installed.
func Start(t testing.TB, o Options) *Cluster {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: the kubelet creates cgroups and its pods run in containerd")
	}
	if err := CheckInstalled(); err != nil {
		t.Skip(err.Error())
	}
	logger, ctx := ktesting.NewTestContext(t)
	c, err := Up(ctx, o)
	if err != nil {
		t.Fatalf("cluster: %v", err)
	}
	t.Cleanup(func() {
		// The test's context is already cancelled when cleanups run: Down gets its own time.
		ctx, cancel := context.WithTimeout(klog.NewContext(context.Background(), logger), downTimeout)
		defer cancel()
		err := c.stop(ctx)
		if err != nil {
			t.Errorf("cluster: %v", err)
		}
		// After stop, so that the logs tell how the daemons ended; before the directory goes.
		if t.Failed() {
			c.logTails(t)
		}
		if err := c.removeDir(); err != nil {
			t.Errorf("cluster: %v", err)
		}
	})
	return c
}

// Up starts etcd, kube-apiserver and, unless o.DeferKubelet, the kubelet, and waits until the
// Node is Ready. When it fails part-way, it stops what it started. With o.DeferKubelet it needs
// only the control plane's binaries (CheckControlPlaneInstalled).
func Up(ctx context.Context, o Options) (_ *Cluster, err error) {
	check := CheckInstalled
	if o.DeferKubelet {
		check = CheckControlPlaneInstalled
	}
	if err := check(); err != nil {
		return nil, err
	}
	if o.CRIEndpoint == "" && !o.DeferKubelet {
		return nil, errors.New("start cluster: Options.CRIEndpoint is empty")
	}
	c := &Cluster{opts: o, dir: o.Dir, nodeName: o.NodeName}
	if c.nodeName == "" {
		c.nodeName = DefaultNodeName
	}
	if c.dir == "" {
		if c.dir, err = os.MkdirTemp("/tmp", "pgc-"); err != nil {
			return nil, fmt.Errorf("start cluster: %w", err)
		}
		c.ownsDir = true
	} else if err := os.MkdirAll(c.dir, 0o755); err != nil {
		return nil, fmt.Errorf("start cluster: %w", err)
	}
	defer func() {
		if err != nil {
			// Even when ctx expired: half a cluster must not outlive a timeout.
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), downTimeout)
			defer cancel()
			if derr := c.Down(dctx); derr != nil {
				klog.FromContext(ctx).Error(derr, "Cleaning up after failed start", "dir", c.dir)
			}
		}
	}()
	start := time.Now()
	if c.pki, err = writePKI(c.dir); err != nil {
		return nil, fmt.Errorf("start cluster: %w", err)
	}
	if err := c.startEtcd(ctx); err != nil {
		return nil, err
	}
	if err := c.startAPIServer(ctx); err != nil {
		return nil, err
	}
	if err := c.bootstrap(ctx); err != nil {
		return nil, err
	}
	if !o.DeferKubelet {
		if err := c.StartKubelet(ctx); err != nil {
			return nil, err
		}
	}
	klog.FromContext(ctx).Info("Cluster up", "dir", c.dir, "server", c.restConfig.Host, "node", c.nodeName,
		"kubelet", !o.DeferKubelet, "duration", time.Since(start).Round(time.Millisecond))
	return c, nil
}

// Down stops the cluster: it deletes the pods left in the API and waits for the kubelet to kill
// them, stops the kubelet, kube-apiserver and etcd, kills whatever still runs in the cluster's
// cgroups and removes them, removes the kubelet's links to the pods' logs in /var/log/containers,
// unmounts what the kubelet left mounted in Dir, and removes Dir when Up made it. containerd's
// sandboxes of the pods are the rig's to remove (rig.Down does). A second call does nothing more.
func (c *Cluster) Down(ctx context.Context) error {
	return errors.Join(c.stop(ctx), c.removeDir())
}

// stop is Down but for the removal of the directory, which keeps the logs.
func (c *Cluster) stop(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	var errs []error
	if c.thaw != nil {
		if err := c.thaw(); err != nil {
			errs = append(errs, err)
		}
	}
	if err := c.drainPods(ctx); err != nil {
		// Not fatal: what the kubelet did not stop is killed below.
		logger.Info("Pods not stopped by the kubelet; killing them", "err", err)
	}
	if err := c.StopKubelet(ctx); err != nil {
		errs = append(errs, err)
	}
	// kube-apiserver's graceful termination waits for its clients' watches to end (podgate's
	// and the DRA drivers' informers, when they stop after the cluster), up to a minute; the
	// data dies with etcd anyway, so it gets a short grace and no complaint when killed.
	if c.apiServer != nil {
		if err := c.apiServer.stop(apiServerGrace); err != nil && !errors.Is(err, errKilled) {
			errs = append(errs, err)
		}
	}
	if c.etcd != nil {
		if err := c.etcd.stop(stopGrace); err != nil {
			errs = append(errs, err)
		}
	}
	if root := c.CgroupRoot(); root != "" {
		if err := removeCgroupRoot(ctx, root); err != nil {
			errs = append(errs, err)
		}
	}
	if err := removeLogLinks(c.PodLogsDir()); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("stop cluster: %w", err)
	}
	logger.Info("Cluster down", "dir", c.dir)
	return nil
}

// removeDir unmounts what is mounted below the directory and removes it, when Up made it.
func (c *Cluster) removeDir() error {
	if err := unmountUnder(c.dir); err != nil {
		// Removing the directory would delete what the mounts show.
		return fmt.Errorf("stop cluster: %w", err)
	}
	if c.ownsDir {
		if err := os.RemoveAll(c.dir); err != nil {
			return fmt.Errorf("stop cluster: %w", err)
		}
	}
	return nil
}

// containerLogLinks is where the kubelet links every container's log, whatever its podLogsDir.
const containerLogLinks = "/var/log/containers"

// removeLogLinks removes the links in /var/log/containers to logs in podLogsDir. The kubelet
// removes a link with its container; containers it did not remove (the rig did) leave theirs.
func removeLogLinks(podLogsDir string) error {
	entries, err := os.ReadDir(containerLogLinks)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		p := filepath.Join(containerLogLinks, e.Name())
		if target, err := os.Readlink(p); err == nil && strings.HasPrefix(target, podLogsDir+"/") {
			if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// Client is a client with the admin token (group system:masters).
func (c *Cluster) Client() kubernetes.Interface { return c.client }

// RESTConfig is the admin client's configuration, for clients of other kinds (dynamic, ...).
func (c *Cluster) RESTConfig() *rest.Config { return rest.CopyConfig(c.restConfig) }

// Kubeconfig is the path of a kubeconfig file with the admin token, for podgate's --kubeconfig
// and DRA drivers.
func (c *Cluster) Kubeconfig() string { return c.kubeconfig }

// NodeName is the kubelet's node name.
func (c *Cluster) NodeName() string { return c.nodeName }

// Dir is the directory that holds everything of the cluster.
func (c *Cluster) Dir() string { return c.dir }

// PodLogsDir is the kubelet's podLogsDir, where containerd writes the containers' logs.
func (c *Cluster) PodLogsDir() string { return filepath.Join(c.dir, "pod-logs") }

// KubeletRootDir is the kubelet's --root-dir, private to this cluster.
func (c *Cluster) KubeletRootDir() string { return filepath.Join(c.dir, "kubelet") }

// PluginRegistryDir is the kubelet's plugin registration directory, where DRA drivers put their
// registration sockets (<root-dir>/plugins_registry).
func (c *Cluster) PluginRegistryDir() string {
	return filepath.Join(c.KubeletRootDir(), "plugins_registry")
}

// PluginsDir is where DRA drivers put their service sockets (<root-dir>/plugins).
func (c *Cluster) PluginsDir() string { return filepath.Join(c.KubeletRootDir(), "plugins") }

// PodResourcesSocket is the kubelet's PodResources socket (<root-dir>/pod-resources/kubelet.sock),
// for podgate's podResources.kubeletSocket.
func (c *Cluster) PodResourcesSocket() string {
	return filepath.Join(c.KubeletRootDir(), "pod-resources", "kubelet.sock")
}

// CgroupRoot is the kubelet's cgroupRoot (cgroupfs notation, such as /podgate-cluster/0a1b2c3d):
// the pods' cgroups are below <root>/kubepods in every hierarchy. Empty until the kubelet first
// started.
func (c *Cluster) CgroupRoot() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cgroupRoot
}

// LogFiles are the daemons' logs, by daemon name.
func (c *Cluster) LogFiles() map[string]string {
	m := map[string]string{}
	for _, b := range binaries {
		m[b] = filepath.Join(c.dir, b+".log")
	}
	return m
}

// logTails writes the end of each daemon's log to the test log.
func (c *Cluster) logTails(t testing.TB) {
	t.Helper()
	for _, b := range binaries {
		p := filepath.Join(c.dir, b+".log")
		if _, err := os.Stat(p); err == nil {
			t.Logf("last lines of %s:\n%s", p, logTail(p, 40))
		}
	}
}

// unmountUnder unmounts every mount point below dir, deepest first, as down.sh does for the rig:
// volumes the kubelet mounted under its root directory and did not unmount because it was
// stopped. Removing dir through a mount would delete what the mount shows.
func unmountUnder(dir string) error {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	var mounts []string
	for line := range strings.SplitSeq(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && strings.HasPrefix(unescapeMountinfo(f[4]), dir+"/") {
			mounts = append(mounts, unescapeMountinfo(f[4]))
		}
	}
	var errs []error
	// mountinfo lists a mount after the one it sits on: the reverse order unmounts children first.
	for i := len(mounts) - 1; i >= 0; i-- {
		if err := unix.Unmount(mounts[i], 0); err != nil && !errors.Is(err, unix.EINVAL) {
			if err := unix.Unmount(mounts[i], unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
				errs = append(errs, fmt.Errorf("unmount %s: %w", mounts[i], err))
			}
		}
	}
	return errors.Join(errs...)
}

// unescapeMountinfo undoes mountinfo's octal escapes of space, tab, newline and backslash.
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) && isOctal(s[i+1]) && isOctal(s[i+2]) && isOctal(s[i+3]) {
			b.WriteByte((s[i+1]-'0')<<6 | (s[i+2]-'0')<<3 | (s[i+3] - '0'))
			i += 3
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func isOctal(c byte) bool { return c >= '0' && c <= '7' }
