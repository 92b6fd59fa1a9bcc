package main

import (
	"fmt"
	"io"

	"github.com/podgate/podgate/agent"
	"github.com/podgate/podgate/agent/config"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"sigs.k8s.io/yaml"
)

// newCommand builds podgate's command line, in the Kubernetes components' style (cobra + pflag):
// the root command runs the agent through serve; version, check-config, completion and help are
// subcommands.
func newCommand(stdout, stderr io.Writer, serve func(*config.Configuration) error) *cobra.Command {
	var o options
	root := &cobra.Command{
		Use:   "podgate",
		Short: "podgate is a CRI proxy between the kubelet and containerd",
		Long: `podgate is a node agent that sits between the kubelet and containerd: the kubelet's
containerRuntimeEndpoint points at podgate's CRI socket, and podgate forwards every CRI call
to containerd, stepping in on a few (image pulls, pod sysctls, DRA devices).

Settings come from the configuration file (--config), then from the flags given on the
command line, which win over the file.`,
		Version: binaryVersion(),
		// No Args: cobra's default for a root command with subcommands rejects any positional
		// argument as an unknown command and suggests the nearest one.
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := o.configuration(cmd.Flags())
			if err != nil {
				return &exitError{code: 2, err: err}
			}
			return serve(cfg)
		},
		// execute reports errors once, with the exit status; a usage error does not dump the
		// whole help.
		SilenceErrors: true,
		SilenceUsage:  true,
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	// The template holds no action: it is the text of versionText.
	root.SetVersionTemplate(versionText())
	o.addFlags(root.Flags())
	root.AddCommand(newVersionCommand(), newCheckConfigCommand(), newConfigCommand(),
		newPodsCommand(), newPodCommand(), newPullsCommand())
	return root
}

func newVersionCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print podgate's version, commit and Go version (same as --version)",
		Args:  cobra.NoArgs,
		Run: func(cmd *cobra.Command, _ []string) {
			fmt.Fprint(cmd.OutOrStdout(), versionText())
		},
	}
}

func newCheckConfigCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "check-config FILE",
		Short: "Validate a configuration file and exit",
		Long: `Validate a configuration file (apiVersion podgate.dev/v1alpha1, kind AgentConfiguration)
and exit: 0 when it is valid, 1 when it is not, 2 on a usage error.

Beyond the file's syntax and values, it resolves what podgate resolves at start-up without
the running node: the criSocketGroup group, the kubeconfig file, the sysctl names on this
kernel, and the pod registry's checkpoint in stateDir. A valid file's report goes on with
what podgate would do beside this node's kubelet (resources.kubeletConfig): per feature the
kubelet may do part of (memory QoS, default sysctls, image pull caps), who does it and why,
one "kubelet:" line each.`,
		Example: "  podgate check-config /etc/podgate/config.yaml",
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return fmt.Errorf("want one FILE, got %d arguments\nusage: %s FILE", len(args), cmd.CommandPath())
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			return checkConfig(args[0], cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
}

func newConfigCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "config",
		Short: "Show podgate's configuration",
		Args:  cobra.NoArgs,
		// Without a subcommand, config only prints its help.
	}
	cmd.AddCommand(&cobra.Command{
		Use:   "defaults",
		Short: "Print the default configuration as YAML",
		Long: `Print the configuration podgate runs with when no file is given, as a configuration file
(YAML, generated from the code): a starting point for /etc/podgate/config.yaml.`,
		Example: "  podgate config defaults > /etc/podgate/config.yaml",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			out, err := defaultsYAML()
			if err != nil {
				return &exitError{code: 1, err: err}
			}
			_, err = cmd.OutOrStdout().Write(out)
			return err
		},
	})
	return cmd
}

// defaultsYAML is agent.DefaultConfiguration() as a configuration file.
func defaultsYAML() ([]byte, error) {
	out, err := yaml.Marshal(config.DefaultConfiguration())
	if err != nil {
		return nil, fmt.Errorf("marshal the default configuration: %w", err)
	}
	return out, nil
}

