package driver

import (
	"net"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// connCaller reads the peer credentials (SO_PEERCRED) of a unix socket connection. They are
// those of the process that connected, which is what the tests want to know.
func connCaller(conn net.Conn) Caller {
	uc, ok := conn.(*net.UnixConn)
	if !ok {
		return Caller{}
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return Caller{}
	}
	var cred *unix.Ucred
	var credErr error
	if err := raw.Control(func(fd uintptr) {
		cred, credErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil || credErr != nil {
		return Caller{}
	}
	c := Caller{PID: cred.Pid}
	if comm, err := os.ReadFile("/proc/" + strconv.Itoa(int(cred.Pid)) + "/comm"); err == nil {
		c.Comm = strings.TrimSpace(string(comm))
	}
	return c
}
