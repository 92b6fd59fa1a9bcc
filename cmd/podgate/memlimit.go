package main

import (
	"cmp"
	"runtime/debug"

	"k8s.io/klog/v2"

	"github.com/podgate/podgate/agent/config"
)

// What podgate needs beside what its clients' budgets let them make it hold, for its soft
// memory limit (memoryLimit).
const (
	// baseMemory is podgate's own: its live heap (≈ 6 MiB with 110 running pods) grown by
	// GOGC, goroutine stacks, the Go runtime's metadata, the Kubernetes client's caches of the
	// node's pods.
	baseMemory = 64 << 20
	// podResourcesConnMemory is what one connection of the PodResources socket may hold: grpc-go's
	// read and write buffers (32 KiB each), a request (at most 64 KiB) and its header list (at
	// most 64 KiB), with room to spare.
	podResourcesConnMemory = 256 << 10
)

// memoryLimit is the soft memory limit podgate sets at start (debug.SetMemoryLimit): what its
// limits let clients make it hold (criSocketLimits.totalBytes; podResources.maxConnections
// connections) and baseMemory. Without it the collector lets garbage grow with the heap (GOGC),
// and under a client that fills the budget podgate's RSS reached twice what the budget counts
// (240 MiB counted, 516 MB resident); with it the collector runs harder as the heap nears the
// budgets, and gives memory back to the system, so RSS stays near them. It is soft: it fails no
// allocation, and only makes the collector run more often when podgate needs more. When
// GOMEMLIMIT is set (an operator's choice, "off" included: math.MaxInt64), the Go runtime has
// read it already and podgate leaves it alone.
func memoryLimit(cfg *config.Configuration, lookupEnv func(string) (string, bool)) (int64, bool) {
	if _, set := lookupEnv("GOMEMLIMIT"); set {
		return 0, false
	}
	n := cmp.Or(cfg.CRISocketLimits.TotalBytes, config.DefaultCRITotalBytes) + baseMemory
	if cfg.PodResources.Enabled() {
		n += int64(cmp.Or(cfg.PodResources.MaxConnections, config.DefaultPodResourcesMaxConnections)) * podResourcesConnMemory
	}
	return n, true
}

// setMemoryLimit sets podgate's soft memory limit from cfg unless the environment set one, and
// logs the limit in force.
func setMemoryLimit(cfg *config.Configuration, lookupEnv func(string) (string, bool)) {
	logger := klog.Background()
	n, ok := memoryLimit(cfg, lookupEnv)
	if !ok {
		logger.Info("Memory limit", "bytes", debug.SetMemoryLimit(-1), "from", "GOMEMLIMIT")
		return
	}
	debug.SetMemoryLimit(n)
	logger.Info("Memory limit", "bytes", n, "MiB", n>>20, "from", "criSocketLimits.totalBytes, podResources.maxConnections and podgate's own")
}
