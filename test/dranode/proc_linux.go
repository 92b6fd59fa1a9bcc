package dranode

import (
	"os/exec"
	"syscall"
)

// dieWithParent has the kernel kill the driver when the process that started it dies, so that a
// test binary's panic or a demo killed by a signal leaves no driver behind.
func dieWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
