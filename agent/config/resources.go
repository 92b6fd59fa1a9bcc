package config

import (
	"errors"
	"fmt"
	"time"

	"github.com/podgate/podgate/podresources/cgroup"
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
	// MemoryQoS sets memory.min (the container's memory request) and memory.high (below the
	// limit, by MemoryThrottlingFactor) in CreateContainer and UpdateContainerResources, as
	// the kubelet's MemoryQoS feature does. It needs cgroup v2 with the memory controller and
	// the Kubernetes API (the request comes from the pod); elsewhere it is "not applicable".
	MemoryQoS bool `json:"memoryQoS,omitempty"`
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
	if r.RecheckPeriod == nil {
		r.RecheckPeriod = &Duration{DefaultRecheckPeriod}
	}
}

func (r *Resources) validate() error {
	var errs []error
	if err := cgroup.ValidateThrottlingFactor(r.MemoryThrottlingFactor); err != nil {
		errs = append(errs, fmt.Errorf("resources.memoryThrottlingFactor: %w", err))
	}
	if r.RecheckPeriod != nil && r.RecheckPeriod.Duration < 0 {
		errs = append(errs, fmt.Errorf("resources.recheckPeriod: %s: must not be negative", r.RecheckPeriod))
	}
	if r.Verify != ResourcesVerifyWarn && r.Verify != ResourcesVerifyFail {
		errs = append(errs, fmt.Errorf("resources.verify: %q: want warn or fail", r.Verify))
	}
	return errors.Join(errs...)
}
