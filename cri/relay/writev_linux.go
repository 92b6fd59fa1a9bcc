//go:build linux && !race

package relay

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// writev writes what b has left with one writev(2) to fd, which does not block: it returns the
// bytes written, and EAGAIN when the socket takes none. iovs is the caller's to reuse.
func writev(fd uintptr, b *batch, iovs *[]unix.Iovec) (int, error) {
	v := (*iovs)[:0]
	for p := range b.pending {
		if len(p) == 0 {
			continue
		}
		var iov unix.Iovec
		iov.Base = &p[0]
		iov.SetLen(len(p))
		v = append(v, iov)
		if len(v) == 1024 { // IOV_MAX
			break
		}
	}
	*iovs = v
	if len(v) == 0 {
		return 0, nil
	}
	for {
		n, _, errno := unix.Syscall(unix.SYS_WRITEV, fd, uintptr(unsafe.Pointer(&v[0])), uintptr(len(v)))
		switch errno {
		case 0:
			clear(v) // no pointers into the batch's buffers outlive the write
			return int(n), nil
		case unix.EINTR:
			continue
		}
		clear(v)
		return 0, errno
	}
}
