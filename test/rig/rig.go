package rig

import (
	"bufio"
	"bytes"
	"context"
	_ "embed"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	internalapi "k8s.io/cri-api/pkg/apis"
	remote "k8s.io/cri-client/pkg"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
)

// Images imported into every rig, in containerd's k8s.io namespace.
const (
	// PauseImage is the sandbox image containerd is configured with (pinned, never pulled).
	PauseImage = "registry.k8s.io/pause:3.10"
	// BusyboxImage is a busybox image for test containers: /bin/sh and the busybox applets.
	BusyboxImage = "docker.io/library/busybox:1.35"
)

// ErrNotInstalled means the rig's binaries or images are missing: run test/rig/install.sh.
var ErrNotInstalled = errors.New("rig not installed: run test/rig/install.sh (make rig)")

var (
	//go:embed up.sh
	upScript string
	//go:embed down.sh
	downScript string
)

const (
	// callTimeout bounds every CRI call of a Client (cri-client uses its connection timeout
	// for each call). Generous: runc and CNI on two cores under -race, with other test
	// packages' rigs busy at the same time, can take seconds for one RunPodSandbox.
	callTimeout = 30 * time.Second
	// downTimeout bounds a whole Down: CRI removal of every pod plus down.sh.
	downTimeout = 2 * time.Minute
	// upRefused is up.sh's exit status when it refused to start and changed nothing.
	upRefused = 3
	// bridgeConfig is the file up.sh writes the rig's bridge network to, in Dir/cni/net.d;
	// Options.CNIConfig's network goes to one that sorts before it (containerd takes the first).
	bridgeConfig = "10-pgrig.conflist"
)

// Rig is one running containerd with its own CNI network.
type Rig struct {
	// Dir holds everything of this instance: config, root, state, sockets, logs, CNI
	// configuration and IPAM store. Down removes it.
	Dir string
	// Endpoint is containerd's CRI endpoint, unix://Dir/containerd.sock.
	Endpoint string
	// Bridge is the name of the instance's CNI bridge (pgrigN).
	Bridge string
	// Subnet is the pod subnet of the bridge (10.77.N.0/24); the bridge holds its .1 address.
	Subnet netip.Prefix

	opts Options // for a restart of containerd
}

// InstallDir is where install.sh puts the binaries and images: $PODGATE_RIG_DIR, by default
// /var/lib/podgate-rig.
func InstallDir() string {
	if d := os.Getenv("PODGATE_RIG_DIR"); d != "" {
		return d
	}
	return "/var/lib/podgate-rig"
}

// ContainerdVersionEnv names the containerd release a cell of the tested matrix runs (make
// matrix, make test's skew lane): one install.sh built into containerd/VERSION of InstallDir.
// Unset, the rig runs the default containerd, in bin.
const ContainerdVersionEnv = "PODGATE_CONTAINERD_VERSION"

// containerdDir is where the rig's containerd, shim and ctr are, relative to InstallDir.
func containerdDir() string {
	if v := os.Getenv(ContainerdVersionEnv); v != "" {
		return filepath.Join("containerd", v)
	}
	return "bin"
}

// CheckInstalled reports, wrapping ErrNotInstalled, the first missing part of the rig.
func CheckInstalled() error {
	cd := containerdDir()
	for _, f := range []string{
		filepath.Join(cd, "containerd"), filepath.Join(cd, "containerd-shim-runc-v2"), filepath.Join(cd, "ctr"), "bin/runc",
		"images/pause.tar", "images/busybox.tar",
	} {
		if _, err := os.Stat(filepath.Join(InstallDir(), f)); err != nil {
			return fmt.Errorf("%w (%s missing)", ErrNotInstalled, filepath.Join(InstallDir(), f))
		}
	}
	return nil
}

