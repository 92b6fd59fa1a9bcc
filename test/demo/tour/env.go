//go:build linux

package tour

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/podgate/podgate/test/cluster"
	"github.com/podgate/podgate/test/demo/timeline"
	"github.com/podgate/podgate/test/dranode"
	"github.com/podgate/podgate/test/harness"
	"github.com/podgate/podgate/test/otlpfake"
	"github.com/podgate/podgate/test/registry"
	"github.com/podgate/podgate/test/rig"
)

// Namespace holds the demo's pods; the critical pod is in kube-system, where Kubernetes admits
// the system-* priority classes.
const Namespace = "demo"

// The two local registries: A has a cap of its own, B only the node's. Each download is
// throttled to bandwidth, so a pull of a layerSize layer takes about a second and a queue is
// something one can see.
const (
	maxParallel  = 3
	registryACap = 2
	bandwidth    = 4 << 20
	layerSize    = 4 << 20
)

// InterfacePrefix names the DRA driver's host interfaces in the demo (pgdemoN): not the
// end-to-end tests' (pgnicN), which go test ./... may run at the same time.
const InterfacePrefix = "pgdemo"

// CheckInstalled reports what of the rig the tour needs is missing: containerd, runc, the
// images, etcd and kube-apiserver (make rig-node rig-control-plane).
func CheckInstalled() error {
	return errors.Join(rig.CheckInstalled(), cluster.CheckControlPlaneInstalled())
}

// Env is the demo's node, running.
type Env struct {
	// Out receives the steps' lines.
	Out io.Writer
	// OutDir receives the timeline picture and podgate's and the driver's logs.
	OutDir string

	// work holds the binaries, sockets and podgate's state; short, for unix socket paths.
	work string
	// Rig is the containerd, Cluster the API server (no kubelet), Kube its admin client.
	Rig     *rig.Rig
	Cluster *cluster.Cluster
	Kube    kubernetes.Interface
	// Podgate runs in front of Rig's containerd.
	Podgate *harness.Podgate
	driver  *dranode.Driver
	// RegA and RegB are the registries; RegA has its own cap.
	RegA, RegB *registry.Registry
	// Through talks to podgate, as the kubelet does; Direct to containerd, past podgate.
	Through, Direct *rig.Client
	// Records is the recording CNI plugin's file; Events the DRA driver's call log.
	Records, Events string
	// Traces receives podgate's spans over OTLP: the timeline's stage times.
	Traces *otlpfake.Collector
	// busybox is the rig's busybox image, the base of the pods' images.
	busybox string
	// podgateLog receives podgate's log, beside the copy Podgate keeps.
	podgateLog *os.File
	// pods are the pod starts the timeline shows, in order.
	pods []timeline.Pod
	// sandboxes and apiPods are what the steps started, for the cleanup.
	sandboxes []startedPod
	apiPods   []*corev1.Pod
}

// step prints a step's title.
func (e *Env) step(format string, args ...any) {
	fmt.Fprintf(e.Out, "\n==> "+format+"\n", args...)
}

// say prints one line of a step: what podgate did, and why it matters.
func (e *Env) say(format string, args ...any) {
	fmt.Fprintf(e.Out, "    "+format+"\n", args...)
}

// Up builds podgate and the test programs, starts the node and podgate in front of it, and
// prints what runs where. outDir receives the timeline and the logs. On failure it stops what
// it started.
func Up(ctx context.Context, out io.Writer, outDir string) (_ *Env, err error) {
	if err := CheckInstalled(); err != nil {
		return nil, err
	}
	outDir, err = filepath.Abs(outDir)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return nil, err
	}
	e := &Env{Out: out, OutDir: outDir, busybox: filepath.Join(rig.InstallDir(), "images", "busybox.tar")}
	defer func() {
		if err != nil {
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 3*time.Minute)
			defer cancel()
			err = errors.Join(err, e.Down(dctx))
		}
	}()
	if e.work, err = os.MkdirTemp("/tmp", "pgd"); err != nil {
		return nil, err
	}
	// The driver's host interfaces are the demo's: a run that died half-way may have left some.
	if err := dranode.RemoveLinks(InterfacePrefix); err != nil {
		return nil, err
	}
	e.step("Starting the node: containerd, an API server, a DRA driver, two image registries, podgate")
	start := time.Now()
	// The build takes longest: the node starts meanwhile.
	built := make(chan error, 1)
	go func() { built <- e.build(ctx) }()
	if err := e.startNode(ctx); err != nil {
		return nil, errors.Join(err, <-built)
	}
	if err := <-built; err != nil {
		return nil, err
	}
	if err := e.startDriverAndPodgate(ctx); err != nil {
		return nil, err
	}
	e.say("ready in %s; podgate's log: %s", time.Since(start).Round(100*time.Millisecond), e.podgateLog.Name())
	return e, nil
}

