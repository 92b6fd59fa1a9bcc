// Command demo shows podgate doing its job on a real node: it starts a private containerd
// (package rig), puts podgate in front of it, and runs a pod through podgate's socket with
// cri-client, the kubelet's own CRI client. It prints what happened: the pod's IP, what its
// container wrote, podgate's log of the pod, and podgate's metrics. Then it cleans up.
//
// Run it as root with `make demo`.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protojson"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/klog/v2"

	"github.com/podgate/podgate/agent/registry"
	prv1alpha1 "github.com/podgate/podgate/podresources/api/v1alpha1"
	"github.com/podgate/podgate/test/harness"
	"github.com/podgate/podgate/test/rig"
)

func main() {
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "demo: needs root (containerd, runc and CNI run for real): sudo make demo")
		os.Exit(1)
	}
	if err := runDemo(); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func runDemo() error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	return run(ctx, os.Stdout)
}

func step(out io.Writer, format string, args ...any) {
	fmt.Fprintf(out, "\n==> "+format+"\n", args...)
}

func run(ctx context.Context, out io.Writer) (err error) {
	step(out, "Starting a private containerd (root, state, socket and CNI bridge in a temp dir)")
	r, err := rig.Up(ctx, "")
	if err != nil {
		return err
	}
	defer func() {
		step(out, "Cleaning up: containerd, its pods and network")
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
		defer cancel()
		err = errors.Join(err, r.Down(dctx))
	}()
	fmt.Fprintf(out, "    containerd: %s   pod network: %s on bridge %s\n", r.Endpoint, r.Subnet, r.Bridge)

	step(out, "Building podgate and starting it in front of containerd")
	work, err := os.MkdirTemp("/tmp", "pgd")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	bin, err := harness.Build(ctx, work)
	if err != nil {
		return err
	}
	config := filepath.Join(work, "podgate.yaml")
	if err := os.WriteFile(config, []byte(demoConfig), 0o600); err != nil {
		return err
	}
	pg, err := harness.Start(ctx, bin, harness.Options{Dir: work, RuntimeEndpoint: r.Endpoint, Args: []string{"--config", config}})
	if err != nil {
		return err
	}
	defer func() {
		code, serr := pg.Stop(30 * time.Second)
		fmt.Fprintf(out, "    podgate stopped on SIGTERM, exit code %d\n", code)
		err = errors.Join(err, serr)
	}()
	fmt.Fprintf(out, "    podgate serves CRI on %s (the kubelet's containerRuntimeEndpoint), metrics on %s\n", pg.Endpoint, pg.MetricsURL)
	fmt.Fprintf(out, "    its configuration:\n%s", indent(demoConfig))

	c, err := rig.Dial(ctx, pg.Endpoint)
	if err != nil {
		return err
	}
	defer c.Close(ctx)

	step(out, "Running a pod through podgate, as the kubelet would")
	v, err := c.Runtime.Version(ctx, "v1")
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "    Version through podgate: %s %s (CRI %s)\n", v.RuntimeName, v.RuntimeVersion, v.RuntimeApiVersion)
	sb := &runtimeapi.PodSandboxConfig{
		Metadata:     &runtimeapi.PodSandboxMetadata{Name: "hello", Namespace: "demo", Uid: "demo-uid-1"},
		Hostname:     "hello",
		LogDirectory: filepath.Join(r.Dir, "pods", "hello"),
		Linux:        &runtimeapi.LinuxPodSandboxConfig{},
	}
	podID, err := c.Runtime.RunPodSandbox(ctx, sb, "")
	if err != nil {
		return err
	}
	st, err := c.Runtime.PodSandboxStatus(ctx, podID, false)
	if err != nil {
		return err
	}
	ip := st.GetStatus().GetNetwork().GetIp()
	fmt.Fprintf(out, "    RunPodSandbox -> sandbox %.12s, pod IP %s (from CNI)\n", podID, ip)

	ctrID, err := c.Runtime.CreateContainer(ctx, podID, &runtimeapi.ContainerConfig{
		Metadata: &runtimeapi.ContainerMetadata{Name: "greeter"},
		Image:    &runtimeapi.ImageSpec{Image: rig.BusyboxImage},
		Command: []string{"/bin/sh", "-c",
			`echo "hello from pod $(hostname), my address: $(ip -4 -o addr show eth0 | awk '{print $4}')"; exec sleep 3600`},
		LogPath: "greeter/0.log",
		Linux:   &runtimeapi.LinuxContainerConfig{},
	}, sb)
	if err != nil {
		return err
	}
	if err := c.Runtime.StartContainer(ctx, ctrID); err != nil {
		return err
	}
	fmt.Fprintf(out, "    CreateContainer + StartContainer -> container %.12s (busybox)\n", ctrID)
	stdout, _, err := c.Runtime.ExecSync(ctx, ctrID, []string{"cat", "/proc/sys/net/ipv4/tcp_keepalive_time"}, 10*time.Second)
	if err != nil {
		return err
	}
	host, err := os.ReadFile("/proc/sys/net/ipv4/tcp_keepalive_time")
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "    ExecSync cat /proc/sys/net/ipv4/tcp_keepalive_time -> %s in the pod (podgate's node default; the host keeps %s)\n",
		strings.TrimSpace(string(stdout)), strings.TrimSpace(string(host)))
	logLine, err := waitLog(ctx, filepath.Join(sb.LogDirectory, "greeter", "0.log"))
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "    container output (from its CRI log file): %s\n", logLine)

	step(out, "What podgate recorded of the pod (its pod registry, kept in %s)", registry.CheckpointFile)
	recs, err := recorded(ctx, filepath.Join(work, "state"))
	if err != nil {
		return err
	}
	for _, rec := range recs {
		fmt.Fprintf(out, "    sandbox %.12s  pod %s/%s  origin %s  ready %v\n", rec.ID, rec.Pod.Namespace, rec.Pod.Name, rec.Origin, rec.Ready)
		fmt.Fprintf(out, "      netns %s  pause pid %d  IPs %v\n", rec.NetNS, rec.PID, rec.IPs)
		fmt.Fprintf(out, "      sysctls asked %v, applied %v, verified in the pod: %s\n", rec.Sysctls.Asked, rec.Sysctls.Applied, rec.Sysctls.Verification)
	}

	step(out, "Asking podgate's PodResources socket for the pod, as a meta-CNI plugin would (%s)", pg.PodResourcesSocket)
	pr, err := podResources(ctx, pg.PodResourcesSocket, "demo", "hello")
	if err != nil {
		return err
	}
	fmt.Fprint(out, indent(pr))

	step(out, "Asking for a pod that sets kernel.core_pattern (a node-wide sysctl)")
	// The refusal is the point here: the client's own error log of it (cri-client logs every
	// failed RunPodSandbox through the context's logger) is dropped for this one call, podgate's
	// log of it is shown below.
	quiet := klog.NewContext(ctx, logr.Discard())
	_, err = c.Runtime.RunPodSandbox(quiet, &runtimeapi.PodSandboxConfig{
		Metadata: &runtimeapi.PodSandboxMetadata{Name: "evil", Namespace: "demo", Uid: "demo-uid-2"},
		Linux:    &runtimeapi.LinuxPodSandboxConfig{Sysctls: map[string]string{"kernel.core_pattern": "|/tmp/x"}},
	}, "")
	fmt.Fprintf(out, "    RunPodSandbox -> %v\n", err)
	pods, err := c.Runtime.ListPodSandbox(ctx, nil)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "    sandboxes containerd has now: %d (only the first pod: nothing was created for the refused one)\n", len(pods))

	step(out, "Stopping and removing the pod")
	if err := c.Runtime.StopContainer(ctx, ctrID, 5); err != nil {
		return err
	}
	if err := c.Runtime.RemoveContainer(ctx, ctrID); err != nil {
		return err
	}
	if err := c.Runtime.StopPodSandbox(ctx, podID); err != nil {
		return err
	}
	if err := c.Runtime.RemovePodSandbox(ctx, podID); err != nil {
		return err
	}
	fmt.Fprintln(out, "    StopContainer, RemoveContainer, StopPodSandbox, RemovePodSandbox: done")

	step(out, "What podgate logged")
	for _, l := range strings.Split(strings.TrimSpace(pg.Log.String()), "\n") {
		fmt.Fprintln(out, "    "+l)
	}
	step(out, "What podgate counted (non-zero CRI and sysctl counters)")
	metrics, err := pg.Metrics(ctx)
	if err != nil {
		return err
	}
	for _, l := range strings.Split(metrics, "\n") {
		if (strings.HasPrefix(l, "podgate_cri_requests_total{") || strings.HasPrefix(l, "podgate_sysctl_") && !strings.Contains(l, "duration")) && !strings.HasSuffix(l, " 0") {
			fmt.Fprintln(out, "    "+l)
		}
	}
	return nil
}

