package sysctl

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strings"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Read returns the values of names inside the target's namespaces.
func Read(t Target, names []Name) (map[Name]string, error) {
	out := make(map[Name]string, len(names))
	err := inNamespaces(t, names, func() error {
		for _, n := range names {
			path, err := n.Path(ProcSys)
			if err != nil {
				return err
			}
			b, err := os.ReadFile(path)
			if err != nil {
				return fmt.Errorf("read %s: %w", n, err)
			}
			out[n] = strings.TrimRight(string(b), "\n")
		}
		return nil
	})
	return out, err
}

// Write sets values inside the target's namespaces.
func Write(t Target, values map[Name]string) error {
	names := sortedKeys(values)
	return inNamespaces(t, names, func() error {
		for _, n := range names {
			if err := writeFile(n, values[n]); err != nil {
				return err
			}
		}
		return nil
	})
}

// WriteNode sets a sysctl in podgate's own namespaces, the node's.
func WriteNode(n Name, v string) error { return writeFile(n, v) }

// ReadNode reads a sysctl in podgate's own namespaces, the node's.
func ReadNode(n Name) (string, error) {
	path, err := n.Path(ProcSys)
	if err != nil {
		return "", err
	}
	b, err := os.ReadFile(path)
	return strings.TrimRight(string(b), "\n"), err
}

func writeFile(n Name, v string) error {
	path, err := n.Path(ProcSys)
	if err != nil {
		return err
	}
	// Opened after entering the namespace: a /proc/sys file opened before setns keeps writing
	// to the namespace it was opened in.
	f, err := os.OpenFile(path, os.O_WRONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return fmt.Errorf("write %s: %w", n, err)
	}
	if _, err := f.WriteString(v); err != nil {
		f.Close()
		return fmt.Errorf("write %s=%q: %w", n, v, err)
	}
	return f.Close()
}

// inNamespaces runs fn on an OS thread that has entered the target's network and/or IPC
// namespace (those the names need). The thread is locked for the duration; if its namespaces
// cannot be restored afterwards it stays locked, so the Go runtime ends it with its goroutine
// instead of returning a thread in a pod's namespace to the pool.
func inNamespaces(t Target, names []Name, fn func() error) error {
	var needNet, needIPC bool
	for _, n := range names {
		// The namespace the policy admitted n in: the same classification, or a write
		// could land in a namespace the policy did not check.
		switch podNamespace(n) {
		case NetNamespace:
			needNet = true
		case IPCNamespace:
			needIPC = true
		default:
			return fmt.Errorf("sysctl %s is not in a pod's network or IPC namespace", n)
		}
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		restored, err := enterAndRun(t, needNet, needIPC, fn)
		if restored {
			runtime.UnlockOSThread()
		}
		errc <- err
	}()
	return <-errc
}

func enterAndRun(t Target, needNet, needIPC bool, fn func() error) (restored bool, err error) {
	var undo []func() error
	restore := func() bool {
		ok := true
		for i := len(undo) - 1; i >= 0; i-- {
			if err := undo[i](); err != nil {
				ok = false
			}
		}
		return ok
	}
	if needNet {
		u, err := enter(t.NetNS, "/proc/thread-self/ns/net", unix.CLONE_NEWNET)
		if err != nil {
			return restore(), fmt.Errorf("enter network namespace %s: %w", t.NetNS, err)
		}
		undo = append(undo, u)
	}
	if needIPC {
		u, err := enter(t.IPCNS, "/proc/thread-self/ns/ipc", unix.CLONE_NEWIPC)
		if err != nil {
			return restore(), fmt.Errorf("enter IPC namespace %s: %w", t.IPCNS, err)
		}
		undo = append(undo, u)
	}
	err = fn()
	if !restore() {
		return false, errors.Join(err, errors.New("could not restore the thread's namespaces"))
	}
	return true, err
}

// enter moves the calling (locked) thread into the namespace at path and returns how to move
// it back. /proc/thread-self, not /proc/self: the latter is the main thread's.
func enter(path, self string, nstype int) (func() error, error) {
	if path == "" {
		return nil, errors.New("no namespace path")
	}
	origin, err := netns.GetFromPath(self)
	if err != nil {
		return nil, err
	}
	target, err := netns.GetFromPath(path)
	if err != nil {
		origin.Close()
		return nil, err
	}
	defer target.Close()
	// A pod's namespace is never podgate's own, the node's. If the path leads there (a runtime
	// that reports a host process as the sandbox, a pause pid reused by a host process), a
	// repair would change the node: refuse.
	if target.Equal(origin) {
		origin.Close()
		return nil, fmt.Errorf("%s is podgate's own namespace, not a pod's", path)
	}
	if err := unix.Setns(int(target), nstype); err != nil {
		origin.Close()
		return nil, err
	}
	return func() error {
		defer origin.Close()
		return unix.Setns(int(origin), nstype)
	}, nil
}
