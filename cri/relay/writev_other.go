//go:build !linux || race

package relay

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// writev writes what b has left to fd, which does not block, a buffer at a time, with
// syscall.Write: off Linux the relay only needs to build and run its tests, and under the race
// detector it needs the happens-before that syscall.Write and syscall.Read mark between what a
// socket carries (a raw writev(2) marks none, so a test that reads a handler's result after
// its answer arrived would be reported as a race).
func writev(fd uintptr, b *batch, _ *[]unix.Iovec) (int, error) {
	var total int
	for p := range b.pending {
		n, err := syscall.Write(int(fd), p)
		if n > 0 {
			total += n
		}
		if err != nil || n < len(p) {
			if total > 0 {
				return total, nil
			}
			return 0, err
		}
	}
	return total, nil
}
