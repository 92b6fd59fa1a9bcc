package sysctl

import "fmt"

// Target names the namespaces of one pod, as paths to namespace files (/proc/PID/ns/net,
// /run/netns/cni-..., a bind mount under containerd's state directory).
type Target struct {
	NetNS string
	IPCNS string
}

// ForPID is the target of the namespaces process pid is in (the pod's pause process).
func ForPID(pid int) Target {
	return Target{NetNS: fmt.Sprintf("/proc/%d/ns/net", pid), IPCNS: fmt.Sprintf("/proc/%d/ns/ipc", pid)}
}
