//go:build linux

package cluster

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
)

// kubeletConfig is the kubelet's KubeletConfiguration (v1beta1), before Options.KubeletConfig.
// Everything that defaults to a host-wide path or port is moved into the cluster's directory or
// onto a port picked free, so that clusters of test packages running side by side, and the host,
// do not see each other.
func (c *Cluster) kubeletConfig(ports []int) map[string]any {
	imageEndpoint := c.opts.ImageEndpoint
	if imageEndpoint == "" {
		imageEndpoint = c.opts.CRIEndpoint
	}
	cfg := map[string]any{
		"apiVersion":               "kubelet.config.k8s.io/v1beta1",
		"kind":                     "KubeletConfiguration",
		"containerRuntimeEndpoint": c.opts.CRIEndpoint,
		"imageServiceEndpoint":     imageEndpoint,
		// These hosts are cgroup v1/v2 hybrid, have swap settings of their own and no systemd;
		// the rig's containerd uses cgroupfs too.
		"failCgroupV1": false,
		"cgroupDriver": "cgroupfs",
		"failSwapOn":   false,
		// The pods' cgroups go under a root of their own: two kubelets sharing /kubepods would
		// each remove the other's pod cgroups as orphans, killing its pods.
		"cgroupRoot": c.cgroupRoot,
		// The kubelet's API, on loopback; the read-only port and the healthz server are off.
		"address":      "127.0.0.1",
		"port":         ports[0],
		"readOnlyPort": 0,
		"healthzPort":  0,
		// Pods get this resolv.conf (no clusterDNS): a nameserver on their own loopback, so a
		// name lookup in a test pod never leaves it.
		"resolvConf":      filepath.Join(c.dir, "resolv.conf"),
		"podLogsDir":      c.PodLogsDir(),
		"volumePluginDir": filepath.Join(c.dir, "volume-plugins"),
		// Node status is patched only when it changes: checking every second makes the node
		// Ready about a second after the runtime is, without more API traffic.
		"nodeStatusUpdateFrequency": "1s",
		// No registry is reachable: an image the kubelet garbage-collected could not come back.
		// Disk pressure evictions at the default 10-15% free would fail tests on a full build
		// machine for reasons of its own.
		"imageGCHighThresholdPercent": 100,
		"imageGCLowThresholdPercent":  99,
		"evictionHard": map[string]string{
			"memory.available":  "1Mi",
			"nodefs.available":  "1%",
			"nodefs.inodesFree": "1%",
			"imagefs.available": "1%",
		},
		// The host's iptables are not the tests' to change (KUBE-FIREWALL and canary chains).
		"makeIPTablesUtilChains": false,
		// The default -999 needs CAP_SYS_RESOURCE, which these hosts lack.
		"oomScoreAdj": 0,
	}
	if len(c.opts.FeatureGates) > 0 {
		cfg["featureGates"] = c.opts.FeatureGates
	}
	maps.Copy(cfg, c.opts.KubeletConfig)
	return cfg
}

// StartKubelet starts the kubelet and waits until its Node is Ready. Up calls it unless
// Options.DeferKubelet; tests call it again after StopKubelet.
func (c *Cluster) StartKubelet(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.kubelet != nil {
		return errors.New("start kubelet: already running")
	}
	if c.opts.CRIEndpoint == "" {
		return errors.New("start kubelet: Options.CRIEndpoint is empty")
	}
	if err := c.prepareKubelet(); err != nil {
		return fmt.Errorf("start kubelet: %w", err)
	}
	since, err := c.afterLastHeartbeat(ctx)
	if err != nil {
		return fmt.Errorf("start kubelet: %w", err)
	}
	start := time.Now()
	p, _, err := c.startDaemon(ctx, "kubelet", kubeletTimeout, 1, func(ports []int) []string {
		cfg, err := json.MarshalIndent(c.kubeletConfig(ports), "", "  ")
		if err == nil {
			// JSON is YAML: the kubelet reads it as its config file.
			err = os.WriteFile(filepath.Join(c.dir, "kubelet.yaml"), cfg, 0o644)
		}
		if err != nil {
			// Without its config file the kubelet exits at once and says why.
			klog.FromContext(ctx).Error(err, "Writing kubelet config")
		}
		return []string{
			"--config=" + filepath.Join(c.dir, "kubelet.yaml"),
			"--kubeconfig=" + c.kubeconfig,
			"--root-dir=" + c.KubeletRootDir(),
			// Its default is /var/lib/kubelet/pki whatever --root-dir says.
			"--cert-dir=" + filepath.Join(c.KubeletRootDir(), "pki"),
			"--hostname-override=" + c.nodeName,
			"--v=2",
		}
	}, func(ctx context.Context, _ []int) error {
		return c.nodeReady(ctx, since)
	})
	if err != nil {
		return err
	}
	c.kubelet = p
	klog.FromContext(ctx).Info("Kubelet up", "node", c.nodeName, "endpoint", c.opts.CRIEndpoint, "duration", time.Since(start).Round(time.Millisecond))
	return nil
}

// SetRuntimeEndpoint changes the kubelet's containerRuntimeEndpoint and imageServiceEndpoint
// (both to endpoint) for its next StartKubelet, as an operator switching a node to podgate, or
// back to containerd, changes the kubelet's configuration between a stop and a start. It fails
// while the kubelet runs.
func (c *Cluster) SetRuntimeEndpoint(endpoint string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.kubelet != nil {
		return fmt.Errorf("set runtime endpoint %s: the kubelet runs; stop it first", endpoint)
	}
	c.opts.CRIEndpoint, c.opts.ImageEndpoint = endpoint, ""
	return nil
}