// demoConfig gives every pod a TCP keepalive shorter than the kernel's 7200 s.
const demoConfig = `apiVersion: podgate.dev/v1alpha1
kind: AgentConfiguration
sysctls:
  podDefaults: {net.ipv4.tcp_keepalive_time: "600"}
`

// recorded reads podgate's registry checkpoint once it holds a sandbox whose sysctls are
// verified: podgate writes it in the background, moments after the verification.
func recorded(ctx context.Context, stateDir string) ([]registry.SandboxRecord, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		recs, err := registry.NewCheckpoint(stateDir).Read()
		if err != nil {
			return nil, err
		}
		if len(recs) > 0 && recs[0].Sysctls.Verification != registry.SysctlsPending {
			return recs, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("registry checkpoint: no verified sandbox: %w", ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// podResources asks podgate's PodResources extension for one pod, as grpcurl would show it.
func podResources(ctx context.Context, socket, namespace, name string) (string, error) {
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return "", err
	}
	defer conn.Close()
	resp, err := prv1alpha1.NewPodResourcesClient(conn).Get(ctx, &prv1alpha1.GetRequest{PodName: name, PodNamespace: namespace})
	if err != nil {
		return "", fmt.Errorf("PodResources Get %s/%s: %w", namespace, name, err)
	}
	// protojson varies its spacing on purpose; encoding/json lays it out the same every time.
	b, err := protojson.Marshal(resp)
	if err != nil {
		return "", err
	}
	var pretty bytes.Buffer
	if err := json.Indent(&pretty, b, "", "  "); err != nil {
		return "", err
	}
	return pretty.String(), nil
}

func indent(s string) string {
	return "        " + strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\n        ") + "\n"
}

// waitLog waits for the first line of a container's CRI log and returns its message part.
func waitLog(ctx context.Context, path string) (string, error) {
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if f, err := os.Open(path); err == nil {
			sc := bufio.NewScanner(f)
			ok := sc.Scan()
			f.Close()
			if ok {
				// CRI log format: <time> <stream> <tag> <message>
				if parts := strings.SplitN(sc.Text(), " ", 4); len(parts) == 4 {
					return parts[3], nil
				}
			}
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return "", fmt.Errorf("no output in %s after 30s", path)
}
