package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"

	"github.com/podgate/podgate/test/dradriver/driver"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stderr))
}

// options are the command line flags.
type options struct {
	driver.Config
	kubeconfig    string
	statusAddress string
}

func run(args []string, stderr io.Writer) int {
	opts, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, "dradriver:", err)
		return 2
	}
	defer klog.Flush()

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	ctx = klog.NewContext(ctx, klog.Background())
	opts.OnFatal = cancel

	if err := serve(ctx, cancel, opts); err != nil {
		klog.Background().Error(err, "dradriver failed")
		return 1
	}
	return 0
}

func parseFlags(args []string, stderr io.Writer) (*options, error) {
	fs := flag.NewFlagSet("dradriver", flag.ContinueOnError)
	fs.SetOutput(stderr)
	klog.InitFlags(fs)
	o := &options{}
	fs.StringVar(&o.DriverName, "driver-name", driver.DefaultDriverName, "DRA driver name")
	fs.StringVar(&o.NodeName, "node-name", "", "node name: the ResourceSlice's node and pool (required)")
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig file (empty: in-cluster configuration)")
	fs.StringVar(&o.RegistryDir, "registry-dir", kubeletplugin.KubeletRegistryDir, "the kubelet's plugin registration directory")
	fs.StringVar(&o.PluginDir, "plugin-dir", "", "directory for the DRA socket and state.json (default /var/lib/kubelet/plugins/<driver-name>)")
	fs.IntVar(&o.Devices, "devices", 4, "number of devices, nic0..nicN-1")
	fs.StringVar(&o.InterfacePrefix, "interface-prefix", driver.DefaultInterfacePrefix, "host interface names: <prefix>0, <prefix>1, ...; peers get a \"p\" suffix")
	fs.StringVar(&o.NetNSPath, "netns", "", "network namespace (path) to create the interfaces in (empty: the driver's own)")
	fs.StringVar(&o.CDIDir, "cdi-dir", "/var/run/cdi", "directory for per-claim CDI spec files (empty: no CDI specs and no CDI device IDs)")
	fs.StringVar(&o.EventsFile, "events-file", "", "JSON-lines file receiving one line per claim prepared or unprepared (empty: none)")
	fs.StringVar(&o.statusAddress, "status-address", "", "127.0.0.1:PORT serving the counters as JSON on GET /stats (empty: off; port 0 picks one, logged)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if o.NodeName == "" {
		return nil, errors.New("--node-name is required")
	}
	if o.PluginDir == "" {
		o.PluginDir = filepath.Join(kubeletplugin.KubeletPluginsDir, o.DriverName)
	}
	return o, nil
}

// serve runs the driver (and the status server) until ctx ends.
func serve(ctx context.Context, cancel context.CancelCauseFunc, opts *options) error {
	logger := klog.FromContext(ctx)
	client, err := kubeClient(opts.kubeconfig)
	if err != nil {
		return err
	}
	opts.KubeClient = client
	// Start returns once the ResourceSlice informer has synced: it waits for the API server.
	logger.Info("Starting DRA driver", "driver", opts.DriverName, "node", opts.NodeName)
	d, err := driver.Start(ctx, opts.Config)
	if err != nil {
		if ctx.Err() != nil {
			return stopped(ctx)
		}
		return err
	}
	defer d.Stop()
	logger.Info("DRA driver running", "driver", opts.DriverName, "node", opts.NodeName,
		"devices", opts.Devices, "registryDir", opts.RegistryDir, "pluginDir", opts.PluginDir)

	if opts.statusAddress != "" {
		srv, err := startStatusServer(ctx, cancel, opts.statusAddress, d)
		if err != nil {
			return err
		}
		defer func() {
			// A fresh context: ctx is already done, and shutdown must still get its time.
			sctx, scancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer scancel()
			if err := srv.Shutdown(sctx); err != nil {
				logger.Error(err, "Status server shutdown")
			}
		}()
	}

	<-ctx.Done()
	return stopped(ctx)
}

// stopped turns the end of ctx into serve's result: nil for a signal, the cause for a failure.
func stopped(ctx context.Context) error {
	cause := context.Cause(ctx)
	if !errors.Is(cause, context.Canceled) { // a signal's cause is Canceled too
		return cause
	}
	klog.FromContext(ctx).Info("DRA driver stopping", "cause", cause.Error())
	return nil
}

// startStatusServer serves the driver's counters on GET /stats. A failure of the server cancels
// ctx with the error, so the driver stops instead of running unobservable.
func startStatusServer(ctx context.Context, cancel context.CancelCauseFunc, addr string, d *driver.Driver) (*http.Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("status server: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/stats", d)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			cancel(fmt.Errorf("status server: %w", err))
		}
	}()
	klog.FromContext(ctx).Info("Serving status", "address", "http://"+ln.Addr().String()+"/stats")
	return srv, nil
}

func kubeClient(kubeconfig string) (kubernetes.Interface, error) {
	var cfg *rest.Config
	var err error
	if kubeconfig == "" {
		cfg, err = rest.InClusterConfig()
	} else {
		cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	}
	if err != nil {
		return nil, fmt.Errorf("kubernetes client configuration: %w", err)
	}
	return kubernetes.NewForConfig(cfg)
}
