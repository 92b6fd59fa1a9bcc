package cgroup

import (
	"fmt"
	"maps"
	"math"
	"strconv"

	"github.com/containerd/errdefs"
	corev1 "k8s.io/api/core/v1"
	kubeletconfig "k8s.io/kubelet/config/v1beta1"
)

// The cgroup v2 files of memory QoS, keys of a CRI request's unified map.
const (
	// MemoryMinKey is memory.min: memory the kernel does not reclaim from the cgroup.
	MemoryMinKey = "memory.min"
	// MemoryLowKey is memory.low: memory the kernel reclaims from the cgroup only when no
	// unprotected memory is left to reclaim.
	MemoryLowKey = "memory.low"
	// MemoryHighKey is memory.high: above it the kernel throttles and reclaims.
	MemoryHighKey = "memory.high"
)

// ValidateThrottlingFactor checks a memory throttling factor, as the kubelet checks its
// memoryThrottlingFactor: it must be in (0, 1]. It is errdefs.ErrInvalidArgument otherwise.
func ValidateThrottlingFactor(f float64) error {
	if math.IsNaN(f) || f <= 0 || f > 1 {
		return fmt.Errorf("%w: memory throttling factor %v: want more than 0 and at most 1", errdefs.ErrInvalidArgument, f)
	}
	return nil
}

// ValidateReservationPolicy checks a memory reservation policy, as the kubelet checks its
// memoryReservationPolicy: "None", "TieredReservation", or "" (the kubelet's default, None).
// It is errdefs.ErrInvalidArgument otherwise.
func ValidateReservationPolicy(p kubeletconfig.MemoryReservationPolicy) error {
	switch p {
	case "", kubeletconfig.NoneMemoryReservationPolicy, kubeletconfig.TieredReservationMemoryReservationPolicy:
		return nil
	}
	return fmt.Errorf("%w: memory reservation policy %q: want %q or %q", errdefs.ErrInvalidArgument, p,
		kubeletconfig.NoneMemoryReservationPolicy, kubeletconfig.TieredReservationMemoryReservationPolicy)
}

// MemoryHigh is KEP-2570's memory.high of a container, in the kubelet's arithmetic (float64,
// the bytes rounded down, then down to a whole page):
//
//	floor(floor(request + (limit − request) × factor) / pageSize) × pageSize
//
// For a container without a memory limit, limit is the node's allocatable memory. The result
// is a multiple of pageSize; a pageSize below 1 counts as 1. MemoryHigh does not check its
// arguments, nor decide whether memory.high is written: [MemoryQoS] does.
func MemoryHigh(request, limit int64, factor float64, pageSize int64) int64 {
	pageSize = max(pageSize, 1)
	bytes := math.Floor(float64(request) + (float64(limit)-float64(request))*factor)
	return int64(bytes/float64(pageSize)) * pageSize
}

// MemoryQoSInput is what the kubelet's memory QoS of one container depends on.
type MemoryQoSInput struct {
	// Request is the container's memory request in bytes (resources.requests.memory), 0
	// without one.
	Request int64
	// Limit is the container's own memory limit in bytes (resources.limits.memory), 0 without
	// one. It is not always the CRI's memory_limit_in_bytes: with pod-level resources, a
	// container without a limit gets the pod's there, while memory QoS reads the container's.
	Limit int64
	// QOSClass is the pod's QoS class (pod.status.qosClass, as the kubelet reads it).
	QOSClass corev1.PodQOSClass
	// NodeAllocatable is the node's allocatable memory in bytes, the ceiling of a container
	// without a limit (see [NodeAllocatable]); 0 when unknown, and then such a container gets
	// no memory.high, as with the kubelet.
	NodeAllocatable int64
	// Factor is the memory throttling factor, in (0, 1]; the kubelet's default is 0.9.
	Factor float64
	// Policy is the memory reservation policy; "" is None, the kubelet's default.
	Policy kubeletconfig.MemoryReservationPolicy
	// PageSize is the node's page size in bytes (os.Getpagesize()).
	PageSize int64
}

// MemoryQoSValues are the memory QoS files of one container, as the kubelet writes them into
// the CRI request's unified map. A nil field is a file the kubelet does not write.
type MemoryQoSValues struct {
	// Min is memory.min.
	Min *int64
	// Low is memory.low.
	Low *int64
	// High is memory.high.
	High *int64
}

