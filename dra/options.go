package dra

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// DefaultPluginRegistryDir is where the kubelet, and so every DRA driver, keeps plugin
// registration sockets (the kubelet's plugins_registry under its root directory).
const DefaultPluginRegistryDir = "/var/lib/kubelet/plugins_registry"

// DefaultCallTimeout bounds one NodePrepareResources or NodeUnprepareResources call. It is the
// kubelet's own (defaultClientCallTimeout in pkg/kubelet/cm/dra/plugin: half the kubelet's retry
// period), so that a driver that is fast enough for the kubelet is fast enough for podgate.
const DefaultCallTimeout = 45 * time.Second

// DefaultGetInfoTimeout bounds one look at a registration socket: connecting and the GetInfo
// answer. The kubelet allows 10 s to connect and 1 s for GetInfo when it registers a plugin, and
// 10 s for GetInfo when it checks a registered one; a registration server answers from memory,
// so a socket that has not answered in 10 s is not going to.
const DefaultGetInfoTimeout = 10 * time.Second

// The backoff between looks at a registration socket that did not answer: the kubelet's plugin
// manager retries a failed registration with the same exponential backoff (goroutinemap).
const (
	defaultRetryInitial = 500 * time.Millisecond
	defaultRetryMax     = 2 * time.Minute
)

// Option configures [Drivers].
type Option func(*Drivers)

// WithPluginRegistryDir sets the directory watched for registration sockets (config
// dra.pluginRegistryDir); the default is [DefaultPluginRegistryDir]. It is created if missing,
// as the kubelet does.
func WithPluginRegistryDir(dir string) Option {
	return func(d *Drivers) { d.dir = dir }
}

// WithCallTimeout sets the timeout of each NodePrepareResources and NodeUnprepareResources call
// (config dra.callTimeout); the default is [DefaultCallTimeout]. Zero or less keeps the default.
func WithCallTimeout(timeout time.Duration) Option {
	return func(d *Drivers) {
		if timeout > 0 {
			d.callTimeout = timeout
		}
	}
}

// WithGetInfoTimeout sets how long one look at a registration socket may take, connecting
// included; the default is [DefaultGetInfoTimeout]. Zero or less keeps the default.
func WithGetInfoTimeout(timeout time.Duration) Option {
	return func(d *Drivers) {
		if timeout > 0 {
			d.getInfoTimeout = timeout
		}
	}
}

// WithRetryBackoff sets the wait before asking a registration socket that did not answer again:
// initial after the first failure, doubling after each further one up to max. The defaults are
// 500 ms and 2 min. Values of zero or less keep the defaults.
func WithRetryBackoff(initial, maximum time.Duration) Option {
	return func(d *Drivers) {
		if initial > 0 {
			d.retryInitial = initial
		}
		if maximum > 0 {
			d.retryMax = maximum
		}
	}
}

// WithDriverNames limits the drivers podgate uses to names (config dra.drivers); registrations
// of other drivers are ignored. No names, the default, means every DRA driver on the node.
func WithDriverNames(names ...string) Option {
	return func(d *Drivers) {
		if len(names) == 0 {
			d.allowed = nil
			return
		}
		d.allowed = make(map[string]bool, len(names))
		for _, n := range names {
			d.allowed[n] = true
		}
	}
}

// WithRegisterer registers the package's metrics with reg: podgate_dra_drivers,
// podgate_dra_driver_discovery_errors_total, podgate_dra_operations_total and
// podgate_dra_operation_duration_seconds. Without it the metrics are kept but not exported.
func WithRegisterer(reg prometheus.Registerer) Option {
	return func(d *Drivers) { d.registerer = reg }
}