// prepareKubelet makes what the kubelet expects to exist: its cgroup root in every hierarchy and
// its resolv.conf.
func (c *Cluster) prepareKubelet() error {
	if c.cgroupRoot == "" {
		b := make([]byte, 4)
		if _, err := rand.Read(b); err != nil {
			return err
		}
		// Random, not derived from Dir: two tests may well use directories of the same name.
		root := cgroupParent + "/" + hex.EncodeToString(b)
		if err := makeCgroupRoot(root); err != nil {
			return err
		}
		c.cgroupRoot = root
	}
	return os.WriteFile(filepath.Join(c.dir, "resolv.conf"), []byte("nameserver 127.0.0.1\n"), 0o644)
}

// afterLastHeartbeat returns the second after the last heartbeat of the Node's Ready condition
// (zero without a Node) once that second has come. A Node whose kubelet stopped a moment ago still
// holds that kubelet's Ready=True (nothing here marks it Unknown, as the node lifecycle controller
// would after 50 s): the new kubelet's is told apart by its heartbeat. The API keeps heartbeats to
// the second, so a kubelet started from that second on posts only newer ones. The wait is at most
// a second, and only when the last heartbeat is that recent.
func (c *Cluster) afterLastHeartbeat(ctx context.Context) (time.Time, error) {
	node, err := c.client.CoreV1().Nodes().Get(ctx, c.nodeName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return time.Time{}, nil
	}
	if err != nil {
		return time.Time{}, fmt.Errorf("node %s: %w", c.nodeName, err)
	}
	var since time.Time
	for _, cond := range node.Status.Conditions {
		if cond.Type == corev1.NodeReady {
			since = cond.LastHeartbeatTime.Add(time.Second)
		}
	}
	timer := time.NewTimer(time.Until(since))
	defer timer.Stop()
	select {
	case <-timer.C:
		return since, nil
	case <-ctx.Done():
		return time.Time{}, context.Cause(ctx)
	}
}

// nodeReady is nil when the Node's Ready condition is True in a status that a kubelet posted at
// or after since (its heartbeat).
func (c *Cluster) nodeReady(ctx context.Context, since time.Time) error {
	ctx, cancel := context.WithTimeout(ctx, checkTimeout)
	defer cancel()
	node, err := c.client.CoreV1().Nodes().Get(ctx, c.nodeName, metav1.GetOptions{})
	if err != nil {
		return err
	}
	for _, cond := range node.Status.Conditions {
		if cond.Type != corev1.NodeReady {
			continue
		}
		if cond.LastHeartbeatTime.Time.Before(since) {
			return fmt.Errorf("node %s: Ready=%s posted at %s, before this kubelet's start", c.nodeName, cond.Status, cond.LastHeartbeatTime.Format(time.RFC3339))
		}
		if cond.Status != corev1.ConditionTrue {
			return fmt.Errorf("node %s: Ready=%s: %s: %s", c.nodeName, cond.Status, cond.Reason, cond.Message)
		}
		return nil
	}
	return fmt.Errorf("node %s has no Ready condition yet", c.nodeName)
}

// StopKubelet stops the kubelet (SIGTERM) and waits until it has exited; the pods keep running in
// containerd, as on a node whose kubelet restarts. The Node keeps the status the kubelet last
// posted, as it would for the node lifecycle controller's grace period (50 s). Stopping a stopped
// kubelet does nothing.
func (c *Cluster) StopKubelet(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.kubelet == nil {
		return nil
	}
	err := c.kubelet.stop(stopGrace)
	if done, _ := c.kubelet.exited(); !done {
		return err
	}
	// Killed after the grace period is still stopped: StartKubelet may start another.
	c.kubelet = nil
	return err
}

// KubeletRunning reports whether the kubelet runs: started and not exited.
func (c *Cluster) KubeletRunning() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.kubelet == nil {
		return false
	}
	done, _ := c.kubelet.exited()
	return !done
}

// drainPods deletes every pod left in the API, at once (grace period 0), and waits until the
// kubelet has killed their processes: none is left in the cluster's cgroups. That takes a few
// seconds; it does not wait for the kubelet's StopPodSandbox calls, which may still be under way
// when Down stops the kubelet, nor for the removal of the sandboxes, which the kubelet does only
// in its container garbage collection, once a minute: the rig stops and removes what is left.
// Without a running kubelet there is nobody to stop the pods, and Down kills their processes.
func (c *Cluster) drainPods(ctx context.Context) error {
	root := c.CgroupRoot()
	if !c.KubeletRunning() || c.client == nil || root == "" {
		return nil
	}
	pods, err := c.client.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list pods: %w", err)
	}
	for _, p := range pods.Items {
		err := c.client.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, *metav1.NewDeleteOptions(0))
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete pod %s/%s: %w", p.Namespace, p.Name, err)
		}
	}
	var left []int
	err = poll(ctx, drainTimeout, func(context.Context) (bool, error) {
		// A runtime endpoint that is gone (podgate stopped before the cluster) would make this
		// wait the whole drainTimeout for nothing.
		if err := dialUnix(c.opts.CRIEndpoint); err != nil {
			return false, fmt.Errorf("the kubelet cannot stop pods: %w", err)
		}
		dirs, err := cgroupDirs(root)
		left = cgroupPids(dirs)
		return len(left) == 0, err
	})
	if err != nil && len(left) > 0 {
		return fmt.Errorf("processes %v left in the pods' cgroups: %w", left, err)
	}
	return err
}

// dialUnix checks that a unix:// endpoint accepts connections.
func dialUnix(endpoint string) error {
	path, ok := strings.CutPrefix(endpoint, "unix://")
	if !ok {
		return nil // not ours to check
	}
	conn, err := net.DialTimeout("unix", path, time.Second)
	if err != nil {
		return fmt.Errorf("runtime endpoint %s: %w", endpoint, err)
	}
	return conn.Close()
}
