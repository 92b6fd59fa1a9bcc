package sysctl

import (
	"fmt"
	"strings"
	"testing"
)

func TestNormalize(t *testing.T) {
	for in, want := range map[string]string{
		"net.ipv4.tcp_keepalive_time":      "net.ipv4.tcp_keepalive_time",
		"net/ipv4/tcp_keepalive_time":      "net.ipv4.tcp_keepalive_time",
		"net/ipv4/conf/eth0.100/rp_filter": "net.ipv4.conf.eth0/100.rp_filter",
		"net.ipv4.conf.eth0/100.rp_filter": "net.ipv4.conf.eth0/100.rp_filter",
		"kernel":                           "kernel",
		"":                                 "",
	} {
		if got := Normalize(in); got != want {
			t.Errorf("Normalize(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestParseNameAndPath(t *testing.T) {
	for _, tc := range []struct {
		in, path string
	}{
		{"net.ipv4.tcp_keepalive_time", "/proc/sys/net/ipv4/tcp_keepalive_time"},
		{"net/ipv4/ip_local_port_range", "/proc/sys/net/ipv4/ip_local_port_range"},
		{"net.ipv4.conf.eth0/100.rp_filter", "/proc/sys/net/ipv4/conf/eth0.100/rp_filter"},
		{"net/ipv4/conf/eth0.100/rp_filter", "/proc/sys/net/ipv4/conf/eth0.100/rp_filter"},
		{"kernel.shm_rmid_forced", "/proc/sys/kernel/shm_rmid_forced"},
		{"fs.mqueue.msg_max", "/proc/sys/fs/mqueue/msg_max"},
	} {
		n, err := ParseName(tc.in)
		if err != nil {
			t.Errorf("ParseName(%q): %v", tc.in, err)
			continue
		}
		p, err := n.Path(ProcSys)
		if err != nil || p != tc.path {
			t.Errorf("%q: path %q, %v; want %q", tc.in, p, err, tc.path)
		}
	}
}

func TestParseNameRejectsHostileNames(t *testing.T) {
	for _, in := range []string{
		"",
		"net/ipv4/../../kernel/core_pattern",
		"net.ipv4..x",
		"net.ipv4.",
		".net.ipv4",
		"net..",
		"..",
		"net.ipv4.conf.../x",
		"net.ipv4.conf.eth0//x",
		"/proc/sys/net/ipv4/tcp_keepalive_time",
		"net.ipv4.tcp_keepalive_time\x00",
		"net.ipv4.tcp_keepalive_time\n",
		"net.ipv4.tcp keepalive",
		"net.ipv4.TCP_KEEPALIVE_TIME",
		"net.ipv4.tcp_keepalive_tïme",
		"net.ipv4.*",
		"net.ipv4.-x",
		"net." + strings.Repeat("a", 300),
		strings.Repeat("a.", 200) + "a",
	} {
		if n, err := ParseName(in); err == nil {
			t.Errorf("ParseName(%q) = %q, want an error", in, n)
		}
	}
}

func TestPathRefusesEscapes(t *testing.T) {
	// Path re-checks what it is given, even a Name that did not come from ParseName.
	for _, n := range []Name{"net.ipv4/..", "..", "net...x", "net.a\x00"} {
		if p, err := n.Path(ProcSys); err == nil {
			t.Errorf("Path(%q) = %q, want an error", n, p)
		}
	}
}

func TestNamespaceOf(t *testing.T) {
	for n, want := range map[Name]Namespace{
		"net.ipv4.tcp_keepalive_time": NetNamespace,
		"net.core.somaxconn":          NetNamespace,
		"kernel.shm_rmid_forced":      IPCNamespace,
		"kernel.shmmax":               IPCNamespace,
		"kernel.msgmax":               IPCNamespace,
		"kernel.sem":                  IPCNamespace,
		"fs.mqueue.msg_max":           IPCNamespace,
		"kernel.core_pattern":         NoNamespace,
		"kernel.semx":                 NoNamespace,
		"vm.swappiness":               NoNamespace,
		"fs.file-max":                 NoNamespace,
		"netx.foo":                    NoNamespace,
		// Where the kubelet's library differs from podgate's former rules.
		"kernel.shm_next_id":       NoNamespace, // was IPC: only a "kernel.shm*" entry makes it so
		"kernel.msg_next_id":       NoNamespace, // was IPC, likewise
		"kernel.domainname":        UTSNamespace,
		"user.max_user_namespaces": UserNamespace,
	} {
		if got := NamespaceOf(n); got != want {
			t.Errorf("NamespaceOf(%q) = %q, want %q", n, got, want)
		}
	}
}

func TestParseKernelVersion(t *testing.T) {
	for in, want := range map[string]KernelVersion{
		"6.18.44-fc-v595":        {6, 18},
		"4.15.0-generic":         {4, 15},
		"5.4":                    {5, 4},
		"3.10.0-1160.el7.x86_64": {3, 10},
		"6.1.0-rc7":              {6, 1},
	} {
		got, err := ParseKernelVersion(in)
		if err != nil || got != want {
			t.Errorf("ParseKernelVersion(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	if v, _ := ParseKernelVersion("6.18.44-fc-v595"); !v.AtLeast(mustKernel("6.18")) || v.AtLeast(mustKernel("6.19")) {
		t.Errorf("6.18.44-fc-v595 read as %s: want at least 6.18 and below 6.19", v)
	}
	for _, in := range []string{"", "6", "x.y", "6.x", "06.1"} {
		_, err := ParseKernelVersion(in)
		if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("kernel release %q", in)) {
			t.Errorf("ParseKernelVersion(%q) = %v, want an error naming the release", in, err)
		}
	}
}

func TestKernelVersionAtLeast(t *testing.T) {
	for _, tc := range []struct {
		v, min KernelVersion
		want   bool
	}{
		{KernelVersion{6, 18}, KernelVersion{6, 18}, true},
		{KernelVersion{6, 18}, KernelVersion{4, 15}, true},
		{KernelVersion{4, 14}, KernelVersion{4, 15}, false},
		{KernelVersion{5, 0}, KernelVersion{4, 15}, true},
		{KernelVersion{3, 99}, KernelVersion{4, 0}, false},
		{KernelVersion{3, 10}, KernelVersion{}, true},
	} {
		if got := tc.v.AtLeast(tc.min); got != tc.want {
			t.Errorf("%s.AtLeast(%s) = %v, want %v", tc.v, tc.min, got, tc.want)
		}
	}
}
