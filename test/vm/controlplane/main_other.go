//go:build !linux

package main

import (
	"fmt"
	"os"
	"runtime"
)

// main says why there is no control plane here: it runs test/cluster's etcd and
// kube-apiserver, which are Linux only, for a VM booted with qemu on Linux.
func main() {
	fmt.Fprintf(os.Stderr, "controlplane: the VM lane runs on Linux only, not %s\n", runtime.GOOS)
	os.Exit(2)
}
