// Command soak churns pod lifecycles through podgate on the rig's real containerd, as a kubelet
// would (sandbox, container, exec, logs, stop, remove, with status and list calls between),
// samples podgate's RSS, goroutines and open fds from its metrics, and at the end checks that
// nothing is left over: no sandbox or container in containerd, no network namespace, no veth
// on the rig's bridge, no entry in podgate's registry or its checkpoint. It writes the samples
// (CSV) and a plot (SVG), prints the figures, and exits 1 when something is left over or the
// figures do not stay flat (±5 % after warm-up).
//
//	make soak                       # 1,000 lifecycles (root)
//	go run ./test/soak -n 200 -out /tmp/soak
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podgate/podgate/agent"
	"github.com/podgate/podgate/test/harness"
	"github.com/podgate/podgate/test/rig"
)

// sample is podgate's footprint after some lifecycles.
type sample struct {
	lifecycles          int
	rssMiB              float64
	goroutines, openFDs float64
}

func main() {
	n := flag.Int("n", 1000, "pod lifecycles")
	out := flag.String("out", "_output/soak", "directory for samples.csv and soak.svg")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, *n, *out)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, n int, out string) (err error) {
	r, err := rig.Up(ctx, "")
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, r.Down(context.WithoutCancel(ctx))) }()
	work, err := os.MkdirTemp("/tmp", "pgs")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	bin, err := harness.Build(ctx, work)
	if err != nil {
		return err
	}
	pg, err := harness.Start(ctx, bin, harness.Options{Dir: work, RuntimeEndpoint: r.Endpoint})
	if err != nil {
		return err
	}
	defer func() {
		_, serr := pg.Stop(30 * time.Second)
		err = errors.Join(err, serr)
	}()
	c, err := rig.Dial(ctx, pg.Endpoint)
	if err != nil {
		return err
	}
	every := max(1, n/50)
	var samples []sample
	start := time.Now()
	for i := range n {
		if err := lifecycle(ctx, c, r, i); err != nil {
			return fmt.Errorf("lifecycle %d: %w", i, err)
		}
		if (i+1)%every == 0 || i == 0 {
			s, err := measure(ctx, pg, i+1)
			if err != nil {
				return err
			}
			samples = append(samples, s)
			fmt.Printf("%5d lifecycles  rss %.1f MiB  goroutines %.0f  fds %.0f  (%s)\n", s.lifecycles, s.rssMiB, s.goroutines, s.openFDs, time.Since(start).Round(time.Second))
		}
	}
	left, err := leftovers(ctx, pg, r, work)
	if err != nil {
		return err
	}
	if err := write(out, samples); err != nil {
		return err
	}
	return report(samples, left, time.Since(start))
}

// lifecycle is one pod's life as the kubelet drives it, with its status and list calls.
func lifecycle(ctx context.Context, c *rig.Client, r *rig.Rig, i int) error {
	name := fmt.Sprintf("soak-%d", i)
	sb := &runtimeapi.PodSandboxConfig{
		Metadata:     &runtimeapi.PodSandboxMetadata{Name: name, Namespace: "soak", Uid: "uid-" + name},
		LogDirectory: filepath.Join(r.Dir, "pods", name),
		Linux:        &runtimeapi.LinuxPodSandboxConfig{},
	}
	id, err := c.Runtime.RunPodSandbox(ctx, sb, "")
	if err != nil {
		return err
	}
	if _, err := c.Runtime.PodSandboxStatus(ctx, id, false); err != nil {
		return err
	}
	ctr, err := c.Runtime.CreateContainer(ctx, id, &runtimeapi.ContainerConfig{
		Metadata: &runtimeapi.ContainerMetadata{Name: "main"},
		Image:    &runtimeapi.ImageSpec{Image: rig.BusyboxImage},
		Command:  []string{"/bin/sh", "-c", "echo started; exec sleep 3600"},
		LogPath:  "main/0.log",
		Linux:    &runtimeapi.LinuxContainerConfig{Resources: &runtimeapi.LinuxContainerResources{CpuQuota: 50000, CpuPeriod: 100000, MemoryLimitInBytes: 64 << 20}},
	}, sb)
	if err != nil {
		return err
	}
	if err := c.Runtime.StartContainer(ctx, ctr); err != nil {
		return err
	}
	if _, _, err := c.Runtime.ExecSync(ctx, ctr, []string{"echo", "hi"}, 10*time.Second); err != nil {
		return err
	}
	if _, err := c.Runtime.ListContainers(ctx, &runtimeapi.ContainerFilter{PodSandboxId: id}); err != nil {
		return err
	}
	if _, err := c.Runtime.ContainerStatus(ctx, ctr, false); err != nil {
		return err
	}
	if _, err := os.ReadFile(filepath.Join(sb.LogDirectory, "main", "0.log")); err != nil && !os.IsNotExist(err) {
		return err // logs: read as the kubelet's log reader would
	}
	if err := c.Runtime.StopContainer(ctx, ctr, 0); err != nil {
		return err
	}
	if err := c.Runtime.RemoveContainer(ctx, ctr); err != nil {
		return err
	}
	if err := c.Runtime.StopPodSandbox(ctx, id); err != nil {
		return err
	}
	if err := c.Runtime.RemovePodSandbox(ctx, id); err != nil {
		return err
	}
	_, err = c.Runtime.ListPodSandbox(ctx, nil)
	return err
}

