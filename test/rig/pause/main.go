// Command pause is the rig's sandbox ("pause") container: it holds the pod's namespaces, reaps
// orphans when it is PID 1 of a shared PID namespace, and exits when asked to stop.
//
// The real pause image cannot be pulled here (no registry is reachable), so the rig builds this
// static binary into its own image.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range sigs {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
