//go:build !linux

package sysctl

import (
	"errors"
	"fmt"
	"runtime"
)

// errNeedLinux is what every sysctl access returns off Linux: pod sysctls live in Linux network
// and IPC namespaces, reached through /proc/sys.
var errNeedLinux = fmt.Errorf("pod sysctls need Linux, this is %s: %w", runtime.GOOS, errors.ErrUnsupported)

// Read returns the values of names inside the target's namespaces. Off Linux it fails.
func Read(Target, []Name) (map[Name]string, error) { return nil, errNeedLinux }

// Write sets values inside the target's namespaces. Off Linux it fails.
func Write(Target, map[Name]string) error { return errNeedLinux }

// WriteNode sets a sysctl in podgate's own namespaces, the node's. Off Linux it fails.
func WriteNode(Name, string) error { return errNeedLinux }

// ReadNode reads a sysctl in podgate's own namespaces, the node's. Off Linux it fails.
func ReadNode(Name) (string, error) { return "", errNeedLinux }

// RunningKernel returns the version of the kernel podgate runs on. Off Linux it fails: the
// kernel gates are Linux versions.
func RunningKernel() (KernelVersion, error) { return KernelVersion{}, errNeedLinux }
