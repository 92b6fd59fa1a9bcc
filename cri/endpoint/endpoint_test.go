package endpoint

import (
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	long := "/" + strings.Repeat("s", 107)
	for _, tc := range []struct {
		in, want, err string
	}{
		{in: "unix:///run/containerd/containerd.sock", want: "/run/containerd/containerd.sock"},
		{in: "/run/podgate/cri.sock", want: "/run/podgate/cri.sock"},
		{in: "tcp://x:1", err: "only unix sockets are supported"},
		{in: "unix://run/x.sock", err: "want an absolute socket path"},
		{in: "x.sock", err: "want an absolute socket path"},
		{in: long, err: "socket path is 108 bytes, unix sockets allow 107"},
	} {
		got, err := Parse(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("Parse(%q) = %q, %v; want an error with %q", tc.in, got, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("Parse(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
}
