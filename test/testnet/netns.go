// Package testnet makes network namespaces for tests: named ones (so that `ip -n NAME` and
// CNI's CNI_NETNS can use them), removed when the test ends, with a netlink handle inside.
// Nothing here ever moves a thread of the test process into another namespace.
package testnet

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

var seq atomic.Int64

// NetNS is a named network namespace of a test.
type NetNS struct {
	// Name is its name for `ip netns`; Path its file under /run/netns.
	Name, Path string
	// Handle is a netlink handle inside it.
	Handle *netlink.Handle
}

// New creates a network namespace named prefix-PID-N; it and its handle go away when the test
// ends. It needs root.
func New(tb testing.TB, prefix string) NetNS {
	tb.Helper()
	name := fmt.Sprintf("%s-%d-%d", prefix, os.Getpid(), seq.Add(1))
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		tb.Fatalf("ip netns add %s: %v: %s", name, err, out)
	}
	tb.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "del", name).CombinedOutput(); err != nil {
			tb.Errorf("ip netns del %s: %v: %s", name, err, out)
		}
	})
	path := filepath.Join("/run/netns", name)
	return NetNS{Name: name, Path: path, Handle: HandleAt(tb, path)}
}

// HandleAt returns a netlink handle inside the network namespace at path, closed when the test
// ends.
func HandleAt(tb testing.TB, path string) *netlink.Handle {
	tb.Helper()
	ns, err := netns.GetFromPath(path)
	if err != nil {
		tb.Fatal(err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(h.Close)
	return h
}
