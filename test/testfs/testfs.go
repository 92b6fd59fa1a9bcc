// Package testfs holds file-system helpers shared by podgate's tests.
package testfs

import (
	"os"
	"testing"
)

// ShortDir returns a new directory under /tmp, removed when the test ends. Unix socket paths
// must stay under 108 bytes, which t.TempDir()'s paths can pass.
func ShortDir(tb testing.TB) string {
	tb.Helper()
	d, err := os.MkdirTemp("/tmp", "pg")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { os.RemoveAll(d) })
	return d
}