// build compiles podgate, the recording CNI plugin and the DRA driver in one go build.
func (e *Env) build(ctx context.Context) error {
	bins, err := harness.BuildPrograms(ctx, filepath.Join(e.work, "bin"), "./test/cni/recorder", "./test/dradriver")
	if err != nil {
		return err
	}
	// The CNI configuration names the plugin by its binary's name.
	return os.Rename(bins["recorder"], filepath.Join(e.work, "bin", "pgrecorder"))
}

// startNode starts containerd, the control plane and the registries.
func (e *Env) startNode(ctx context.Context) error {
	e.Records = filepath.Join(e.work, "cni-record.jsonl")
	e.Events = filepath.Join(e.work, "dra-events.jsonl")
	r, err := rig.UpWith(ctx, "", rig.Options{CNIBinDir: filepath.Join(e.work, "bin"), CNIChain: []string{dranode.RecorderConf(e.Records, InterfacePrefix)}})
	if err != nil {
		return err
	}
	e.Rig = r
	e.say("containerd %s: its own root, state and CNI bridge %s (%s) in %s", containerdVersion(), r.Bridge, r.Subnet, r.Dir)
	c, err := cluster.Up(ctx, cluster.Options{DeferKubelet: true})
	if err != nil {
		return err
	}
	e.Cluster, e.Kube = c, c.Client()
	if _, err := c.RegisterNode(ctx); err != nil {
		return err
	}
	if _, err := c.CreateNamespace(ctx, Namespace); err != nil {
		return err
	}
	// kube-system exists from the start but has no ServiceAccount without a controller-manager.
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}
	if _, err := e.Kube.CoreV1().ServiceAccounts(metav1.NamespaceSystem).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	for _, d := range []string{c.PluginRegistryDir(), c.PluginsDir()} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			return err
		}
	}
	e.say("etcd and kube-apiserver %s with node %s registered (no kubelet: this demo plays it)", c.RESTConfig().Host, c.NodeName())
	e.RegA, e.RegB = registry.New(bandwidth), registry.New(bandwidth)
	for _, reg := range []*registry.Registry{e.RegA, e.RegB} {
		if _, err := reg.Listen(); err != nil {
			return err
		}
		reg.Count(true)
	}
	e.say("registries A %s and B %s on loopback, each download throttled to %d MiB/s", e.RegA.Host, e.RegB.Host, bandwidth>>20)
	if e.Traces, err = otlpfake.Listen(); err != nil {
		return err
	}
	e.say("an OpenTelemetry (OTLP) trace collector on %s receives podgate's spans: the timeline's stage times", e.Traces.Endpoint)
	return nil
}

// config is podgate's configuration for the demo.
func (e *Env) config() string {
	return fmt.Sprintf(`apiVersion: podgate.dev/v1alpha1
kind: AgentConfiguration
imagePulls:
  maxParallel: %d
  perRegistry: {%q: %d}
sysctls:
  podDefaults: {net.ipv4.tcp_keepalive_time: "600"}
  verify: fail
dra:
  pluginRegistryDir: %s
  attach: [%s]
  publishNetworkData: true
podResources:
  kubeletSocket: ""
tracing:
  endpoint: %s
  samplingRatePerMillion: 1000000
`, maxParallel, e.RegA.Host, registryACap, e.Cluster.PluginRegistryDir(), dranode.DriverName, e.Traces.Endpoint)
}

