package config

import (
	"cmp"
	"errors"
	"fmt"
	"time"
)

// PodResources defaults.
const (
	DefaultPodResourcesSocket  = "/var/lib/kubelet/pod-resources/podgate.sock"
	DefaultKubeletPodResources = "/var/lib/kubelet/pod-resources/kubelet.sock"
	// DefaultPodResourcesQPS and DefaultPodResourcesBurst are DefaultPodResourcesQPS and
	// DefaultBurst, and DefaultPodResourcesKubeletQPS and DefaultPodResourcesKubeletBurst its
	// DefaultKubeletQPS and DefaultKubeletBurst: the file's defaults are config's own, so that
	// config imports no feature (agent's tests hold them equal).
	DefaultPodResourcesQPS          = 100
	DefaultPodResourcesBurst        = 100
	DefaultPodResourcesKubeletQPS   = 50
	DefaultPodResourcesKubeletBurst = 5
	// DefaultPodResourcesMaxConnections, DefaultPodResourcesMaxStreams and
	// DefaultPodResourcesIdleTimeout are podresources' DefaultMaxConnections, DefaultMaxStreams
	// and DefaultIdleTimeout.
	DefaultPodResourcesMaxConnections = 64
	DefaultPodResourcesMaxStreams     = 16
	DefaultPodResourcesIdleTimeout    = 2 * time.Minute
	// DefaultPodResourcesMaxStreamsPerProcess, DefaultPodResourcesMaxWatches,
	// DefaultPodResourcesHeaderTimeout and DefaultPodResourcesWatchSendTimeout are
	// podresources' DefaultMaxStreamsPerProcess, DefaultMaxWatchers, DefaultHeaderTimeout and
	// DefaultWatchSendTimeout. The other per-process and per-user quotas default to shares of
	// the totals (PodResources.setDefaults).
	DefaultPodResourcesMaxStreamsPerProcess = 32
	DefaultPodResourcesMaxWatches           = 64
	DefaultPodResourcesHeaderTimeout        = 10 * time.Second
	DefaultPodResourcesWatchSendTimeout     = 30 * time.Second
)

// PodResources is the podResources section: podgate's PodResources gRPC socket (the kubelet's
// v1.PodResourcesLister and podgate's extension), read by meta-CNI plugins and grpcurl.
type PodResources struct {
	// Socket is the unix socket podgate serves PodResources on; "" turns the service off.
	// Unset means /var/lib/kubelet/pod-resources/podgate.sock, beside the kubelet's.
	Socket *string `json:"socket,omitempty"`
	// SocketGroup is the group (name or id) that owns the socket, which has mode 0660; empty
	// keeps root's group.
	SocketGroup string `json:"socketGroup,omitempty"`
	// KubeletSocket is the kubelet's own PodResources socket, whose devices, CPUs and memory
	// podgate merges into its answers; "" turns the merge off. Unset means
	// /var/lib/kubelet/pod-resources/kubelet.sock.
	KubeletSocket *string `json:"kubeletSocket,omitempty"`
	// QPS and Burst are the rate limit of each client of podgate's socket (a token bucket per
	// process, told by the socket's peer credentials), counted as a call's stream opens: 100
	// calls per second, as the kubelet's, with a burst of 100 by default, so that the pods of a
	// drained node may all start at once. A call over it is ResourceExhausted.
	QPS   float64 `json:"qps,omitempty"`
	Burst int     `json:"burst,omitempty"`
	// KubeletQPS and KubeletBurst are podgate's own token bucket for its calls to the
	// kubelet's socket, which refuses calls over its own (100 QPS, burst 10, shared by every
	// client). 50 and 5 by default: half, which the kubelet never refuses however podgate's
	// calls bunch, and the other half for other clients.
	KubeletQPS   float64 `json:"kubeletQPS,omitempty"`
	KubeletBurst int     `json:"kubeletBurst,omitempty"`
	// MaxConnections bounds the socket's open connections: one over it is closed at once.
	// A meta-CNI plugin opens one per CNI ADD and closes it.
	MaxConnections int `json:"maxConnections,omitempty"`
	// MaxStreams bounds the calls open at once on one connection.
	MaxStreams int `json:"maxStreams,omitempty"`
	// IdleTimeout closes a connection that has had no call open for that long.
	IdleTimeout Duration `json:"idleTimeout,omitzero"`
	// MaxConnectionsPerProcess and MaxConnectionsPerUser bound the connections one process,
	// and the processes of one user together, hold of maxConnections: a quarter and three
	// quarters of it by default, so that a process at its quota leaves three quarters to the
	// others, and a user at its quota a quarter to other users.
	MaxConnectionsPerProcess int `json:"maxConnectionsPerProcess,omitempty"`
	MaxConnectionsPerUser    int `json:"maxConnectionsPerUser,omitempty"`
	// MaxStreamsPerProcess and MaxStreamsPerUser bound the calls one process, and one user's
	// processes, have open at once over all their connections: 32 and three times the
	// process's by default.
	MaxStreamsPerProcess int `json:"maxStreamsPerProcess,omitempty"`
	MaxStreamsPerUser    int `json:"maxStreamsPerUser,omitempty"`
	// MaxWatchesPerProcess and MaxWatchesPerUser bound the watches one process, and one user's
	// processes, run of the socket's 64: 16 and 48 by default.
	MaxWatchesPerProcess int `json:"maxWatchesPerProcess,omitempty"`
	MaxWatchesPerUser    int `json:"maxWatchesPerUser,omitempty"`
	// QPSPerUser and BurstPerUser are each user's token bucket, which the calls of all its
	// processes take from beside their own, so that forking does not multiply the rate:
	// twice qps and burst by default, so that one process takes at most half of it.
	QPSPerUser   float64 `json:"qpsPerUser,omitempty"`
	BurstPerUser int     `json:"burstPerUser,omitempty"`
	// HeaderTimeout closes a connection that has not opened a call that long after it was
	// accepted (half-open).
	HeaderTimeout Duration `json:"headerTimeout,omitzero"`
	// WatchSendTimeout ends a watch whose client read nothing for that long.
	WatchSendTimeout Duration `json:"watchSendTimeout,omitzero"`
}

