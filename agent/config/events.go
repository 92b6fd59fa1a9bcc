package config

import (
	"errors"
	"fmt"
	"time"
)

// Events defaults.
const (
	// DefaultSandboxHeldAfter is how long a podgate stage holds a pod sandbox before the pod
	// gets an Event saying so.
	DefaultSandboxHeldAfter = 5 * time.Second
	// DefaultEventQPS and DefaultEventBurst are DefaultEventQPS and DefaultEventBurst,
	// config's own so that config imports no feature (agent's tests hold them equal).
	DefaultEventQPS   = 5
	DefaultEventBurst = 25
)

// Events is the events section: the pod Events podgate writes (events.k8s.io/v1) when it holds
// a pod back (a pull waiting or running long, a sandbox held or refused by a stage). Events need
// the Kubernetes API (kubeconfig); without it they are off.
type Events struct {
	// QPS and Burst are the node-wide rate of Event writes (a token bucket), like the
	// kubelet's eventRecordQPS and eventBurst. Default 5 and 25.
	QPS   float64 `json:"qps,omitempty"`
	Burst int     `json:"burst,omitempty"`
	// SandboxHeldAfter is how long a podgate stage (DRA prepare, sysctl verification) holds a
	// pod sandbox before the pod gets an Event naming the stage. Default 5s.
	SandboxHeldAfter Duration `json:"sandboxHeldAfter,omitzero"`
}

func (e *Events) setDefaults() {
	if e.QPS == 0 {
		e.QPS = DefaultEventQPS
	}
	if e.Burst == 0 {
		e.Burst = DefaultEventBurst
	}
	if e.SandboxHeldAfter.Duration == 0 {
		e.SandboxHeldAfter.Duration = DefaultSandboxHeldAfter
	}
}

func (e *Events) validate() error {
	var errs []error
	if e.QPS < 0 {
		errs = append(errs, fmt.Errorf("events.qps: %v: must be positive", e.QPS))
	}
	if e.Burst < 0 {
		errs = append(errs, fmt.Errorf("events.burst: %d: must be positive", e.Burst))
	}
	if e.SandboxHeldAfter.Duration < time.Second {
		errs = append(errs, fmt.Errorf("events.sandboxHeldAfter: %s: must be at least 1s", e.SandboxHeldAfter))
	}
	return errors.Join(errs...)
}
