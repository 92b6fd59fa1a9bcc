package sysctl

import (
	"os"
	"runtime"
	"slices"
	"testing"

	"github.com/vishvananda/netns"
	"k8s.io/klog/v2"
)

func TestNodeSysctlsWrittenOnlyWhenDifferent(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates a network namespace to stand in for the node")
	}
	const name = "net.ipv4.tcp_keepalive_time"
	host, err := ReadNode(name)
	if err != nil {
		t.Fatal(err)
	}
	// The "node" is a fresh network namespace entered by one locked thread, which goes back
	// to the test's namespace before it is unlocked: no thread stays behind in it.
	inThrowawayNetNS(t, func() {
		logger := klog.Background()
		changed, err := ApplyNode(logger, map[Name]string{name: "777", "net.ipv4.tcp_fin_timeout": "33"})
		if err != nil || !slices.Equal(changed, []Name{"net.ipv4.tcp_fin_timeout", name}) {
			t.Errorf("first apply: changed %v, %v", changed, err)
		}
		if v, _ := ReadNode(name); v != "777" {
			t.Errorf("%s = %s after apply, want 777", name, v)
		}
		changed, err = ApplyNode(logger, map[Name]string{name: "777", "net.ipv4.tcp_fin_timeout": "20"})
		if err != nil || !slices.Equal(changed, []Name{"net.ipv4.tcp_fin_timeout"}) {
			t.Errorf("second apply (lowering one value, keeping the other): changed %v, %v", changed, err)
		}
	})
	if v, _ := ReadNode(name); v != host {
		t.Errorf("host %s changed to %s", name, v)
	}
}

// inThrowawayNetNS runs fn on a locked OS thread inside a new network namespace, then moves
// the thread back. If it cannot move back, the thread stays locked and ends with its
// goroutine, so no other goroutine ever runs in the throwaway namespace.
func inThrowawayNetNS(t *testing.T, fn func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread()
		origin, err := netns.Get()
		if err != nil {
			t.Error(err)
			runtime.UnlockOSThread()
			return
		}
		defer origin.Close()
		ns, err := netns.New()
		if err == nil {
			defer ns.Close()
			fn()
		} else {
			t.Error(err) // the thread may or may not have left: go back all the same
		}
		if err := netns.Set(origin); err != nil {
			t.Errorf("return to the test's network namespace: %v", err)
			return
		}
		runtime.UnlockOSThread()
	}()
	<-done
}