// checkConfig loads and checks file, reporting the verdict; an invalid file is exit status 1.
// It checks what start-up resolves without the running node (agent.Check), so that a
// file it calls ok does not stop podgate at start-up on a group, kubeconfig or checkpoint.
// A valid file's report goes on with what podgate would do beside the node's kubelet
// (agent.KubeletDecisions), one "kubelet: " line each.
func checkConfig(file string, stdout, stderr io.Writer) error {
	cfg, err := config.LoadFile(file)
	if err == nil {
		err = agent.Check(cfg)
	}
	if err != nil {
		fmt.Fprintf(stderr, "%s: invalid:\n%v\n", file, err)
		return &exitError{code: 1}
	}
	fmt.Fprintf(stdout, "%s: ok\n", file)
	// What podgate would do beside this node's kubelet: a valid file may still leave a
	// feature to the kubelet, or be held back by it.
	for _, line := range agent.KubeletDecisions(cfg) {
		fmt.Fprintf(stdout, "kubelet: %s\n", line)
	}
	return nil
}

// options holds the root command's flags; each overrides its configuration-file key.
type options struct {
	configFile      string
	criSocket       string
	runtimeEndpoint string
	imageEndpoint   string
	metricsAddress  string
	podResources    string
	stateDir        string
	kubeconfig      string
	nodeName        string
	logFormat       string
	verbosity       int
}

func (o *options) addFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.configFile, "config", "", "configuration file (apiVersion podgate.dev/v1alpha1, kind AgentConfiguration)")
	fs.StringVar(&o.criSocket, "cri-socket", config.DefaultCRISocket, "unix socket podgate serves CRI on")
	fs.StringVar(&o.runtimeEndpoint, "runtime-endpoint", config.DefaultRuntimeEndpoint, "backend runtime CRI endpoint (containerd)")
	fs.StringVar(&o.imageEndpoint, "image-endpoint", "", "backend image service endpoint (default: the runtime endpoint)")
	fs.StringVar(&o.metricsAddress, "metrics-address", config.DefaultMetricsAddress, `host:port for /metrics, /healthz, /readyz ("" or "0" disables)`)
	fs.StringVar(&o.podResources, "podresources-socket", config.DefaultPodResourcesSocket, `unix socket podgate serves PodResources on ("" disables)`)
	fs.StringVar(&o.stateDir, "state-dir", config.DefaultStateDir, "directory for podgate's state")
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig file for the Kubernetes API (empty: no API access)")
	fs.StringVar(&o.nodeName, "node-name", "", "this node's name in the Kubernetes API (default: the host name)")
	fs.StringVar(&o.logFormat, "log-format", "text", "log format: text or json")
	// -v N and --v N, as in the kubelet.
	fs.IntVarP(&o.verbosity, "v", "v", 0, "log verbosity")
}

// configuration reads the config file (if --config is given), then applies the flags that were
// set on the command line, which win over the file.
func (o *options) configuration(fs *pflag.FlagSet) (*config.Configuration, error) {
	cfg := config.DefaultConfiguration()
	if o.configFile != "" {
		var err error
		if cfg, err = config.LoadFile(o.configFile); err != nil {
			return nil, err
		}
	}
	fs.Visit(func(f *pflag.Flag) {
		switch f.Name {
		case "cri-socket":
			cfg.CRISocket = o.criSocket
		case "runtime-endpoint":
			cfg.RuntimeEndpoint = o.runtimeEndpoint
		case "image-endpoint":
			cfg.ImageEndpoint = o.imageEndpoint
		case "metrics-address":
			cfg.MetricsAddress = &o.metricsAddress
		case "podresources-socket":
			cfg.PodResources.Socket = &o.podResources
		case "state-dir":
			cfg.StateDir = o.stateDir
		case "kubeconfig":
			cfg.Kubeconfig = o.kubeconfig
		case "node-name":
			cfg.NodeName = o.nodeName
		case "log-format":
			cfg.Logging.Format = o.logFormat
		case "v":
			cfg.Logging.Verbosity = o.verbosity
		}
	})
	if err := agent.Validate(cfg); err != nil {
		return nil, fmt.Errorf("invalid configuration:\n%w", err)
	}
	return cfg, nil
}