// startDriverAndPodgate starts the DRA driver, then podgate with the cluster's kubeconfig, and
// waits until podgate sees the driver and the driver's ResourceSlice is published.
func (e *Env) startDriverAndPodgate(ctx context.Context) error {
	c := e.Cluster
	d, err := dranode.StartDriver(dranode.DriverConfig{
		Bin: filepath.Join(e.work, "bin", "dradriver"), NodeName: c.NodeName(), Kubeconfig: c.Kubeconfig(),
		RegistryDir: c.PluginRegistryDir(), PluginDir: filepath.Join(c.PluginsDir(), dranode.DriverName),
		EventsFile: e.Events, LogDir: e.OutDir, InterfacePrefix: InterfacePrefix,
	})
	if err != nil {
		return err
	}
	e.driver = d
	if err := dranode.WaitSlice(ctx, e.Kube, c.NodeName(), time.Minute); err != nil {
		return err
	}
	e.say("DRA driver %s registered; it publishes devices nic0..nic3 (host interfaces %s0..3) for node %s", dranode.DriverName, InterfacePrefix, c.NodeName())

	configPath := filepath.Join(e.work, "podgate.yaml")
	if err := os.WriteFile(configPath, []byte(e.config()), 0o600); err != nil {
		return err
	}
	if e.podgateLog, err = os.Create(filepath.Join(e.OutDir, "podgate.log")); err != nil {
		return err
	}
	p, err := harness.Start(ctx, filepath.Join(e.work, "bin", "podgate"), harness.Options{
		Dir: e.work, RuntimeEndpoint: e.Rig.Endpoint, Stderr: e.podgateLog, Env: traceEnv,
		Args: []string{"--config", configPath, "--kubeconfig", c.Kubeconfig(), "--node-name", c.NodeName()},
	})
	if err != nil {
		return err
	}
	e.Podgate = p
	if e.Through, err = rig.Dial(ctx, p.Endpoint); err != nil {
		return err
	}
	if e.Direct, err = rig.Dial(ctx, e.Rig.Endpoint); err != nil {
		return err
	}
	if err := e.waitMetric(ctx, "podgate seeing the DRA driver", "podgate_dra_drivers", 1, "driver", dranode.DriverName); err != nil {
		return err
	}
	e.say("podgate serves CRI on %s (the kubelet's containerRuntimeEndpoint) in front of containerd, with this configuration:", p.Endpoint)
	for line := range strings.Lines(e.config()) {
		e.say("    %s", strings.TrimRight(line, "\n"))
	}
	return nil
}

// Down stops everything Up started, last first, and removes the work directory. It cleans up
// whatever state the steps left.
func (e *Env) Down(ctx context.Context) error {
	var errs []error
	for _, c := range []*rig.Client{e.Through, e.Direct} {
		if c != nil {
			errs = append(errs, c.Close(ctx))
		}
	}
	if e.Podgate != nil {
		if code, err := e.Podgate.Stop(30 * time.Second); err != nil || code != 0 {
			errs = append(errs, fmt.Errorf("podgate stop: exit %d: %w", code, err))
		}
	}
	if e.podgateLog != nil {
		errs = append(errs, e.podgateLog.Close())
	}
	if e.driver != nil {
		errs = append(errs, e.driver.Stop())
	}
	if e.Cluster != nil {
		errs = append(errs, e.Cluster.Down(ctx))
	}
	if e.Rig != nil {
		errs = append(errs, e.Rig.Down(ctx))
	}
	for _, reg := range []*registry.Registry{e.RegA, e.RegB} {
		if reg != nil {
			errs = append(errs, reg.Close())
		}
	}
	if e.Traces != nil {
		errs = append(errs, e.Traces.Close())
	}
	errs = append(errs, dranode.RemoveLinks(InterfacePrefix))
	if e.work != "" {
		errs = append(errs, os.RemoveAll(e.work))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("clean up: %w", err)
	}
	klog.FromContext(ctx).V(2).Info("Demo node down")
	return nil
}

// containerdVersion is the rig's containerd version, for the reader.
func containerdVersion() string {
	out, err := exec.Command(filepath.Join(rig.InstallDir(), "bin", "containerd"), "--version").Output()
	if f := strings.Fields(string(out)); err == nil && len(f) >= 3 {
		return f[2]
	}
	return "(version unknown)"
}

// busyboxImage pushes to reg, as repo:v1, the rig's busybox with one more layer of layerSize
// random bytes: an image a container can run, whose pull takes about a second.
func (e *Env) busyboxImage(reg *registry.Registry, repo string) (string, error) {
	tag, err := name.NewTag(rig.BusyboxImage)
	if err != nil {
		return "", err
	}
	base, err := tarball.ImageFromPath(e.busybox, &tag)
	if err != nil {
		return "", fmt.Errorf("busybox image: %w", err)
	}
	img, err := withRandomLayer(base)
	if err != nil {
		return "", err
	}
	return reg.PushImage(repo+":v1", img)
}
