package relay

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// peerCred is the pid and uid of the process at the other end of c, a unix socket's
// connection (SO_PEERCRED); -1 and -1 when c is not one or the kernel does not say.
func peerCred(c any) peer {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return peer{-1, -1}
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return peer{-1, -1}
	}
	p := peer{-1, -1}
	_ = raw.Control(func(fd uintptr) {
		if cred, err := unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED); err == nil {
			p = peer{int64(cred.Pid), int64(cred.Uid)}
		}
	})
	return p
}
