package cgroup

import (
	"errors"
	"fmt"
	"math"
)

// CPUSharesToWeight converts cgroup v1 CPU shares, which the CRI and the runtime spec carry,
// to the cgroup v2 cpu.weight runc writes for them: runc v1.5.2's
// libcontainer/specconv/spec_linux.go calls ConvertCPUSharesToCgroupV2Value of
// github.com/opencontainers/cgroups v0.1.0 (the version runc v1.5.2's go.mod requires;
// utils.go), copied here. It maps shares [2, 262144] onto weight [1, 10000] with a quadratic
// in log2(shares) that also maps the v1 default 1024 to the v2 default 100; 0 stays 0 (unset).
// runc has used it since v1.3.2 (cgroups v0.0.3 on); before, with cgroups v0.0.1, it was the
// linear 1+((shares-2)*9999)/262142, which gives 39 for 1024. containerd/cgroups/v3 v3.1.3's
// cgroup2.ConvertCPUSharesToCgroupV2Value is the same quadratic.
func CPUSharesToWeight(shares uint64) uint64 {
	if shares == 0 {
		return 0
	}
	if shares <= 2 {
		return 1
	}
	if shares >= 262144 {
		return 10000
	}
	l := math.Log2(float64(shares))
	// Quadratic function which fits min, max, and default.
	exponent := (l*l+125*l)/612.0 - 7.0/34.0
	return uint64(math.Ceil(math.Pow(10, exponent)))
}

// KubeletCPUSharesToWeight converts CPU shares to the cgroup v2 cpu.weight the kubelet writes
// into the cgroups it manages itself (pods, QoS classes): the kubelet's own linear conversion
// (pkg/kubelet/cm, CpuSharesToCpuWeight: 1+((shares-2)*9999)/262142), not runc's quadratic, so
// a pod's cpu.weight differs from what runc would write for its containers (307 shares: 12, runc
// 40), as kubelet 1.37.2 writes it on a cgroup v2 node with the systemd driver (test/vm). Shares
// are clamped to [2, 262144]; 0 stays 0 (unset).
func KubeletCPUSharesToWeight(shares uint64) uint64 {
	if shares == 0 {
		return 0
	}
	shares = min(max(shares, 2), 262144)
	return 1 + ((shares-2)*9999)/262142
}

// swapToV2 converts the runtime spec's memory.swap (memory+swap) to cgroup v2's
// memory.swap.max (swap alone), given the memory limit: runc's
// ConvertMemorySwapToCgroupV2Value (github.com/opencontainers/cgroups v0.1.0, utils.go),
// copied. -1 is unlimited ("max"); 0 is unset, unless memory is set and swap equals it (runc
// then writes "0": no swap).
func swapToV2(memorySwap, memory int64) (int64, error) {
	switch {
	case memory == -1 && memorySwap == 0:
		// For compatibility with cgroup1 controller, set swap to unlimited in
		// case the memory is set to unlimited and the swap is not explicitly set,
		// treating the request as "set both memory and swap to unlimited".
		return -1, nil
	case memorySwap == -1, memorySwap == 0:
		// Treat -1 ("max") and 0 ("unset") swap as is.
		return memorySwap, nil
	case memory == -1:
		// Unlimited memory, so treat swap as is.
		return memorySwap, nil
	case memory == 0:
		// Unset or unknown memory, can't calculate swap.
		return 0, errors.New("unable to set swap limit without memory limit")
	case memory < 0:
		// Does not make sense to subtract a negative value.
		return 0, fmt.Errorf("invalid memory value: %d", memory)
	case memorySwap < memory:
		// Sanity check.
		return 0, errors.New("memory+swap limit should be >= memory limit")
	}
	return memorySwap - memory, nil
}
