package main

import (
	"context"
	"flag"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/podgate/podgate/test/harness"
)

// flood makes the test binary the flooding process of floodFairness, as -flood makes the
// program.
var flood = flag.String("flood", "", "internal: flood this PodResources socket with List calls")

// TestMain also removes the programs built.
func TestMain(m *testing.M) {
	flag.Parse()
	if *flood != "" {
		os.Exit(floodPodResources(*flood))
	}
	code := m.Run()
	if built.bins != nil {
		_ = os.RemoveAll(filepath.Dir(built.bins["podgate"]))
	}
	os.Exit(code)
}

// built holds podgate and the fake runtime, built once for the package's tests.
var built struct {
	once sync.Once
	bins map[string]string
	err  error
}

// programs is a rig of the programs built once, in a directory of the test's own; it skips
// the test when not root or when they cannot be built.
func programs(t *testing.T) *rig {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("test/hostile runs podgate as root, as on a node: run as root (make test does in CI)")
	}
	built.once.Do(func() {
		dir, err := os.MkdirTemp("", "hostile-bin")
		if err != nil {
			built.err = err
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		built.bins, built.err = harness.BuildPrograms(ctx, dir, "./test/e2e/fakeruntime")
		if built.err != nil {
			_ = os.RemoveAll(dir)
		}
	})
	if built.err != nil {
		t.Skipf("podgate and the fake runtime cannot be built here: %v", built.err)
	}
	dir, err := os.MkdirTemp("", "hostile") // short: the sockets' paths live under it
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return &rig{dir: dir, podgate: built.bins["podgate"], fake: built.bins["fakeruntime"]}
}

// TestAttacks runs make attacks' hostile clients against podgate (built from ./cmd/podgate, in
// front of the grpc-go fake runtime), with default limits, and checks what every one must hold
// (verdict): podgate's peak RSS within peakRSS, the kubelet-like client's Version answered
// throughout, a log line naming the attacking process where podgate refused it, and the
// attack's own check. A row whose check compares podgate with grpc-go attacks the grpc-go
// server first. The silent connections stay silent 5 s and the stress test runs 20 s here
// (make attacks: 30 s and a minute).
func TestAttacks(t *testing.T) {
	if testing.Short() {
		t.Skip("the attacks take minutes: not with -short")
	}
	ctx := context.Background()
	r := programs(t)
	for _, a := range attacks(5*time.Second, 20*time.Second) {
		t.Run(a.name, func(t *testing.T) {
			if a.anchored {
				anchor, err := measure(ctx, r, a, "grpc-go")
				if err != nil {
					t.Fatal(err)
				}
				t.Logf("grpc-go: %s", anchor.row(a))
			}
			o, err := measure(ctx, r, a, "podgate")
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%s", o.row(a))
			for _, err := range verdict(a, o) {
				t.Error(err)
			}
		})
	}
}
