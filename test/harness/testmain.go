package harness

import (
	"context"
	"flag"
	"fmt"
	"os"
	"testing"
	"time"
)

// RunTests builds podgate once for a test package, sets *bin to it, runs the package's tests
// and returns their exit code, for TestMain. Tests run podgate with the race detector;
// benchmarks (-test.bench) measure it as it ships. When build is false (the tests will skip:
// not root, nothing installed) nothing is built and *bin stays empty.
func RunTests(m *testing.M, bin *string, build bool) int {
	flag.Parse()
	if !build {
		return m.Run()
	}
	dir, err := os.MkdirTemp("", "podgate-test-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var flags []string
	if f := flag.Lookup("test.bench"); f == nil || f.Value.String() == "" {
		flags = append(flags, "-race")
	}
	if *bin, err = Build(ctx, dir, flags...); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return m.Run()
}
