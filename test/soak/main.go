//go:build linux

// Command soak churns pod lifecycles through podgate on the rig's real containerd, samples
// podgate's RSS, goroutines and open fds from its metrics, and at the end checks that nothing is
// left over: no sandbox or container in containerd, no network namespace, no veth on the rig's
// bridge, no entry in podgate's registry or its checkpoint. It writes the samples (CSV) and a
// plot (SVG), prints the figures, and exits 1 when something is left over or the figures do not
// stay flat (±5 % after warm-up).
//
// It runs in one of two modes:
//
//   - kubelet: a real cluster (test/cluster: etcd, kube-apiserver and a kubelet 1.36 whose
//     runtime is podgate) runs the pods. Each lifecycle is a Pod created through the API server,
//     waited Running, exec'd into and its log read (both through podgate's CRI socket:
//     ExecSync, and the log file ContainerStatus names), deleted with a 1 s grace period and
//     waited gone, several at once (-parallel). The kubelet makes every runtime call; its
//     garbage collection removes the stopped sandboxes once a minute, which the leftover check
//     waits for (bounded).
//   - cri: a CRI client makes the kubelet's calls itself, one lifecycle after the other
//     (sandbox, status, container, start, exec, list, status, logs, stop, remove, list).
//
// -mode auto (the default) picks kubelet when the cluster's binaries are installed
// (cluster.CheckInstalled), cri otherwise.
//
//	make soak                       # 1,000 lifecycles (root)
//	go run ./test/soak -n 200 -mode cri -out /tmp/soak
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/podgate/podgate/test/cluster"
	"github.com/podgate/podgate/test/harness"
	"github.com/podgate/podgate/test/rig"
	"github.com/podgate/podgate/test/scrape"
)

// sample is podgate's footprint after some lifecycles.
type sample struct {
	lifecycles          int
	elapsed             time.Duration
	rssMiB              float64
	goroutines, openFDs float64
}

// config is what the command line asks for.
type config struct {
	n, parallel int
	mode, out   string
}

func main() {
	var cfg config
	flag.IntVar(&cfg.n, "n", 1000, "pod lifecycles")
	flag.StringVar(&cfg.mode, "mode", "auto", "kubelet (pods through a real kubelet), cri (a CRI client's calls), or auto (kubelet when the cluster is installed)")
	flag.IntVar(&cfg.parallel, "parallel", 8, "pods in flight at once (kubelet mode)")
	flag.StringVar(&cfg.out, "out", "_output/soak", "directory for samples.csv and soak.svg")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, cfg)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, cfg config) error {
	if cfg.n < 1 || cfg.parallel < 1 {
		return errors.New("-n and -parallel must be at least 1")
	}
	switch cfg.mode {
	case "auto":
		cfg.mode = "kubelet"
		if err := cluster.CheckInstalled(); err != nil {
			cfg.mode = "cri"
			fmt.Printf("mode cri: no kubelet on this rig (%v)\n", err)
		}
	case "kubelet":
		if err := cluster.CheckInstalled(); err != nil {
			return err
		}
	case "cri":
	default:
		return fmt.Errorf("-mode %q: want kubelet, cri or auto", cfg.mode)
	}
	var (
		res result
		err error
	)
	if cfg.mode == "kubelet" {
		fmt.Printf("mode kubelet: %d pods through kube-apiserver and a kubelet (test/cluster), %d in flight\n", cfg.n, cfg.parallel)
		res, err = withNode(ctx, func(n node) (result, error) { return runKubelet(ctx, cfg, n) })
	} else {
		fmt.Printf("mode cri: %d lifecycles through a CRI client at kubelet-like calls\n", cfg.n)
		res, err = withNode(ctx, func(n node) (result, error) { return runCRI(ctx, cfg, n) })
	}
	if err != nil {
		return err
	}
	if err := write(cfg.out, cfg.mode, res.samples); err != nil {
		return err
	}
	return report(cfg.mode, res)
}

