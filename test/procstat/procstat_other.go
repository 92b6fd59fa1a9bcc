//go:build !linux

package procstat

import (
	"errors"
	"fmt"
	"runtime"
)

// DropFromPageCache asks the kernel to drop a file's cached pages. Off Linux it fails: there is
// no posix_fadvise(POSIX_FADV_DONTNEED) to call, and the benchmarks that use it read /proc anyway.
func DropFromPageCache(path string) error {
	return fmt.Errorf("drop %s from the page cache: needs Linux, this is %s: %w", path, runtime.GOOS, errors.ErrUnsupported)
}
