//go:build !linux

package sysctl

import (
	"errors"
	"strings"
	"testing"
)

func TestNeedsLinux(t *testing.T) {
	_, errRead := Read(ForPID(1), []Name{"net.ipv4.tcp_keepalive_time"})
	_, errReadNode := ReadNode("net.ipv4.tcp_keepalive_time")
	_, errKernel := RunningKernel()
	for name, err := range map[string]error{
		"Read":          errRead,
		"Write":         Write(ForPID(1), map[Name]string{"net.ipv4.tcp_keepalive_time": "600"}),
		"ReadNode":      errReadNode,
		"WriteNode":     WriteNode("net.ipv4.tcp_keepalive_time", "600"),
		"RunningKernel": errKernel,
	} {
		if !errors.Is(err, errors.ErrUnsupported) || !strings.Contains(err.Error(), "need Linux") {
			t.Errorf("%s: %v, want an unsupported error saying pod sysctls need Linux", name, err)
		}
	}
}