func (p *PodResources) setDefaults() {
	if p.Socket == nil {
		s := DefaultPodResourcesSocket
		p.Socket = &s
	}
	if p.KubeletSocket == nil {
		s := DefaultKubeletPodResources
		p.KubeletSocket = &s
	}
	p.QPS = cmp.Or(p.QPS, DefaultPodResourcesQPS)
	p.Burst = cmp.Or(p.Burst, DefaultPodResourcesBurst)
	p.KubeletQPS = cmp.Or(p.KubeletQPS, DefaultPodResourcesKubeletQPS)
	p.KubeletBurst = cmp.Or(p.KubeletBurst, DefaultPodResourcesKubeletBurst)
	p.MaxConnections = cmp.Or(p.MaxConnections, DefaultPodResourcesMaxConnections)
	p.MaxStreams = cmp.Or(p.MaxStreams, DefaultPodResourcesMaxStreams)
	p.IdleTimeout.Duration = cmp.Or(p.IdleTimeout.Duration, DefaultPodResourcesIdleTimeout)
	p.MaxConnectionsPerProcess = cmp.Or(p.MaxConnectionsPerProcess, max(1, p.MaxConnections/4))
	p.MaxConnectionsPerUser = cmp.Or(p.MaxConnectionsPerUser, max(p.MaxConnectionsPerProcess, p.MaxConnections*3/4))
	p.MaxStreamsPerProcess = cmp.Or(p.MaxStreamsPerProcess, DefaultPodResourcesMaxStreamsPerProcess)
	p.MaxStreamsPerUser = cmp.Or(p.MaxStreamsPerUser, 3*p.MaxStreamsPerProcess)
	p.MaxWatchesPerProcess = cmp.Or(p.MaxWatchesPerProcess, DefaultPodResourcesMaxWatches/4)
	p.MaxWatchesPerUser = cmp.Or(p.MaxWatchesPerUser, max(p.MaxWatchesPerProcess, DefaultPodResourcesMaxWatches*3/4))
	p.QPSPerUser = cmp.Or(p.QPSPerUser, 2*p.QPS)
	p.BurstPerUser = cmp.Or(p.BurstPerUser, 2*p.Burst)
	p.HeaderTimeout.Duration = cmp.Or(p.HeaderTimeout.Duration, DefaultPodResourcesHeaderTimeout)
	p.WatchSendTimeout.Duration = cmp.Or(p.WatchSendTimeout.Duration, DefaultPodResourcesWatchSendTimeout)
}

