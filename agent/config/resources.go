package config

import (
	"errors"
	"fmt"
	"path/filepath"
	"time"

	kubeletconfig "k8s.io/kubelet/config/v1beta1"
)

// Resources defaults.
const (
	// DefaultMemoryThrottlingFactor is the kubelet's (KEP-2570).
	DefaultMemoryThrottlingFactor = 0.9
	ResourcesVerifyWarn           = "warn"
	ResourcesVerifyFail           = "fail"
	DefaultRecheckPeriod          = time.Minute
)

// Resources is the resources section: memory QoS on cgroup v2 and the verification of what
// containers' cgroups hold.
type Resources struct {
	// MemoryQoS writes memory.min/memory.low and memory.high into CreateContainer and
	// UpdateContainerResources as the kubelet 1.36 does with its MemoryQoS feature gate
	// (pkg/kubelet/kuberuntime): protection by MemoryReservationPolicy, memory.high between the
	// request and the limit (or the node's allocatable memory) by MemoryThrottlingFactor. It
	// needs cgroup v2 with the memory controller and the Kubernetes API (the request and the QoS
	// class come from the pod); elsewhere it is "not applicable".
	MemoryQoS bool `json:"memoryQoS,omitempty"`
	// MemoryReservationPolicy is the kubelet's memoryReservationPolicy: None (default:
	// memory.min and memory.low are 0) or TieredReservation (memory.min = the request in a
	// Guaranteed pod, memory.low = the request in any other). Needs memoryQoS.
	MemoryReservationPolicy kubeletconfig.MemoryReservationPolicy `json:"memoryReservationPolicy,omitempty"`
	// KubeletConfig is the kubelet's configuration file (its --config), read for the node's
	// allocatable memory as the kubelet computes it (MemTotal less kubeReserved and
	// systemReserved), the ceiling of memory.high for a container without a limit. Empty: the
	// Node object's allocatable memory when podgate has the API, else MemTotal.
	KubeletConfig string `json:"kubeletConfig,omitempty"`
	// MemoryThrottlingFactor places memory.high between the request (0) and the limit (1);
	// in (0, 1], default 0.9.
	MemoryThrottlingFactor float64 `json:"memoryThrottlingFactor,omitempty"`
	// Verify is what a mismatch between a container's cgroup and what
	// UpdateContainerResources asked does: warn (a log line and a metric; default) or fail
	// (the call fails, so the kubelet retries it). After StartContainer it is always warn.
	Verify string `json:"verify,omitempty"`
	// RecheckPeriod is how often podgate reads every known container's cgroup again, to find
	// changes made behind the runtime's back; default 1m, "0s" turns it off.
	RecheckPeriod *Duration `json:"recheckPeriod,omitempty"`
}

func (r *Resources) setDefaults() {
	if r.MemoryThrottlingFactor == 0 {
		r.MemoryThrottlingFactor = DefaultMemoryThrottlingFactor
	}
	if r.Verify == "" {
		r.Verify = ResourcesVerifyWarn
	}
	if r.MemoryReservationPolicy == "" {
		r.MemoryReservationPolicy = kubeletconfig.NoneMemoryReservationPolicy
	}
	if r.RecheckPeriod == nil {
		r.RecheckPeriod = &Duration{DefaultRecheckPeriod}
	}
}

func (r *Resources) validate() error {
	var errs []error
	if r.RecheckPeriod != nil && r.RecheckPeriod.Duration < 0 {
		errs = append(errs, fmt.Errorf("resources.recheckPeriod: %s: must not be negative", r.RecheckPeriod))
	}
	// memoryThrottlingFactor and memoryReservationPolicy's values are the resources feature's
	// rules, checked by agent.Validate.
	if r.MemoryReservationPolicy == kubeletconfig.TieredReservationMemoryReservationPolicy && !r.MemoryQoS {
		errs = append(errs, fmt.Errorf("resources.memoryReservationPolicy: %s needs resources.memoryQoS: true", r.MemoryReservationPolicy))
	}
	if r.KubeletConfig != "" && !filepath.IsAbs(r.KubeletConfig) {
		errs = append(errs, fmt.Errorf("resources.kubeletConfig: %q: must be an absolute path", r.KubeletConfig))
	}
	if r.Verify != ResourcesVerifyWarn && r.Verify != ResourcesVerifyFail {
		errs = append(errs, fmt.Errorf("resources.verify: %q: want warn or fail", r.Verify))
	}
	return errors.Join(errs...)
}