// result is what a run gives the report.
type result struct {
	samples []sample
	left    []string
	took    time.Duration
	// notes are lines of the report particular to the mode (latencies, the end's idle figures).
	notes []string
}

// recorder counts finished lifecycles and samples podgate's footprint every so many.
type recorder struct {
	pg    *harness.Podgate
	every int
	start time.Time

	mu      sync.Mutex
	done    int
	samples []sample
}

func newRecorder(pg *harness.Podgate, n int) *recorder {
	return &recorder{pg: pg, every: max(1, n/50), start: time.Now()}
}

// finished counts one finished lifecycle and samples when it is the first or an every-th.
func (r *recorder) finished(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.done++
	if r.done%r.every != 0 && r.done != 1 {
		return nil
	}
	return r.sampleLocked(ctx)
}

// sample samples now, e.g. before the first lifecycle.
func (r *recorder) sample(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.sampleLocked(ctx)
}

func (r *recorder) sampleLocked(ctx context.Context) error {
	s, err := measure(ctx, r.pg)
	if err != nil {
		return err
	}
	s.lifecycles, s.elapsed = r.done, time.Since(r.start)
	r.samples = append(r.samples, s)
	fmt.Printf("%5d lifecycles  rss %.1f MiB  goroutines %.0f  fds %.0f  (%s)\n", s.lifecycles, s.rssMiB, s.goroutines, s.openFDs, s.elapsed.Round(time.Second))
	return nil
}

// measure reads podgate's RSS, goroutines and open fds from its metrics.
func measure(ctx context.Context, pg *harness.Podgate) (sample, error) {
	m, err := pg.Scrape(ctx)
	if err != nil {
		return sample{}, err
	}
	var s sample
	s.rssMiB = value(m, "process_resident_memory_bytes") / (1 << 20)
	s.goroutines = value(m, "go_goroutines")
	s.openFDs = value(m, "process_open_fds")
	return s, nil
}

// value is the value of an unlabelled metric, -1 when the page lacks it.
func value(m scrape.Metrics, name string) float64 {
	if v, ok := m.Value(name); ok {
		return v
	}
	return -1
}

// poll calls cond every interval until it is true, ctx ends or timeout passes. An error from
// cond does not end the wait (what it looks at may not be there yet): the last one is returned
// with the timeout.
func poll(ctx context.Context, timeout, every time.Duration, cond func() (bool, error)) error {
	var last error
	err := wait.PollUntilContextTimeout(ctx, every, timeout, true, func(context.Context) (bool, error) {
		ok, err := cond()
		last = err
		return ok, nil
	})
	switch {
	case err == nil:
		return nil
	case ctx.Err() != nil:
		return ctx.Err()
	case last != nil:
		return fmt.Errorf("timed out after %s (last error: %w)", timeout, last)
	default:
		return fmt.Errorf("timed out after %s", timeout)
	}
}

// node is what both modes start from: the rig's containerd, a work directory, and the podgate
// binary built into it.
type node struct {
	rig       *rig.Rig
	work, bin string
}

// withNode brings the rig up, makes the work directory and builds podgate, runs run on them,
// and takes them down again: the work directory after run returns (in kubelet mode, after the
// cluster's Down has unmounted what the kubelet mounted below it), the rig last.
func withNode(ctx context.Context, run func(node) (result, error)) (res result, err error) {
	r, err := rig.Up(ctx, "")
	if err != nil {
		return res, err
	}
	defer func() { err = errors.Join(err, r.Down(context.WithoutCancel(ctx))) }()
	work, err := os.MkdirTemp("/tmp", "pgs")
	if err != nil {
		return res, err
	}
	defer os.RemoveAll(work)
	bin, err := harness.Build(ctx, work)
	if err != nil {
		return res, err
	}
	return run(node{rig: r, work: work, bin: bin})
}
