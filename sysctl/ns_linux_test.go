package sysctl

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network and IPC namespaces")
	}
}

// newNetNS creates a network namespace for the test and returns its path.
func newNetNS(t *testing.T) string {
	t.Helper()
	name := fmt.Sprintf("pgsysctl-%d-%d", os.Getpid(), time.Now().UnixNano()%1e6)
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "delete", name).Run() })
	return "/run/netns/" + name
}

// newIPCNS starts a process in a new IPC namespace and returns the namespace's path.
func newIPCNS(t *testing.T) string {
	t.Helper()
	cmd := exec.Command("unshare", "--ipc", "sleep", "300")
	if err := cmd.Start(); err != nil {
		t.Fatalf("unshare --ipc: %v", err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	path := fmt.Sprintf("/proc/%d/ns/ipc", cmd.Process.Pid)
	// unshare execs sleep once the namespace exists: wait for the new namespace to show.
	self, _ := os.Readlink("/proc/self/ns/ipc")
	if err := wait.PollUntilContextTimeout(t.Context(), 5*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		l, err := os.Readlink(path)
		return err == nil && l != self, nil
	}); err != nil {
		t.Fatalf("the unshared process never got its own IPC namespace: %v", err)
	}
	return path
}

func TestWriteAndReadInsideNamespaces(t *testing.T) {
	needRoot(t)
	const keepalive, shmRmid Name = "net.ipv4.tcp_keepalive_time", "kernel.shm_rmid_forced"
	hostKeepalive, err := ReadNode(keepalive)
	if err != nil {
		t.Fatal(err)
	}
	hostShm, err := ReadNode(shmRmid)
	if err != nil {
		t.Fatal(err)
	}
	target := Target{NetNS: newNetNS(t), IPCNS: newIPCNS(t)}
	want := map[Name]string{keepalive: "613", shmRmid: "1"}
	if hostKeepalive == "613" || hostShm == "1" {
		want = map[Name]string{keepalive: "617", shmRmid: "0"}
	}

	if err := Write(target, want); err != nil {
		t.Fatal(err)
	}
	got, err := Read(target, []Name{keepalive, shmRmid})
	if err != nil {
		t.Fatal(err)
	}
	for n, v := range want {
		if got[n] != v {
			t.Errorf("%s in the namespaces = %q, want %q", n, got[n], v)
		}
	}
	// The host's values never change, whichever thread reads them now.
	for range 8 {
		if v, _ := ReadNode(keepalive); v != hostKeepalive {
			t.Fatalf("host %s changed: %q, was %q", keepalive, v, hostKeepalive)
		}
		if v, _ := ReadNode(shmRmid); v != hostShm {
			t.Fatalf("host %s changed: %q, was %q", shmRmid, v, hostShm)
		}
	}
}

func TestEnterFailsCleanly(t *testing.T) {
	needRoot(t)
	_, err := Read(Target{NetNS: "/run/netns/does-not-exist"}, []Name{"net.ipv4.tcp_keepalive_time"})
	if err == nil || !strings.Contains(err.Error(), "does-not-exist") {
		t.Fatalf("got %v, want an error naming the namespace", err)
	}
	if err := Write(Target{}, map[Name]string{"kernel.core_pattern": "x"}); err == nil {
		t.Fatal("wrote a node-wide sysctl through Write")
	}
}

func TestRefusesTheNodesOwnNamespaces(t *testing.T) {
	needRoot(t)
	// What a runtime reporting a host process as the sandbox would lead to.
	self := ForPID(os.Getpid())
	for _, tc := range []struct {
		target Target
		name   Name
	}{
		{Target{NetNS: self.NetNS}, "net.ipv4.tcp_keepalive_time"},
		{Target{IPCNS: self.IPCNS}, "kernel.shm_rmid_forced"},
		{Target{NetNS: newNetNS(t), IPCNS: self.IPCNS}, "kernel.shm_rmid_forced"},
	} {
		host, err := ReadNode(tc.name)
		if err != nil {
			t.Fatal(err)
		}
		other := "1"
		if host == "1" {
			other = "2"
		}
		err = Write(tc.target, map[Name]string{tc.name: other})
		if err == nil || !strings.Contains(err.Error(), "podgate's own namespace") {
			t.Errorf("%+v: got %v, want a refusal", tc.target, err)
		}
		if now, _ := ReadNode(tc.name); now != host {
			t.Fatalf("host %s changed from %s to %s", tc.name, host, now)
		}
	}
}
