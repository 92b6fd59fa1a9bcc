//go:build !linux

package main

import (
	"fmt"
	"os"
	"runtime"
)

// main says why there is no demo here: it runs a real containerd, runc and CNI (test/rig) and
// an API server (test/cluster, Linux only), in network namespaces.
func main() {
	fmt.Fprintf(os.Stderr, "demo: needs Linux (containerd, runc, CNI, network namespaces), this is %s\n", runtime.GOOS)
	os.Exit(1)
}