// MemoryQoS computes a container's memory QoS as the kubelet 1.36 does with its MemoryQoS
// feature gate on a cgroup v2 node (pkg/kubelet/kuberuntime, generateLinuxContainerResources):
//
//   - Protection. With policy TieredReservation and a request above 0: memory.min = the
//     request in a Guaranteed pod, memory.low = the request in any other; the other file is
//     not written. Otherwise (policy None, or no request): memory.min = 0 and memory.low = 0.
//   - Throttling. When the request differs from the limit: memory.high = [MemoryHigh] of the
//     request and the limit, or of the node's allocatable memory for a container without a
//     limit (none when that is unknown); written only when above 0 and above the request.
//     A container whose request equals its limit (Guaranteed, or no memory at all) gets none.
//
// MemoryQoS checks its input first: a factor outside (0, 1], an unknown policy, a negative amount, a
// limit below the request, or a page size below 1 is errdefs.ErrInvalidArgument.
func MemoryQoS(in MemoryQoSInput) (MemoryQoSValues, error) {
	if err := in.check(); err != nil {
		return MemoryQoSValues{}, err
	}
	var v MemoryQoSValues
	v.Min, v.Low = protection(in)
	v.High = throttling(in)
	return v, nil
}

// protection is the kubelet's memory.min and memory.low of a container.
func protection(in MemoryQoSInput) (lowest, low *int64) {
	if in.Request == 0 || in.Policy != kubeletconfig.TieredReservationMemoryReservationPolicy {
		// The kubelet writes both as 0: protection left by an earlier policy is cleared.
		return bytesPtr(0), bytesPtr(0)
	}
	if in.QOSClass == corev1.PodQOSGuaranteed {
		return bytesPtr(in.Request), nil
	}
	return nil, bytesPtr(in.Request)
}

// throttling is the kubelet's memory.high of a container; nil when it writes none.
func throttling(in MemoryQoSInput) *int64 {
	if in.Request == in.Limit {
		return nil
	}
	ceiling := in.Limit
	if ceiling == 0 {
		ceiling = in.NodeAllocatable
	}
	if ceiling <= 0 {
		return nil
	}
	high := MemoryHigh(in.Request, ceiling, in.Factor, in.PageSize)
	if high <= 0 || high <= in.Request {
		return nil
	}
	return &high
}

// check checks MemoryQoS's input.
func (in MemoryQoSInput) check() error {
	if err := ValidateThrottlingFactor(in.Factor); err != nil {
		return err
	}
	if err := ValidateReservationPolicy(in.Policy); err != nil {
		return err
	}
	switch {
	case in.Request < 0:
		return fmt.Errorf("%w: memory request %d is negative", errdefs.ErrInvalidArgument, in.Request)
	case in.Limit < 0:
		return fmt.Errorf("%w: memory limit %d is negative", errdefs.ErrInvalidArgument, in.Limit)
	case in.Limit != 0 && in.Limit < in.Request:
		return fmt.Errorf("%w: memory limit %d is below the request %d", errdefs.ErrInvalidArgument, in.Limit, in.Request)
	case in.NodeAllocatable < 0:
		return fmt.Errorf("%w: node allocatable memory %d is negative", errdefs.ErrInvalidArgument, in.NodeAllocatable)
	case in.PageSize < 1:
		return fmt.Errorf("%w: page size %d", errdefs.ErrInvalidArgument, in.PageSize)
	}
	return nil
}

// Unified is v as the kubelet writes it into a CRI request's unified map: decimal bytes.
func (v MemoryQoSValues) Unified() map[string]string {
	out := map[string]string{}
	for k, p := range map[string]*int64{MemoryMinKey: v.Min, MemoryLowKey: v.Low, MemoryHighKey: v.High} {
		if p != nil {
			out[k] = strconv.FormatInt(*p, 10)
		}
	}
	return out
}

// AddTo adds v to a CRI request's unified map, unless the kubelet did its own memory QoS: a
// kubelet 1.36 with the MemoryQoS feature gate writes memory.min, memory.low or both for
// every container, so either key in unified leaves it as it is. Otherwise v's keys replace
// those there (a kubelet 1.37 without the gate writes memory.high "max"). out is a new map
// when changed (unified itself is never modified), and unified otherwise.
func (v MemoryQoSValues) AddTo(unified map[string]string) (out map[string]string, changed bool) {
	_, hasMin := unified[MemoryMinKey]
	_, hasLow := unified[MemoryLowKey]
	add := v.Unified()
	if hasMin || hasLow || len(add) == 0 {
		return unified, false
	}
	out = make(map[string]string, len(unified)+len(add))
	maps.Copy(out, unified)
	maps.Copy(out, add)
	return out, true
}

// bytesPtr returns a pointer to n.
func bytesPtr(n int64) *int64 { return &n }
