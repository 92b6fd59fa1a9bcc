package sysctl

import (
	"strings"
	"testing"
)

func TestCheckValue(t *testing.T) {
	for _, tc := range []struct {
		name, value string
		ok          bool
	}{
		{"net.ipv4.tcp_keepalive_time", "600", true},
		{"net.ipv4.tcp_keepalive_time", "0", false},
		{"net.ipv4.tcp_keepalive_time", "-5", false},
		{"net.ipv4.tcp_keepalive_time", "10m", false},
		{"net.ipv4.tcp_keepalive_time", "600\n", false},
		{"net.ipv4.tcp_keepalive_time", "600\nkernel.core_pattern=|/x", false},
		{"net.ipv4.tcp_syncookies", "2", true},
		{"net.ipv4.tcp_syncookies", "3", false},
		{"net.ipv4.ip_local_port_range", "1024 65000", true},
		{"net.ipv4.ip_local_port_range", "65000 1024", false},
		{"net.ipv4.ip_local_port_range", "1024", false},
		{"net.ipv4.ip_local_port_range", "1024\t65000", false}, // tab: a control character
		{"net.ipv4.ip_local_port_range", "0 65000", false},
		{"net.ipv4.ping_group_range", "0 2147483647", true},
		{"net.ipv4.tcp_rmem", "4096 131072 6291456", true},
		{"net.ipv4.tcp_rmem", "4096 131072", false},
		{"net.ipv4.tcp_rmem", "6291456 131072 4096", false},
		{"net.ipv4.ip_local_reserved_ports", "8080,9000-9100", true},
		{"net.ipv4.ip_local_reserved_ports", "", true},
		{"net.ipv4.ip_local_reserved_ports", "9100-9000", false},
		{"net.ipv4.ip_local_reserved_ports", "70000", false},
		{"net.ipv4.ip_local_reserved_ports", "8080, 9090", false}, // the kernel refuses spaces
		{"net.ipv4.tcp_keepalive_time", "0600", false},            // the kernel reads octal: 384
		{"net.ipv4.tcp_keepalive_time", "+5", false},
		{"net.ipv4.tcp_keepalive_time", "09", false},
		{"net.ipv4.tcp_syncookies", "0", true},
		{"net.core.somaxconn", "4096", true},      // not known: generic checks only
		{"net.core.somaxconn", "", false},         // empty
		{"net.core.somaxconn", "\x1b[31m", false}, // escape sequence
		{"net.core.somaxconn", "é", false},
		{"net.core.somaxconn", strings.Repeat("1", 5000), false},
	} {
		err := CheckValue(Name(tc.name), tc.value)
		if (err == nil) != tc.ok {
			t.Errorf("CheckValue(%s, %q) = %v, want ok=%v", tc.name, tc.value, err, tc.ok)
		}
	}
}

func TestSameValue(t *testing.T) {
	for _, tc := range []struct {
		name      Name
		got, want string
		same      bool
	}{
		{"net.ipv4.tcp_rmem", "4096\t131072\t6291456\n", "4096 131072 6291456", true},
		{"net.ipv4.tcp_keepalive_time", "600\n", "6000", false},
		// The kernel keeps a set of ports and prints it sorted, ranges merged.
		{reservedPorts, "8080,9000-9100\n", "9000-9100,8080", true},
		{reservedPorts, "8080\n", "8080-8080", true},
		{reservedPorts, "8080-8081\n", "8080,8081", true},
		{reservedPorts, "8080\n", "8081", false},
		{reservedPorts, "\n", "", true},
	} {
		if got := SameValue(tc.name, tc.got, tc.want); got != tc.same {
			t.Errorf("SameValue(%s, %q, %q) = %v", tc.name, tc.got, tc.want, got)
		}
	}
}
