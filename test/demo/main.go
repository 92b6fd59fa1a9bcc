//go:build linux

// Command demo shows what podgate does on a real node, one line per thing it does and why that
// matters: it starts a private containerd, an API server (etcd and kube-apiserver, no kubelet:
// the demo plays the kubelet with k8s.io/cri-client, the kubelet's own CRI client), the test DRA
// driver and two throttled local registries, puts podgate in front of containerd, and runs the
// steps of package tour: governed image pulls, two pods started as the kubelet starts them (one
// with a DRA network claim), a refused node-wide sysctl, PodResources as a meta-CNI plugin reads
// it, and a timeline picture of each pod start. Then it cleans up.
//
// Run it as root with `make demo`; -out names the directory for the picture and the logs.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"k8s.io/klog/v2"

	"github.com/podgate/podgate/test/demo/tour"
)

func main() {
	out := flag.String("out", "_output/demo", "directory for the timeline picture and the logs")
	flag.Parse()
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "demo: needs root (containerd, runc and CNI run for real): sudo make demo")
		os.Exit(1)
	}
	if err := runDemo(*out); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func runDemo(outDir string) error {
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return err
	}
	// The demo's own log (the rig's, the cluster's) goes to a file: the terminal is for the steps.
	logFile := filepath.Join(outDir, "demo.log")
	fs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(fs)
	for k, v := range map[string]string{"logtostderr": "false", "alsologtostderr": "false", "log_file": logFile, "v": "2"} {
		if err := fs.Set(k, v); err != nil {
			return err
		}
	}
	defer klog.Flush()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	// Output piped into a program that exits early (make demo | head) must not kill the demo
	// before it has cleaned up: writes to the closed pipe fail instead.
	signal.Ignore(syscall.SIGPIPE)
	return run(klog.NewContext(ctx, klog.Background()), os.Stdout, outDir)
}

func run(ctx context.Context, out io.Writer, outDir string) (err error) {
	start := time.Now()
	e, err := tour.Up(ctx, out, outDir)
	if err != nil {
		return err
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 3*time.Minute)
		defer cancel()
		err = errors.Join(err, e.Down(dctx))
		if err == nil {
			fmt.Fprintf(out, "\n==> Done in %s: containerd, the API server, the driver and podgate stopped; nothing left on the host.\n", time.Since(start).Round(time.Second))
		}
	}()
	if _, err := e.Pulls(ctx); err != nil {
		return err
	}
	if _, err := e.PlainPod(ctx); err != nil {
		return err
	}
	if _, err := e.DRAPod(ctx); err != nil {
		return err
	}
	if err := e.RefusedSysctl(ctx); err != nil {
		return err
	}
	if err := e.PodResources(ctx); err != nil {
		return err
	}
	if _, err := e.Timeline(); err != nil {
		return err
	}
	return e.Cleanup(ctx)
}
