// Command podgate is the podgate node agent: a CRI proxy between the kubelet and containerd.
//
//	podgate [--config FILE] [--cri-socket PATH] [--runtime-endpoint EP] [--image-endpoint EP]
//	        [--metrics-address ADDR] [--state-dir DIR] [--kubeconfig FILE] [--node-name NAME]
//	        [--log-format text|json] [-v N]
//	podgate version
//	podgate check-config FILE
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
	"syscall"

	"github.com/go-logr/logr"
	"k8s.io/klog/v2"

	"github.com/podgate/podgate/agent"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		switch args[0] {
		case "version":
			fmt.Fprintf(stdout, "podgate %s\n", version)
			return 0
		case "check-config":
			return checkConfig(args[1:], stdout, stderr)
		}
	}
	cfg, err := configure(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, "podgate:", err)
		return 2
	}
	if err := setupLogging(cfg.Logging, stderr); err != nil {
		fmt.Fprintln(stderr, "podgate:", err)
		return 2
	}
	defer klog.Flush()

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	ctx = klog.NewContext(ctx, klog.Background())
	if err := agent.New(cfg, version).Run(ctx); err != nil {
		klog.Background().Error(err, "podgate failed")
		return 1
	}
	return 0
}

// configure reads the config file (if --config is given), then applies the flags that were set
// on the command line, which win over the file.
func configure(args []string, stderr io.Writer) (*agent.Configuration, error) {
	fs := flag.NewFlagSet("podgate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		configFile      = fs.String("config", "", "configuration file (apiVersion podgate.dev/v1alpha1, kind AgentConfiguration)")
		criSocket       = fs.String("cri-socket", agent.DefaultCRISocket, "unix socket podgate serves CRI on")
		runtimeEndpoint = fs.String("runtime-endpoint", agent.DefaultRuntimeEndpoint, "backend runtime CRI endpoint (containerd)")
		imageEndpoint   = fs.String("image-endpoint", "", "backend image service endpoint (default: the runtime endpoint)")
		metricsAddress  = fs.String("metrics-address", agent.DefaultMetricsAddress, `host:port for /metrics, /healthz, /readyz ("" or "0" disables)`)
		stateDir        = fs.String("state-dir", agent.DefaultStateDir, "directory for podgate's state")
		kubeconfig      = fs.String("kubeconfig", "", "kubeconfig file for the Kubernetes API (empty: no API access)")
		nodeName        = fs.String("node-name", "", "this node's name in the Kubernetes API (default: the host name)")
		logFormat       = fs.String("log-format", "text", "log format: text or json")
		verbosity       = fs.Int("v", 0, "log verbosity")
	)
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q (commands: version, check-config FILE)", fs.Arg(0))
	}
	cfg := agent.DefaultConfiguration()
	if *configFile != "" {
		var err error
		if cfg, err = agent.LoadFile(*configFile); err != nil {
			return nil, err
		}
	}
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "cri-socket":
			cfg.CRISocket = *criSocket
		case "runtime-endpoint":
			cfg.RuntimeEndpoint = *runtimeEndpoint
		case "image-endpoint":
			cfg.ImageEndpoint = *imageEndpoint
		case "metrics-address":
			cfg.MetricsAddress = metricsAddress
		case "state-dir":
			cfg.StateDir = *stateDir
		case "kubeconfig":
			cfg.Kubeconfig = *kubeconfig
		case "node-name":
			cfg.NodeName = *nodeName
		case "log-format":
			cfg.Logging.Format = *logFormat
		case "v":
			cfg.Logging.Verbosity = *verbosity
		}
	})
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("invalid configuration:\n%w", err)
	}
	return cfg, nil
}

func checkConfig(args []string, stdout, stderr io.Writer) int {
	if len(args) != 1 {
		fmt.Fprintln(stderr, "usage: podgate check-config FILE")
		return 2
	}
	cfg, err := agent.LoadFile(args[0])
	if err == nil {
		err = cfg.Validate()
	}
	if err != nil {
		fmt.Fprintf(stderr, "%s: invalid:\n%v\n", args[0], err)
		return 1
	}
	fmt.Fprintf(stdout, "%s: ok\n", args[0])
	return 0
}

// setupLogging configures klog: its own text format, or JSON lines through log/slog.
func setupLogging(l agent.Logging, stderr io.Writer) error {
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
