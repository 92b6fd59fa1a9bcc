package registry

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCheckStateDir: a stateDir that does not exist yet, or holds a checkpoint that reads, is
// fine; a file in its place, or a damaged checkpoint, is named.
func TestCheckStateDir(t *testing.T) {
	dir := t.TempDir()
	good, damaged := filepath.Join(dir, "good"), filepath.Join(dir, "damaged")
	for _, d := range []string{good, damaged} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := NewCheckpoint(good).Write(CheckpointData{}); err != nil {
		t.Fatal(err)
	}
	damagedFile := filepath.Join(damaged, CheckpointFile)
	notDir := filepath.Join(dir, "file")
	for path, body := range map[string]string{damagedFile: "{not json", notDir: ""} {
		if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range []string{filepath.Join(dir, "nonexistent"), good} {
		if err := CheckStateDir(d); err != nil {
			t.Errorf("%s: %v", d, err)
		}
	}
	for d, want := range map[string][]string{notDir: {"not a directory"}, damaged: {damagedFile, "damaged"}} {
		err := CheckStateDir(d)
		for _, w := range want {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %v, want an error with %q", d, err, w)
			}
		}
	}
}