// Enabled reports whether podgate serves PodResources.
func (p *PodResources) Enabled() bool { return p.Socket != nil && *p.Socket != "" }

func (p *PodResources) validate(criSocket string) error {
	var errs []error
	if p.Enabled() {
		if err := validSocket(*p.Socket); err != nil {
			errs = append(errs, fmt.Errorf("podResources.socket: %w", err))
		} else if *p.Socket == criSocket {
			errs = append(errs, fmt.Errorf("podResources.socket: %q is also the criSocket", *p.Socket))
		}
	}
	if p.KubeletSocket != nil && *p.KubeletSocket != "" {
		if err := validSocket(*p.KubeletSocket); err != nil {
			errs = append(errs, fmt.Errorf("podResources.kubeletSocket: %w", err))
		} else if p.Enabled() && *p.KubeletSocket == *p.Socket {
			errs = append(errs, fmt.Errorf("podResources.kubeletSocket: %q is podgate's own podResources.socket: podgate would ask itself", *p.KubeletSocket))
		}
	}
	if p.QPS < 0 {
		errs = append(errs, fmt.Errorf("podResources.qps: %v: must be positive", p.QPS))
	}
	if p.Burst < 0 {
		errs = append(errs, fmt.Errorf("podResources.burst: %d: must be positive", p.Burst))
	}
	if p.KubeletQPS < 0 {
		errs = append(errs, fmt.Errorf("podResources.kubeletQPS: %v: must be positive", p.KubeletQPS))
	}
	if p.KubeletBurst < 0 {
		errs = append(errs, fmt.Errorf("podResources.kubeletBurst: %d: must be positive", p.KubeletBurst))
	}
	if p.MaxConnections < 0 {
		errs = append(errs, fmt.Errorf("podResources.maxConnections: %d: must be positive", p.MaxConnections))
	}
	if p.MaxStreams < 0 {
		errs = append(errs, fmt.Errorf("podResources.maxStreams: %d: must be positive", p.MaxStreams))
	}
	if p.IdleTimeout.Duration < time.Second {
		errs = append(errs, fmt.Errorf("podResources.idleTimeout: %v: must be at least 1s", p.IdleTimeout.Duration))
	}
	return errors.Join(append(errs, p.validateQuotas()...)...)
}

// validateQuotas checks the per-process and per-user quotas: positive, a process's within its
// user's, a user's within the socket's total.
func (p *PodResources) validateQuotas() []error {
	var errs []error
	for _, q := range []struct {
		name                 string
		process, user, total int
	}{
		{"maxConnections", p.MaxConnectionsPerProcess, p.MaxConnectionsPerUser, p.MaxConnections},
		{"maxStreams", p.MaxStreamsPerProcess, p.MaxStreamsPerUser, 0},
		{"maxWatches", p.MaxWatchesPerProcess, p.MaxWatchesPerUser, DefaultPodResourcesMaxWatches},
	} {
		switch {
		case q.process < 0:
			errs = append(errs, fmt.Errorf("podResources.%sPerProcess: %d: must be positive", q.name, q.process))
		case q.user < 0:
			errs = append(errs, fmt.Errorf("podResources.%sPerUser: %d: must be positive", q.name, q.user))
		case q.process > q.user:
			errs = append(errs, fmt.Errorf("podResources.%sPerProcess: %d: must be at most %sPerUser (%d)", q.name, q.process, q.name, q.user))
		case q.total > 0 && q.user > q.total:
			errs = append(errs, fmt.Errorf("podResources.%sPerUser: %d: must be at most the socket's %d", q.name, q.user, q.total))
		}
	}
	if p.QPSPerUser < p.QPS {
		errs = append(errs, fmt.Errorf("podResources.qpsPerUser: %v: must be at least qps (%v)", p.QPSPerUser, p.QPS))
	}
	if p.BurstPerUser < p.Burst {
		errs = append(errs, fmt.Errorf("podResources.burstPerUser: %d: must be at least burst (%d)", p.BurstPerUser, p.Burst))
	}
	if p.HeaderTimeout.Duration < time.Second {
		errs = append(errs, fmt.Errorf("podResources.headerTimeout: %v: must be at least 1s", p.HeaderTimeout.Duration))
	}
	if p.WatchSendTimeout.Duration < time.Second {
		errs = append(errs, fmt.Errorf("podResources.watchSendTimeout: %v: must be at least 1s", p.WatchSendTimeout.Duration))
	}
	return errs
}
