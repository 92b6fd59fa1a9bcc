// Package testnet makes network namespaces for tests: named ones (so that `ip -n NAME` and
// CNI's CNI_NETNS can use them), removed when the test ends, with a netlink handle inside.
// Nothing here ever moves a thread of the test process into another namespace.
package testnet

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
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

// RequireNetAdmin skips a test that makes network namespaces and moves interfaces between
// them when it cannot: without root or without iproute2's ip.
func RequireNetAdmin(tb testing.TB) {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Skip("needs root: creates network namespaces and moves interfaces between them (CI runs as root)")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		tb.Skip("needs iproute2's ip to create network namespaces")
	}
}

// IP runs iproute2's ip with args and fails the test when it fails.
func IP(tb testing.TB, args ...string) {
	tb.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		tb.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// Named creates a network namespace named prefix-PID-N, removed when the test ends unless the
// test removed it itself, and returns its name and its path. It holds nothing open in it, so
// removing it ends it (and the kernel gives the host back the physical interfaces in it).
func Named(tb testing.TB, prefix string) (name, path string) {
	tb.Helper()
	name = fmt.Sprintf("%s-%d-%d", prefix, os.Getpid(), seq.Add(1))
	IP(tb, "netns", "add", name)
	tb.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "del", name).CombinedOutput(); err != nil && !strings.Contains(string(out), "No such file") {
			tb.Errorf("ip netns del %s: %v: %s", name, err, out)
		}
	})
	return name, filepath.Join("/run/netns", name)
}

// New creates a network namespace named prefix-PID-N, as Named, with a netlink handle inside;
// both go away when the test ends. It needs root.
func New(tb testing.TB, prefix string) NetNS {
	tb.Helper()
	name, path := Named(tb, prefix)
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
