package podresources

import (
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// readPeer reads the credentials of a unix socket's client (SO_PEERCRED); pid 0 when c is no
// socket or they cannot be read.
func readPeer(c net.Conn) peerID {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return peerID{}
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return peerID{}
	}
	var cred *unix.Ucred
	ctlErr := raw.Control(func(fd uintptr) {
		cred, err = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	})
	if ctlErr != nil || err != nil {
		return peerID{}
	}
	return peerID{pid: cred.Pid, uid: cred.Uid}
}
