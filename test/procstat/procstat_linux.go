package procstat

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// DropFromPageCache asks the kernel to drop a file's cached pages. A binary the linker has just
// written is entirely in the page cache, and the kernel's fault-around then maps more of it
// into a process started from it than after a reboot: memory figures would depend on that.
func DropFromPageCache(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
		return fmt.Errorf("drop %s from the page cache: %w", path, err)
	}
	return nil
}
