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
	return errors.Join(errs...)
}