// Options vary a rig.
type Options struct {
	// CNIChain are CNI plugin configurations (JSON objects) chained after the bridge plugin
	// in the rig's network, e.g. a plugin that records what CNI ADD saw.
	CNIChain []string
	// CNIBinDir holds the binaries of CNIChain's plugins, beside /usr/lib/cni.
	CNIBinDir string
	// OTLPEndpoint, host:port of an OTLP/gRPC collector, turns containerd's tracing on: its
	// spans (service containerd, the shims' containerd-shim-<id>) go there, children of the
	// trace context its callers send. Empty: containerd traces nothing.
	OTLPEndpoint string
	// MetricsAddress, host:port on loopback, turns containerd's Prometheus metrics on there,
	// with its gRPC latency histograms. Empty: containerd serves none.
	MetricsAddress string
	// CNIConfig, given the path of the rig's own bridge network configuration (a .conflist in
	// Dir/cni/net.d, network name "pgrig"), returns the CNI network configuration (a conflist,
	// JSON) containerd uses instead: a meta plugin such as multus, whose cluster network is the
	// rig's bridge. Give multus that directory as its confDir and the network by its name: a
	// delegate given by file path is cached by multus v4.3.0 with only the fields it knows, and
	// its DEL then fails ("no IP ranges specified"). Nil: the bridge network (with CNIChain).
	CNIConfig func(bridgeConfig string) string
	// NRISocket turns containerd's NRI on, serving plugins at this path (a unix socket of the
	// test's, never the host-wide /var/run/nri/nri.sock, which every rig would contend for).
	// Empty: NRI off.
	NRISocket string
}

// Start starts a rig for the test and stops it, with every pod in it, when the test ends. It
// skips the test unless it runs as root on a machine with the rig installed.
func Start(t testing.TB) *Rig {
	t.Helper()
	return StartWith(t, Options{})
}

// StartWith is Start with options.
func StartWith(t testing.TB, o Options) *Rig {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: the rig runs containerd, which mounts, creates namespaces and cgroups")
	}
	if err := CheckInstalled(); err != nil {
		t.Skip(err.Error())
	}
	logger, ctx := ktesting.NewTestContext(t)
	r, err := UpWith(ctx, "", o)
	if err != nil {
		t.Fatalf("rig: %v", err)
	}
	t.Cleanup(func() {
		// The test's context is already cancelled when cleanups run: Down gets its own time.
		ctx, cancel := context.WithTimeout(klog.NewContext(context.Background(), logger), downTimeout)
		defer cancel()
		if t.Failed() {
			t.Logf("last lines of %s:\n%s", r.LogFile(), r.LogTail(40))
		}
		if err := r.Down(ctx); err != nil {
			t.Errorf("rig: %v", err)
		}
	})
	return r
}

// Up starts a rig in dir, which must be missing, empty, or a stopped rig's directory, and short
// (unix socket paths stay below 108 bytes). An empty dir means a new directory /tmp/pgr-*. When
// the start fails part-way, Up stops what it started and removes dir; when up.sh refuses (a rig
// already runs in dir, dir is too long, ...), Up leaves dir alone.
func Up(ctx context.Context, dir string) (*Rig, error) {
	return UpWith(ctx, dir, Options{})
}

// UpWith is Up with options.
func UpWith(ctx context.Context, dir string, o Options) (*Rig, error) {
	logger := klog.FromContext(ctx)
	if err := CheckInstalled(); err != nil {
		return nil, err
	}
	madeDir := false
	if dir == "" {
		d, err := os.MkdirTemp("/tmp", "pgr-")
		if err != nil {
			return nil, fmt.Errorf("start containerd: %w", err)
		}
		dir, madeDir = d, true
	}
	r, err := up(ctx, dir, o)
	if exitErr, ok := errors.AsType[*exec.ExitError](err); ok && exitErr.ExitCode() == upRefused {
		if madeDir {
			if rerr := os.Remove(dir); rerr != nil {
				logger.Error(rerr, "Removing rig directory after refused start", "dir", dir)
			}
		}
		return nil, fmt.Errorf("start containerd: %w", err)
	}
	if err != nil {
		// Kill whatever got started; containerd's log is already in err. Even when ctx
		// expired: a half-started rig must not outlive a timeout.
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), downTimeout)
		defer cancel()
		if derr := runScript(dctx, "down.sh", downScript, dir, nil); derr != nil {
			logger.Error(derr, "Cleaning up after failed start", "dir", dir)
		}
		return nil, fmt.Errorf("start containerd: %w", err)
	}
	logger.Info("Rig up", "dir", r.Dir, "endpoint", r.Endpoint, "bridge", r.Bridge, "subnet", r.Subnet)
	return r, nil
}

