package config

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/podgate/podgate/cri/endpoint"
)

// Config file identity.
const (
	APIVersion = "podgate.dev/v1alpha1"
	Kind       = "AgentConfiguration"
)

// Defaults for a standard node.
const (
	DefaultCRISocket       = "/run/podgate/cri.sock"
	DefaultRuntimeEndpoint = "unix:///run/containerd/containerd.sock"
	DefaultMetricsAddress  = "127.0.0.1:9743"
	DefaultStateDir        = "/var/lib/podgate"
	DefaultShutdownGrace   = 10 * time.Second
	// DefaultKubeAPIQPS and DefaultKubeAPIBurst are client-go's defaults: a pod start costs
	// podgate at most a GET of the pod the informer has not delivered and one per claim.
	DefaultKubeAPIQPS   = 5
	DefaultKubeAPIBurst = 10
	// DefaultKubeletPodsAPISocket is kube.DefaultKubeletPodsAPISocket, config's own (agent's
	// tests hold them equal): where the kubelet 1.37 serves its Pods API under its default
	// root dir, and the default of kubeletPodsAPISocket. Where nothing serves there (an older
	// kubelet, its gate off, another root dir), podgate uses the API server.
	DefaultKubeletPodsAPISocket = "/var/lib/kubelet/pods-api/pods-api.sock"
)

