//go:build linux

package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/podgate/podgate/test/cluster"
	"github.com/podgate/podgate/test/harness"
	"github.com/podgate/podgate/test/rig"
)

// downTimeout bounds the cluster's Down at the end: it drains the pods left in the API.
const downTimeout = 4 * time.Minute

// runKubelet churns pods through a real kubelet whose runtime is podgate: the rig's containerd,
// podgate in front of it, and etcd, kube-apiserver and the kubelet of test/cluster, started in
// the order test/cluster's own tests use (the API server first, so that podgate gets its
// kubeconfig; then podgate; then the kubelet on podgate's socket).
func runKubelet(ctx context.Context, cfg config, n node) (res result, err error) {
	r, work, bin := n.rig, n.work, n.bin
	// podgate stops after the cluster: Down has the kubelet stop the pods left through it.
	var (
		c  *cluster.Cluster
		pg *harness.Podgate
	)
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), downTimeout)
		defer cancel()
		if c != nil {
			if err != nil {
				fmt.Fprintf(os.Stderr, "last lines of the kubelet's log:\n%s\n", tail(c.LogFiles()["kubelet"], 30))
			}
			err = errors.Join(err, c.Down(dctx))
		}
		if pg != nil {
			if err != nil {
				fmt.Fprintf(os.Stderr, "last lines of podgate's log:\n%s\n", lastLines(pg.Log.String(), 30))
			}
			_, serr := pg.Stop(30 * time.Second)
			err = errors.Join(err, serr)
		}
	}()
	c, err = cluster.Up(ctx, cluster.Options{
		CRIEndpoint:  "unix://" + filepath.Join(work, "cri.sock"), // where harness.Start puts it
		DeferKubelet: true,
		Dir:          filepath.Join(work, "c"),
	})
	if err != nil {
		return res, err
	}
	// podgate watches this cluster's plugin registry, not the host's /var/lib/kubelet.
	pgConfig := filepath.Join(work, "config.yaml")
	err = os.WriteFile(pgConfig, fmt.Appendf(nil, "apiVersion: podgate.dev/v1alpha1\nkind: AgentConfiguration\ndra:\n  pluginRegistryDir: %s\n", c.PluginRegistryDir()), 0o644)
	if err != nil {
		return res, err
	}
	pg, err = harness.Start(ctx, bin, harness.Options{
		Dir:             work,
		RuntimeEndpoint: r.Endpoint,
		Args:            []string{"--config", pgConfig, "--kubeconfig", c.Kubeconfig(), "--node-name", c.NodeName()},
	})
	if err != nil {
		return res, err
	}
	if want := "unix://" + filepath.Join(work, "cri.sock"); pg.Endpoint != want {
		return res, fmt.Errorf("podgate serves %s, the kubelet was configured with %s", pg.Endpoint, want)
	}
	if err := c.StartKubelet(ctx); err != nil {
		return res, err
	}
	if _, err := c.CreateNamespace(ctx, namespace); err != nil {
		return res, err
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	pods, err := watchPods(wctx, c.Client())
	if err != nil {
		return res, err
	}
	cri, err := rig.Dial(ctx, pg.Endpoint)
	if err != nil {
		return res, err
	}
	defer cri.Close(context.WithoutCancel(ctx))

	rec := newRecorder(pg, cfg.n)
	if err := rec.sample(ctx); err != nil { // the node with the kubelet up and no pod
		return res, err
	}
	lats, err := churn(wctx, cancel, cfg, rec, func(ctx context.Context, i int) (latency, error) {
		return podLifecycle(ctx, c.Client(), pods, cri, c.NodeName(), i)
	})
	if err != nil {
		return res, err
	}
	res.took, res.samples = time.Since(rec.start), rec.samples
	res.notes = append(res.notes, latencyNotes(lats, res.took)...)

	if n := pods.count(); n > 0 {
		res.left = append(res.left, fmt.Sprintf("%d pods in the API", n))
	}
	gcWait, left, err := waitKubeletClean(ctx, r, c)
	if err != nil {
		return res, err
	}
	res.left = append(res.left, left...)
	res.notes = append(res.notes, fmt.Sprintf("the kubelet had removed every sandbox, container, pod directory, log and cgroup of the soak's pods %s after the last pod was gone (its container garbage collection runs once a minute)", gcWait.Round(time.Second)))
	left, err = leftovers(ctx, pg, r, work)
	if err != nil {
		return res, err
	}
	res.left = append(res.left, left...)
	idle, err := measure(ctx, pg)
	if err != nil {
		return res, err
	}
	res.notes = append(res.notes, fmt.Sprintf("idle at the end (no pod, garbage collected): rss %.1f MiB, goroutines %.0f, fds %.0f", idle.rssMiB, idle.goroutines, idle.openFDs))
	return res, nil
}

// churn runs n lifecycles, parallel at once, and returns their latencies. The first error
// cancels the rest.
func churn(ctx context.Context, cancel context.CancelFunc, cfg config, rec *recorder, lifecycle func(context.Context, int) (latency, error)) ([]latency, error) {
	next := make(chan int)
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
		lats  []latency
	)
	for range cfg.parallel {
		wg.Go(func() {
			for i := range next {
				lat, err := lifecycle(ctx, i)
				if err == nil {
					err = rec.finished(ctx)
				}
				mu.Lock()
				if err != nil && first == nil {
					first = fmt.Errorf("lifecycle %d: %w", i, err)
					cancel()
				}
				lats = append(lats, lat)
				mu.Unlock()
			}
		})
	}
feed:
	for i := range cfg.n {
		select {
		case next <- i:
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	if first == nil && ctx.Err() != nil {
		first = ctx.Err()
	}
	return lats, first
}

// latencyNotes are the lifecycles' rate and latencies (median and 95th percentile).
func latencyNotes(lats []latency, took time.Duration) []string {
	pct := func(get func(latency) time.Duration) string {
		d := make([]time.Duration, 0, len(lats))
		for _, l := range lats {
			d = append(d, get(l))
		}
		slices.Sort(d)
		at := func(p float64) time.Duration { return d[min(len(d)-1, int(p*float64(len(d))))] }
		return fmt.Sprintf("median %s, p95 %s", at(0.5).Round(10*time.Millisecond), at(0.95).Round(10*time.Millisecond))
	}
	if len(lats) == 0 {
		return nil
	}
	return []string{
		fmt.Sprintf("rate: %.1f pods/min", float64(len(lats))/took.Minutes()),
		"create → Running: " + pct(func(l latency) time.Duration { return l.running }),
		"delete → gone from the API: " + pct(func(l latency) time.Duration { return l.gone }),
		"whole lifecycle: " + pct(func(l latency) time.Duration { return l.total }),
	}
}

// tail is the last n lines of a file.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	return lastLines(string(b), n)
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