func up(ctx context.Context, dir string, o Options) (*Rig, error) {
	var out bytes.Buffer
	chain := []string{"PODGATE_RIG_CNI_CHAIN=" + strings.Join(o.CNIChain, ","), "PODGATE_RIG_CNI_BIN_DIR=" + o.CNIBinDir,
		"PODGATE_RIG_OTLP_ENDPOINT=" + o.OTLPEndpoint, "PODGATE_RIG_METRICS_ADDRESS=" + o.MetricsAddress,
		"PODGATE_RIG_NRI_SOCKET=" + o.NRISocket}
	if o.CNIConfig != nil {
		abs, err := filepath.Abs(dir)
		if err != nil {
			return nil, err
		}
		chain = append(chain, "PODGATE_RIG_CNI_CONFIG="+o.CNIConfig(filepath.Join(abs, "cni", "net.d", bridgeConfig)))
	}
	if err := runScript(ctx, "up.sh", upScript, dir, &out, chain...); err != nil {
		return nil, err
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	endpoint := lines[len(lines)-1]
	env, err := readEnv(filepath.Join(dir, "rig.env"))
	if err != nil {
		return nil, err
	}
	if env["ENDPOINT"] != endpoint {
		return nil, fmt.Errorf("up.sh printed endpoint %q, rig.env says %q", endpoint, env["ENDPOINT"])
	}
	subnet, err := netip.ParsePrefix(env["SUBNET"])
	if err != nil {
		return nil, fmt.Errorf("rig.env: %w", err)
	}
	return &Rig{
		opts:     o,
		Dir:      strings.TrimPrefix(strings.TrimSuffix(endpoint, "/containerd.sock"), "unix://"),
		Endpoint: endpoint,
		Bridge:   env["BRIDGE"],
		Subnet:   subnet,
	}, nil
}

// Down removes every pod sandbox through CRI, so that CNI releases the pods' network as it does
// on a real node, then stops containerd, its shims and containers, unmounts what is left under
// Dir, deletes the bridge and removes Dir. It cleans up even when containerd no longer answers,
// and a second call does nothing.
func (r *Rig) Down(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	podErr := r.removePods(ctx)
	if err := runScript(ctx, "down.sh", downScript, r.Dir, nil); err != nil {
		return errors.Join(podErr, fmt.Errorf("stop containerd: %w", err))
	}
	logger.Info("Rig down", "dir", r.Dir)
	return podErr
}

// removePods stops and removes every pod sandbox. A containerd that does not answer (stopped,
// or killed by a test) has nothing to remove gracefully: down.sh does the rest.
func (r *Rig) removePods(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	if _, err := os.Stat(filepath.Join(r.Dir, "containerd.sock")); err != nil {
		return nil
	}
	rs, err := remote.NewRemoteRuntimeServiceBuilder().
		WithEndpoint(r.Endpoint).
		// callTimeout, as the tests' own calls: a StopPodSandbox took over 5 s under make
		// test's load and failed TestInspectCommands at its teardown.
		WithConnectionTimeout(callTimeout).
		WithTracerProvider(nil).
		Build(ctx)
	if err != nil {
		logger.Info("containerd does not answer; skipping CRI removal of pods", "endpoint", r.Endpoint, "err", err)
		return nil
	}
	defer func() {
		if err := rs.Close(ctx); err != nil {
			logger.V(2).Info("Closing CRI client", "err", err)
		}
	}()
	pods, err := rs.ListPodSandbox(ctx, nil)
	if err != nil {
		return fmt.Errorf("list pods: %w", err)
	}
	var errs []error
	for _, p := range pods {
		// Stop before remove, as the kubelet does: Remove of a ready sandbox is refused.
		if err := rs.StopPodSandbox(ctx, p.Id); err != nil {
			errs = append(errs, fmt.Errorf("stop pod %s: %w", p.Id, err))
			continue
		}
		if err := rs.RemovePodSandbox(ctx, p.Id); err != nil {
			errs = append(errs, fmt.Errorf("remove pod %s: %w", p.Id, err))
			continue
		}
		logger.V(2).Info("Removed pod", "pod", klog.KRef(p.GetMetadata().GetNamespace(), p.GetMetadata().GetName()), "id", p.Id)
	}
	return errors.Join(errs...)
}

// LogFile is containerd's log.
func (r *Rig) LogFile() string { return filepath.Join(r.Dir, "containerd.log") }

// LogTail returns the last n lines of containerd's log, for test failure messages.
func (r *Rig) LogTail(n int) string {
	b, err := os.ReadFile(r.LogFile())
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// Client holds cri-client connections to one CRI endpoint: containerd's or podgate's.
type Client struct {
	Runtime internalapi.RuntimeService
	Images  internalapi.ImageManagerService
}

// Dial connects a Client to endpoint (unix://path). Each call of the Client is bounded by 30s.
func Dial(ctx context.Context, endpoint string) (*Client, error) {
	rs, err := remote.NewRemoteRuntimeServiceBuilder().
		WithEndpoint(endpoint).
		WithConnectionTimeout(callTimeout).
		WithTracerProvider(nil). // no tracing in tests
		Build(ctx)
	if err != nil {
		return nil, fmt.Errorf("connect runtime service: %w", err)
	}
	is, err := remote.NewRemoteImageServiceBuilder().
		WithEndpoint(endpoint).
		WithConnectionTimeout(callTimeout).
		WithTracerProvider(nil).
		Build(ctx)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("connect image service: %w", err), rs.Close(ctx))
	}
	return &Client{Runtime: rs, Images: is}, nil
}

