package registry

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
)

// CheckStateDir checks what podgate's start-up would trip on: stateDir being something
// else than a directory, or a checkpoint that does not read. A stateDir that does not exist yet
// is fine: podgate creates it.
func CheckStateDir(dir string) error {
	fi, err := os.Stat(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return fmt.Errorf("%q: not a directory", dir)
	}
	_, err = NewCheckpoint(dir).ReadAll()
	return err
}
