package cri

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

// SocketOptions describe the unix socket podgate serves on.
type SocketOptions struct {
	// Mode is the socket file's permission bits (0660 on a node: root and Group).
	Mode os.FileMode
	// Group is a group name or numeric id given to the socket; empty keeps root's.
	Group string
}

// Listen prepares and listens on the unix socket at path: it creates the directory, removes a
// stale socket file only when nothing answers on it (so a second podgate refuses to start
// instead of stealing the first one's socket), and sets the file's mode and group.
func Listen(path string, o SocketOptions) (net.Listener, error) {
	if _, err := ParseEndpoint(path); err != nil {
		return nil, err
	}
	gid := -1
	if o.Group != "" {
		var err error
		if gid, err = lookupGroup(o.Group); err != nil {
			return nil, err
		}
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("socket directory: %w", err)
	}
	if err := removeStale(path); err != nil {
		return nil, err
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, err
	}
	// A clean stop leaves no socket file behind for the kubelet to dial.
	l.(*net.UnixListener).SetUnlinkOnClose(true)
	if err := os.Chmod(path, o.Mode); err != nil {
		l.Close()
		return nil, fmt.Errorf("socket mode: %w", err)
	}
	if gid >= 0 {
		if err := os.Chown(path, -1, gid); err != nil {
			l.Close()
			return nil, fmt.Errorf("socket group %s: %w", o.Group, err)
		}
	}
	return l, nil
}

func removeStale(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if fi.Mode()&os.ModeSocket == 0 {
		return fmt.Errorf("%s exists and is not a socket; remove it or choose another path", path)
	}
	c, err := net.DialTimeout("unix", path, time.Second)
	if err == nil {
		c.Close()
		return fmt.Errorf("%s is in use: another process (a second podgate?) serves on it", path)
	}
	if !errors.Is(err, syscall.ECONNREFUSED) && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("check socket %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove stale socket: %w", err)
	}
	return nil
}

func lookupGroup(g string) (int, error) {
	if id, err := strconv.Atoi(g); err == nil {
		if id < 0 {
			return 0, fmt.Errorf("socket group %q: negative id", g)
		}
		return id, nil
	}
	grp, err := user.LookupGroup(g)
	if err != nil {
		return 0, fmt.Errorf("socket group: %w", err)
	}
	return strconv.Atoi(grp.Gid)
}

// CheckSocketGroup resolves a socket's group, a name or a numeric id, as check-config checks
// it. Unlike Listen, which hands a numeric id to chown as it is, it refuses a gid no group has:
// a socket owned by nobody's group admits no client but root's.
func CheckSocketGroup(g string) error {
	if g == "" {
		return nil
	}
	var err error
	if _, atoiErr := strconv.Atoi(g); atoiErr == nil {
		_, err = user.LookupGroupId(g)
	} else {
		_, err = user.LookupGroup(g)
	}
	var unknownName user.UnknownGroupError
	var unknownID user.UnknownGroupIdError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &unknownName), errors.As(err, &unknownID):
		return fmt.Errorf("group %q: not found", g)
	default:
		return fmt.Errorf("group %q: %w", g, err)
	}
}
