package cgroup

import (
	"fmt"
	"maps"
	"math"
	"strconv"

	"github.com/containerd/errdefs"
)

// The cgroup v2 files of memory QoS, keys of a CRI request's unified map.
const (
	// MemoryMinKey is memory.min: memory the kernel does not reclaim from the cgroup.
	MemoryMinKey = "memory.min"
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

// MemoryHigh is KEP-2570's memory.high of a container (the kubelet's since Kubernetes 1.27):
//
//	floor((request + factor × (limit − request)) / pageSize) × pageSize
//
// For a container without a memory limit, limit is the node's allocatable memory. The result
// is a multiple of pageSize; a pageSize below 1 counts as 1. MemoryHigh does not check its
// arguments: [ApplyMemoryQoS] does.
func MemoryHigh(request, limit int64, factor float64, pageSize int64) int64 {
	pageSize = max(pageSize, 1)
	high := math.Floor((float64(request) + factor*(float64(limit)-float64(request))) / float64(pageSize))
	return int64(high) * pageSize
}

// ApplyMemoryQoS adds memory QoS to a CRI request's unified map: "memory.min" = request and
// "memory.high" = [MemoryHigh], when 0 < request < limit and memory.high > request. A key
// already in the map stays as it is: the kubelet, with its own MemoryQoS feature, may have set
// it. out is a new map when changed (unified itself is never modified), and unified
// otherwise.
//
// limit is the container's memory limit in bytes. A container without one (0 in the CRI) is
// limited by the node: pass the node's allocatable memory, as the kubelet does; with 0, a
// request above 0 is an error.
//
// Arguments are checked first, whatever the map holds: a factor outside (0, 1], a negative
// request or limit, a limit below the request, or a pageSize below 1 is
// errdefs.ErrInvalidArgument, its message naming the value.
func ApplyMemoryQoS(unified map[string]string, request, limit int64, factor float64, pageSize int64) (out map[string]string, changed bool, err error) {
	if err := checkQoSArgs(request, limit, factor, pageSize); err != nil {
		return unified, false, err
	}
	if request == 0 || request == limit {
		// No request: nothing to protect. request == limit (Guaranteed): no room to throttle in.
		return unified, false, nil
	}
	high := MemoryHigh(request, limit, factor, pageSize)
	if high <= request {
		return unified, false, nil
	}
	add := map[string]string{}
	if _, ok := unified[MemoryMinKey]; !ok {
		add[MemoryMinKey] = strconv.FormatInt(request, 10)
	}
	if _, ok := unified[MemoryHighKey]; !ok {
		add[MemoryHighKey] = strconv.FormatInt(high, 10)
	}
	if len(add) == 0 {
		return unified, false, nil
	}
	out = make(map[string]string, len(unified)+len(add))
	maps.Copy(out, unified)
	maps.Copy(out, add)
	return out, true, nil
}

// checkQoSArgs checks ApplyMemoryQoS's arguments.
func checkQoSArgs(request, limit int64, factor float64, pageSize int64) error {
	if err := ValidateThrottlingFactor(factor); err != nil {
		return err
	}
	switch {
	case request < 0:
		return fmt.Errorf("%w: memory request %d is negative", errdefs.ErrInvalidArgument, request)
	case limit < 0:
		return fmt.Errorf("%w: memory limit %d is negative", errdefs.ErrInvalidArgument, limit)
	case limit < request:
		return fmt.Errorf("%w: memory limit %d is below the request %d (a container without a limit: pass the node's allocatable memory)", errdefs.ErrInvalidArgument, limit, request)
	case pageSize < 1:
		return fmt.Errorf("%w: page size %d", errdefs.ErrInvalidArgument, pageSize)
	}
	return nil
}