// Configuration is podgate's configuration file (apiVersion podgate.dev/v1alpha1, kind
// AgentConfiguration). Keys are lowerCamelCase like the kubelet's; see
// docs/configuration.md for the whole file as it grows.
type Configuration struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`

	// CRISocket is the unix socket podgate serves CRI on (the kubelet's
	// containerRuntimeEndpoint and imageServiceEndpoint).
	CRISocket string `json:"criSocket,omitempty"`
	// CRISocketGroup is the group (name or id) that owns the CRI socket, which has mode 0660.
	// Empty keeps root's group.
	CRISocketGroup string `json:"criSocketGroup,omitempty"`
	// CRISocketLimits bounds what a client of the CRI socket can make podgate hold, and for
	// how long.
	CRISocketLimits CRISocketLimits `json:"criSocketLimits,omitzero"`
	// RuntimeEndpoint is the backend runtime's CRI socket (containerd).
	RuntimeEndpoint string `json:"runtimeEndpoint,omitempty"`
	// ImageEndpoint is the backend for ImageService calls; empty means RuntimeEndpoint.
	ImageEndpoint string `json:"imageEndpoint,omitempty"`
	// MetricsAddress is the host:port of the /metrics, /healthz and /readyz listener; "" or
	// "0" disables it. Unset means 127.0.0.1:9743.
	MetricsAddress *string `json:"metricsAddress,omitempty"`
	// EnableProfilingHandler serves Go's profiles (net/http/pprof) under /debug/pprof/ on
	// metricsAddress, as the kubelet's enableProfilingHandler does. Off by default: a CPU
	// profile costs podgate CPU while it runs, and the pages show the process's internals.
	EnableProfilingHandler bool `json:"enableProfilingHandler,omitempty"`
	// StateDir holds podgate's on-disk state.
	StateDir string `json:"stateDir,omitempty"`
	// ShutdownGracePeriod is how long unary CRI calls in flight may finish after SIGTERM.
	ShutdownGracePeriod Duration `json:"shutdownGracePeriod,omitempty"`
	// Logging sets the log format and verbosity.
	Logging Logging `json:"logging,omitzero"`
	// Kubeconfig is the kubeconfig file for the Kubernetes API; empty turns off what needs the
	// API (pod deletion cancels pulls, pod priority from the API server).
	Kubeconfig string `json:"kubeconfig,omitempty"`
	// KubeAPIQPS and KubeAPIBurst limit podgate's requests to the API server (a token bucket),
	// as the kubelet's keys of the same names limit its own; defaults 5 and 10.
	KubeAPIQPS   *float32 `json:"kubeAPIQPS,omitempty"`
	KubeAPIBurst *int32   `json:"kubeAPIBurst,omitempty"`
	// NodeName is this node's name in the API (the pod informer's spec.nodeName); empty means
	// the host name.
	NodeName string `json:"nodeName,omitempty"`
	// KubeletPodsAPISocket is the kubelet's Pods API socket (kubelet 1.37, PodsAPI feature
	// gate). Where the kubelet serves it, podgate learns the node's pods there and asks the API
	// server for none; where it does not (an older kubelet), from the API server. "" always
	// uses the API server. The default is DefaultKubeletPodsAPISocket.
	KubeletPodsAPISocket *string `json:"kubeletPodsAPISocket,omitempty"`
	// ImagePulls governs PullImage: caps, priorities, de-duplication.
	ImagePulls ImagePulls `json:"imagePulls,omitzero"`
	// Sysctls is the pod and node sysctl policy.
	Sysctls Sysctls `json:"sysctls,omitzero"`
	// DRA prepares pods' DRA claims before their sandboxes are created.
	DRA DRA `json:"dra,omitzero"`
	// PodResources is podgate's PodResources gRPC service.
	PodResources PodResources `json:"podResources,omitzero"`
	// Resources is memory QoS and the verification of containers' cgroups.
	Resources Resources `json:"resources,omitzero"`
	// Events are the pod Events podgate writes; they need the Kubernetes API.
	Events Events `json:"events,omitzero"`
	// Tracing exports OpenTelemetry spans of podgate's work, as the kubelet's tracing does;
	// unset means off.
	Tracing *Tracing `json:"tracing,omitempty"`
}

// Logging configures klog.
type Logging struct {
	// Format is "text" (default) or "json".
	Format string `json:"format,omitempty"`
	// Verbosity is klog's -v level.
	Verbosity int `json:"verbosity,omitempty"`
}

// Duration is a time.Duration written as a Go duration string ("10s") in the file.
type Duration struct{ time.Duration }

// UnmarshalJSON reads a duration string.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("want a duration such as \"10s\": %w", err)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	d.Duration = v
	return nil
}

// MarshalJSON writes a duration string.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(d.String()) }

// DefaultConfiguration returns the configuration used when no file is given.
func DefaultConfiguration() *Configuration {
	c := &Configuration{APIVersion: APIVersion, Kind: Kind}
	c.SetDefaults()
	return c
}

// SetDefaults fills what the file left out.
func (c *Configuration) SetDefaults() {
	if c.CRISocket == "" {
		c.CRISocket = DefaultCRISocket
	}
	if c.RuntimeEndpoint == "" {
		c.RuntimeEndpoint = DefaultRuntimeEndpoint
	}
	if c.MetricsAddress == nil {
		addr := DefaultMetricsAddress
		c.MetricsAddress = &addr
	}
	if c.StateDir == "" {
		c.StateDir = DefaultStateDir
	}
	if c.ShutdownGracePeriod.Duration == 0 {
		c.ShutdownGracePeriod.Duration = DefaultShutdownGrace
	}
	if c.Logging.Format == "" {
		c.Logging.Format = "text"
	}
	if c.KubeAPIQPS == nil {
		q := float32(DefaultKubeAPIQPS)
		c.KubeAPIQPS = &q
	}
	if c.KubeAPIBurst == nil {
		b := int32(DefaultKubeAPIBurst)
		c.KubeAPIBurst = &b
	}
	if c.KubeletPodsAPISocket == nil {
		s := DefaultKubeletPodsAPISocket
		c.KubeletPodsAPISocket = &s
	}
	c.ImagePulls.setDefaults()
	c.Sysctls.setDefaults()
	c.DRA.setDefaults()
	c.PodResources.setDefaults()
	c.Resources.setDefaults()
	c.Events.setDefaults()
	if c.Tracing != nil {
		c.Tracing.setDefaults()
	}
}

// LoadFile reads, strictly decodes and defaults a configuration file. An unknown or misspelt key
// is an error that names it. The result is not validated yet: flags may still change it.
func LoadFile(path string) (*Configuration, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	c, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// Parse strictly decodes and defaults a configuration document. Like Kubernetes component configs,
// keys are case-sensitive and an unknown, misspelt or repeated key is an error; each decoding error
// names the key's path and line, such as `imagePulls.maxParalel: unknown field "maxParalel" (line 7)`.
func Parse(data []byte) (*Configuration, error) {
	c := &Configuration{}
	if err := decodeStrict(data, c); err != nil {
		return nil, err
	}
	if c.APIVersion != APIVersion || c.Kind != Kind {
		return nil, fmt.Errorf("apiVersion/kind: got %q/%q, want %s/%s", c.APIVersion, c.Kind, APIVersion, Kind)
	}
	c.SetDefaults()
	return c, nil
}

// MetricsEnabled reports whether the metrics and health listener is on.
func (c *Configuration) MetricsEnabled() bool {
	return c.MetricsAddress != nil && *c.MetricsAddress != "" && *c.MetricsAddress != "0"
}

// ImageBackend is the endpoint ImageService calls go to.
func (c *Configuration) ImageBackend() string {
	if c.ImageEndpoint != "" {
		return c.ImageEndpoint
	}
	return c.RuntimeEndpoint
}

// Validate reports every bad field the file alone can show (absolute paths, non-negative
// durations, enums, syntax), each named. The rules of a feature (sysctl names on this kernel,
// registry hosts, cgroup values) are the feature's: agent.Validate adds them.
func (c *Configuration) Validate() error {
	var errs []error
	field := func(name string, err error) {
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", name, err))
		}
	}
	field("criSocket", validSocket(c.CRISocket))
	_, err := endpoint.Parse(c.RuntimeEndpoint)
	field("runtimeEndpoint", err)
	if c.ImageEndpoint != "" {
		_, err := endpoint.Parse(c.ImageEndpoint)
		field("imageEndpoint", err)
	}
	for _, ep := range []struct{ name, value string }{{"runtimeEndpoint", c.RuntimeEndpoint}, {"imageEndpoint", c.ImageEndpoint}} {
		if p, err := endpoint.Parse(ep.value); err == nil && filepath.Clean(p) == filepath.Clean(c.CRISocket) {
			field(ep.name, fmt.Errorf("%q is podgate's own criSocket: podgate would forward to itself", ep.value))
		}
	}
	if c.MetricsEnabled() {
		field("metricsAddress", validHostPort(*c.MetricsAddress))
	} else if c.EnableProfilingHandler {
		field("enableProfilingHandler", errors.New("the profiling pages are served on metricsAddress, which is off"))
	}
	if !filepath.IsAbs(c.StateDir) {
		field("stateDir", fmt.Errorf("%q: want an absolute path", c.StateDir))
	}
	if c.ShutdownGracePeriod.Duration < 0 {
		field("shutdownGracePeriod", fmt.Errorf("%s: must not be negative", c.ShutdownGracePeriod))
	}
	if c.Logging.Format != "text" && c.Logging.Format != "json" {
		field("logging.format", fmt.Errorf("%q: want text or json", c.Logging.Format))
	}
	if c.Logging.Verbosity < 0 {
		field("logging.verbosity", fmt.Errorf("%d: must not be negative", c.Logging.Verbosity))
	}
	if err := c.CRISocketLimits.validate(); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(c.validateKube(), c.validateKubeAPILimits(), c.validatePodsAPISocket(), c.ImagePulls.validate()); err != nil {
		errs = append(errs, err)
	}
	if err := c.DRA.validate(); err != nil {
		errs = append(errs, err)
	}
	if err := c.Sysctls.validate(); err != nil {
		errs = append(errs, err)
	}
	if err := c.PodResources.validate(c.CRISocket); err != nil {
		errs = append(errs, err)
	}
	if err := c.Resources.validate(); err != nil {
		errs = append(errs, err)
	}
	if err := c.Events.validate(); err != nil {
		errs = append(errs, err)
	}
	if c.Tracing != nil {
		if err := c.Tracing.validate(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func validSocket(p string) error {
	if !filepath.IsAbs(p) {
		return fmt.Errorf("%q: want an absolute path", p)
	}
	if len(p) > 107 {
		return fmt.Errorf("%q: %d bytes, a unix socket path allows 107", p, len(p))
	}
	return nil
}

func validHostPort(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%q: want host:port (\"\" or \"0\" disables): %w", addr, err)
	}
	if port == "" {
		return fmt.Errorf("%q: missing port", addr)
	}
	if host != "" && net.ParseIP(host) == nil && host != "localhost" {
		return fmt.Errorf("%q: host must be an IP address or localhost", addr)
	}
	return nil
}

// validatePodsAPISocket checks kubeletPodsAPISocket: a socket path, and none of podgate's own.
func (c *Configuration) validatePodsAPISocket() error {
	if c.KubeletPodsAPISocket == nil || *c.KubeletPodsAPISocket == "" {
		return nil
	}
	p := *c.KubeletPodsAPISocket
	if err := validSocket(p); err != nil {
		return fmt.Errorf("kubeletPodsAPISocket: %w", err)
	}
	if filepath.Clean(p) == filepath.Clean(c.CRISocket) {
		return fmt.Errorf("kubeletPodsAPISocket: %q is podgate's own criSocket", p)
	}
	if c.PodResources.Enabled() && filepath.Clean(p) == filepath.Clean(*c.PodResources.Socket) {
		return fmt.Errorf("kubeletPodsAPISocket: %q is podgate's own podResources.socket", p)
	}
	return nil
}

// validateKubeAPILimits checks kubeAPIQPS and kubeAPIBurst.
func (c *Configuration) validateKubeAPILimits() error {
	var errs []error
	if c.KubeAPIQPS != nil && !(*c.KubeAPIQPS > 0) {
		errs = append(errs, fmt.Errorf("kubeAPIQPS: %v: must be above 0", *c.KubeAPIQPS))
	}
	if c.KubeAPIBurst != nil && *c.KubeAPIBurst < 1 {
		errs = append(errs, fmt.Errorf("kubeAPIBurst: %d: must be at least 1", *c.KubeAPIBurst))
	}
	return errors.Join(errs...)
}
