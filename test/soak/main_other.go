//go:build !linux

package main

import (
	"fmt"
	"os"
	"runtime"
)

// main says why there is no soak here: it drives a real containerd, runc and CNI (test/rig) and,
// in kubelet mode, a kubelet (test/cluster, Linux only), in network namespaces and cgroups.
func main() {
	fmt.Fprintf(os.Stderr, "soak: needs Linux (containerd, runc, CNI, network namespaces), this is %s\n", runtime.GOOS)
	os.Exit(1)
}
