//go:build !linux

package dranode

import "os/exec"

// dieWithParent does nothing off Linux, which has no parent-death signal; the driver runs only
// on Linux anyway.
func dieWithParent(*exec.Cmd) {}