// measure reads podgate's RSS, goroutines and open fds from its metrics.
func measure(ctx context.Context, pg *harness.Podgate, lifecycles int) (sample, error) {
	page, err := pg.Metrics(ctx)
	if err != nil {
		return sample{}, err
	}
	s := sample{lifecycles: lifecycles}
	s.rssMiB = metric(page, "process_resident_memory_bytes") / (1 << 20)
	s.goroutines = metric(page, "go_goroutines")
	s.openFDs = metric(page, "process_open_fds")
	return s, nil
}

func metric(page, name string) float64 {
	for line := range strings.Lines(page) {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, _ := strconv.ParseFloat(strings.TrimSpace(v), 64)
			return f
		}
	}
	return -1
}

// leftovers lists what the churn left behind.
func leftovers(ctx context.Context, pg *harness.Podgate, r *rig.Rig, work string) ([]string, error) {
	var left []string
	direct, err := rig.Dial(ctx, r.Endpoint)
	if err != nil {
		return nil, err
	}
	defer direct.Close(ctx)
	sbs, err := direct.Runtime.ListPodSandbox(ctx, nil)
	if err != nil {
		return nil, err
	}
	ctrs, err := direct.Runtime.ListContainers(ctx, nil)
	if err != nil {
		return nil, err
	}
	if len(sbs)+len(ctrs) > 0 {
		left = append(left, fmt.Sprintf("containerd holds %d sandboxes, %d containers", len(sbs), len(ctrs)))
	}
	netns, _ := filepath.Glob(filepath.Join(r.Dir, "state", "io.containerd.grpc.v1.cri", "netns", "*"))
	if len(netns) > 0 {
		left = append(left, fmt.Sprintf("%d network namespaces", len(netns)))
	}
	veths, _ := filepath.Glob(filepath.Join("/sys/class/net", r.Bridge, "brif", "*"))
	if len(veths) > 0 {
		left = append(left, fmt.Sprintf("%d interfaces on bridge %s", len(veths), r.Bridge))
	}
	// The registry forgets a sandbox on RemovePodSandbox; its checkpoint follows in the
	// background, within moments.
	deadline := time.Now().Add(10 * time.Second)
	for {
		page, err := pg.Metrics(ctx)
		if err != nil {
			return nil, err
		}
		recs, err := agent.NewCheckpoint(filepath.Join(work, "state")).Read()
		if err != nil {
			return nil, err
		}
		inRegistry := metric(page, "podgate_registry_sandboxes")
		if inRegistry == 0 && len(recs) == 0 {
			break
		}
		if time.Now().After(deadline) {
			left = append(left, fmt.Sprintf("podgate's registry holds %.0f sandboxes, its checkpoint %d", inRegistry, len(recs)))
			break
		}
		time.Sleep(100 * time.Millisecond) // the checkpoint is written in the background
	}
	return left, nil
}