// Close closes both connections.
func (c *Client) Close(ctx context.Context) error {
	return errors.Join(c.Runtime.Close(ctx), c.Images.Close(ctx))
}

// Connect is Dial for tests: it fails the test when endpoint does not answer and closes the
// Client when the test ends.
func Connect(t testing.TB, endpoint string) *Client {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	c, err := Dial(ctx, endpoint)
	if err != nil {
		t.Fatalf("rig: %v", err)
	}
	t.Cleanup(func() {
		if err := c.Close(ctx); err != nil {
			t.Errorf("rig: close CRI client: %v", err)
		}
	})
	return c
}

// runScript runs an embedded script as `bash -c script name dir`. The script's stderr is logged,
// and returned in the error when it fails; stdout goes to out when it is not nil.
func runScript(ctx context.Context, name, script, dir string, out *bytes.Buffer, env ...string) error {
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, "bash", "-c", script, name, dir)
	if len(env) > 0 {
		cmd.Env = append(os.Environ(), env...)
	}
	cmd.Stderr = &stderr
	if out != nil { // a nil *bytes.Buffer in the io.Writer would not be a nil io.Writer
		cmd.Stdout = out
	}
	// A background process holding the pipes must not block us forever; up.sh redirects
	// containerd's output, so this is only a safety net.
	cmd.WaitDelay = 10 * time.Second
	err := cmd.Run()
	klog.FromContext(ctx).V(2).Info("Ran rig script", "script", name, "dir", dir, "stderr", stderr.String())
	if err != nil {
		return fmt.Errorf("%s %s: %w\n%s", name, dir, err, strings.TrimSpace(stderr.String()))
	}
	return nil
}

// readEnv reads up.sh's KEY=VALUE file.
func readEnv(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	env := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), "="); ok {
			env[k] = v
		}
	}
	return env, sc.Err()
}

// StopContainerd stops only the containerd daemon (SIGTERM, as systemd does on a restart),
// leaving its shims, pods and directory in place, and waits until it has exited. Tests use it
// to take the runtime away from podgate; RestartContainerd brings it back.
func (r *Rig) StopContainerd(ctx context.Context) error {
	b, err := os.ReadFile(filepath.Join(r.Dir, "containerd.pid"))
	if err != nil {
		return fmt.Errorf("stop containerd: %w", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return fmt.Errorf("stop containerd: pid file: %w", err)
	}
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		return fmt.Errorf("stop containerd: %w", err)
	}
	// containerd is not our child (up.sh started it): poll for the process to go away.
	if err := wait.PollUntilContextCancel(ctx, 20*time.Millisecond, true, func(context.Context) (bool, error) {
		return syscall.Kill(pid, 0) != nil, nil
	}); err != nil {
		return fmt.Errorf("stop containerd: pid %d still running: %w", pid, err)
	}
	return nil
}

// RestartContainerd starts containerd again in the rig's directory after StopContainerd, with
// the same socket, bridge and subnet.
func (r *Rig) RestartContainerd(ctx context.Context) error {
	if _, err := up(ctx, r.Dir, r.opts); err != nil {
		return fmt.Errorf("restart containerd: %w", err)
	}
	return nil
}
