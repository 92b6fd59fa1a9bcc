// Command podgate is the podgate node agent: a CRI proxy between the kubelet and containerd.
//
//	podgate [--config FILE] [--cri-socket PATH] [--runtime-endpoint EP] [--image-endpoint EP]
//	        [--metrics-address ADDR] [--state-dir DIR] [--kubeconfig FILE] [--node-name NAME]
//	        [--log-format text|json] [-v N]
//	podgate version           (also: podgate --version): version, commit, Go version
//	podgate check-config FILE
//	podgate config defaults   (the default configuration file)
//	podgate completion bash|zsh|fish|powershell
//	podgate help [COMMAND]
//
// Exit status: 0 success or help; 2 usage error or invalid configuration; 1 runtime failure
// (check-config: 1 when the file is invalid).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"

	"github.com/go-logr/logr"
	"github.com/spf13/cobra"
	"k8s.io/klog/v2"

	"github.com/podgate/podgate/agent"
	"github.com/podgate/podgate/agent/config"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	return execute(newCommand(stdout, stderr, func(cfg *config.Configuration) error {
		return serve(cfg, stderr)
	}), args, stderr)
}

// exitError ends podgate with its own exit status; a failure without one is a usage error (2).
// A nil err means the failure has already been reported.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit status %d", e.code)
	}
	return e.err.Error()
}

func (e *exitError) Unwrap() error { return e.err }

// execute runs the command line and turns its outcome into podgate's exit status.
func execute(root *cobra.Command, args []string, stderr io.Writer) int {
	if args == nil {
		args = []string{} // cobra reads os.Args when given nil
	}
	root.SetArgs(args)
	cmd, err := root.ExecuteC()
	if err == nil {
		return 0
	}
	var exit *exitError
	if errors.As(err, &exit) {
		if exit.err != nil {
			fmt.Fprintln(stderr, "podgate:", exit.err)
		}
		return exit.code
	}
	// Unknown commands and flags, missing or extra arguments: cobra and pflag say which.
	fmt.Fprintf(stderr, "podgate: %v\nRun '%s --help' for usage.\n", err, cmd.CommandPath())
	return 2
}

// serve runs the agent until SIGTERM or SIGINT.
func serve(cfg *config.Configuration, stderr io.Writer) error {
	if err := setupLogging(cfg.Logging, stderr); err != nil {
		return &exitError{code: 2, err: err}
	}
	defer klog.Flush()

	if percent, ok := gcPercent(os.LookupEnv); ok {
		debug.SetGCPercent(percent)
	}
	setMemoryLimit(cfg, os.LookupEnv)

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	ctx = klog.NewContext(ctx, klog.Background())
	a := agent.New(cfg, binaryVersion())
	go releaseAfterStartup(ctx, a.Rebuilt())
	if err := a.Run(ctx); err != nil {
		klog.Background().Error(err, "podgate failed")
		return &exitError{code: 1}
	}
	return nil
}

// releaseAfterStartup gives back the binary's start-up pages once start-up is done (see
// releaseStartupPages), and logs how much of the binary stayed resident.
func releaseAfterStartup(ctx context.Context, started <-chan struct{}) {
	select {
	case <-started:
	case <-ctx.Done():
		return
	}
	logger := klog.FromContext(ctx)
	before, after, err := releaseStartupPages()
	if err != nil {
		logger.Error(err, "Could not give back the binary's start-up pages")
		return
	}
	logger.V(2).Info("Gave back the binary's start-up pages", "residentBeforeKiB", before, "residentAfterKiB", after)
}

// defaultGCPercent is podgate's GOGC unless the environment sets one. podgate's live heap is
// small (≈ 6 MiB with 110 running pods, most of it what package initialisation leaves); at Go's
// default of 100 the heap grows to twice that between collections, and that garbage is resident
// memory on every node: ≈ 3 MiB of RSS with 110 pods, for collections twice as frequent (see
// BENCHMARKS.md, "podgate's memory with 110 running pods").
const defaultGCPercent = 50

// gcPercent is the GOGC podgate sets at start: defaultGCPercent when the environment has no
// GOGC. When GOGC is set (GOGC=100 restores Go's default, GOGC=off turns the collector off), the
// Go runtime has read it already and podgate leaves it alone.
func gcPercent(lookupEnv func(string) (string, bool)) (int, bool) {
	if _, set := lookupEnv("GOGC"); set {
		return 0, false
	}
	return defaultGCPercent, true
}

// setupLogging configures klog: its own text format, or JSON lines through log/slog.
func setupLogging(l config.Logging, stderr io.Writer) error {
	fs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(fs)
	if err := fs.Set("v", fmt.Sprint(l.Verbosity)); err != nil {
		return err
	}
	// text is klog's own format on stderr, its default.
	if l.Format == "json" {
		h := slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: slog.Level(-l.Verbosity)})
		klog.SetLogger(logr.FromSlogHandler(h))
	}
	return nil
}
