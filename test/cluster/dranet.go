//go:build linux

package cluster

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// DRANetDriver is the name dranet registers under and publishes its devices with (cmd/dranet's
// driverName); its devices are the host's network interfaces, named after them.
const DRANetDriver = "dra.net"

// DRANetInterfaceNameAttribute is the attribute of a dranet device that names its host interface.
const DRANetInterfaceNameAttribute = "dra.net/ifName"

// dranetStartTimeout bounds StartDRANet: dranet waits up to 30 s for the kubelet to accept its
// registration, then connects to NRI.
const dranetStartTimeout = time.Minute

// DRANetOptions are how StartDRANet runs dranet.
type DRANetOptions struct {
	// Bin is dranet's binary (rig.NeighbourBin(rig.DRANet)).
	Bin string
	// NRISocket is where containerd serves NRI (rig.Options.NRISocket). dranet connects only to
	// /var/run/nri/nri.sock, which it sees as a link to this socket in its own mount namespace.
	NRISocket string
	// Dir holds dranet's database, its log (dranet.log) and its temporary files.
	Dir string
	// Filter is dranet's --filter, a CEL expression over a device's attributes that keeps the
	// devices dranet publishes; empty: dranet's default (every interface but veths). A test
	// keeps it to its own interfaces: the host's are not the test's to hand out.
	Filter string
}

// DRANet is dranet (sigs.k8s.io/dranet) running as this cluster's node's DRA network driver.
type DRANet struct {
	p       *process
	healthz string
}

// dranetMountNS is the shell that runs dranet in the mount namespace unshare made for it, with
// propagation from the host (slave): a tmpfs over /run holds /run/nri/nri.sock, a symbolic link
// to the test's NRI socket ($1), so that dranet never reaches the host's /var/run/nri (/var/run
// is /run). The tmpfs is invisible to the host and ends with the namespace, that is with
// dranet. $2 is dranet's TMPDIR: it unpacks its PCI database into a temporary directory.
const dranetMountNS = `set -e
mount -t tmpfs -o mode=0755,size=1m podgate-dranet /run
mkdir /run/nri
ln -s "$1" /run/nri/nri.sock
export TMPDIR="$2"
shift 2
exec "$@"`

// StartDRANet starts dranet for the cluster's node: it registers in the kubelet's plugin
// registry (--kubelet-root-dir: <root>/plugins_registry, its socket in <root>/plugins/dra.net),
// publishes the node's interfaces that o.Filter keeps and connects to containerd's NRI. It
// never probes a cloud metadata address (--cloud-provider-hint=NONE, --profile-provider=none).
// It returns once dranet is registered (its healthz answers) and NRI has synchronized with it;
// the caller stops it (Stop or Kill).
//
// dranet opens the pods' network namespaces by the paths NRI gives it, which containerd mounts
// after dranet started: those mounts must propagate into dranet's mount namespace (a shared
// mount on the host side), as dranet's DaemonSet mounts /var/run/netns with HostToContainer.
func (c *Cluster) StartDRANet(ctx context.Context, o DRANetOptions) (*DRANet, error) {
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		return nil, fmt.Errorf("start dranet: %w", err)
	}
	ports, err := freePorts(1)
	if err != nil {
		return nil, fmt.Errorf("start dranet: %w", err)
	}
	bind := fmt.Sprintf("127.0.0.1:%d", ports[0])
	tmp := filepath.Join(o.Dir, "tmp")
	if err := os.MkdirAll(tmp, 0o700); err != nil {
		return nil, fmt.Errorf("start dranet: %w", err)
	}
	args := []string{
		"--mount", "--propagation", "slave", "--", "/bin/sh", "-c", dranetMountNS, "dranet-ns", o.NRISocket, tmp,
		o.Bin,
		"--kubeconfig", c.kubeconfig,
		"--hostname-override", c.nodeName,
		"--kubelet-root-dir", c.KubeletRootDir(),
		"--cloud-provider-hint=NONE", "--profile-provider=none",
		"--bind-address", bind,
		"--db-path", filepath.Join(o.Dir, "dranet.db"),
		"-v=4", // 4: its status updates of claims too
	}
	if o.Filter != "" {
		args = append(args, "--filter", o.Filter)
	}
	p, err := startProcess("dranet", filepath.Join(o.Dir, "dranet.log"), unshare, args...)
	if err != nil {
		return nil, err
	}
	d := &DRANet{p: p, healthz: "http://" + bind + "/healthz"}
	if err := d.waitReady(ctx); err != nil {
		return nil, fmt.Errorf("start dranet: %w", stopAfter(err, d))
	}
	return d, nil
}

// stopAfter stops d after its failed start, and says so beside err when that fails too.
func stopAfter(err error, d *DRANet) error {
	if serr := d.p.stop(30 * time.Second); serr != nil {
		return errors.Join(err, fmt.Errorf("and stopping it: %w", serr))
	}
	return err
}

// waitReady waits until dranet is registered with the kubelet (healthz says OK once its
// Start returned, which waits for the registration) and NRI synchronized with it (its log
// says so): from then on it moves the interfaces of the sandboxes containerd starts.
func (d *DRANet) waitReady(ctx context.Context) error {
	client := &http.Client{Timeout: 2 * time.Second}
	var last string
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, dranetStartTimeout, true, func(ctx context.Context) (bool, error) {
		if done, err := d.p.exited(); done {
			return false, d.p.exitError(err)
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, d.healthz, nil)
		if err != nil {
			return false, err
		}
		resp, err := client.Do(req)
		if err != nil {
			last = err.Error()
			return false, nil
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			last = "healthz: " + resp.Status
			return false, nil
		}
		if !strings.Contains(lastRun(d.Log()), "Synchronized state with the runtime") {
			last = "registered, NRI not synchronized yet"
			return false, nil
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("dranet not ready (%s): %w\nlast lines of %s:\n%s", last, err, d.p.logPath, logTail(d.p.logPath, 30))
	}
	return nil
}

// lastRun is the part of a log that the last start of its process wrote: startProcess appends
// each start's to the same file, after a line "==== <time>: <command>".
func lastRun(log string) string {
	if i := strings.LastIndex(log, "==== "); i >= 0 {
		return log[i:]
	}
	return log
}

// Log returns dranet's log so far, of every start in its directory.
func (d *DRANet) Log() string {
	b, err := os.ReadFile(d.p.logPath)
	if err != nil {
		return err.Error()
	}
	return string(b)
}

// LogPath is the file dranet logs to.
func (d *DRANet) LogPath() string { return d.p.logPath }

// Stop stops dranet with SIGTERM (it unregisters, waits for the pods it prepared to pass its
// NRI hooks, then leaves NRI), and SIGKILL after grace. A dranet that is gone already is no
// error.
func (d *DRANet) Stop(grace time.Duration) error {
	if done, _ := d.p.exited(); done {
		return nil
	}
	return d.p.stop(grace)
}

// Kill kills dranet (SIGKILL), as a crash or the OOM killer would: its sockets stay behind in
// the kubelet's directories, and containerd's NRI has no plugin any more. It returns once dranet
// has exited.
func (d *DRANet) Kill() error {
	if done, _ := d.p.exited(); done {
		return nil
	}
	if err := syscall.Kill(-d.p.cmd.Process.Pid, syscall.SIGKILL); err != nil {
		return fmt.Errorf("kill dranet: %w", err)
	}
	select {
	case <-d.p.done:
		return nil
	case <-time.After(30 * time.Second):
		return fmt.Errorf("dranet (pid %d) does not die", d.p.cmd.Process.Pid)
	}
}
