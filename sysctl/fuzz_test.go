package sysctl

import (
	"path/filepath"
	"strings"
	"testing"
	"unicode"
)

// FuzzParse checks the validator's invariant: whatever name it accepts maps to a path inside
// /proc/sys, and whatever value it accepts is printable ASCII without a newline.
func FuzzParse(f *testing.F) {
	for _, s := range [][2]string{
		{"net.ipv4.tcp_keepalive_time", "600"},
		{"net/ipv4/conf/eth0.100/rp_filter", "1"},
		{"net/ipv4/../../kernel/core_pattern", "|/bin/sh"},
		{"net.ipv4..x", "1"},
		{"net.ipv4.ip_local_port_range", "1024 65000"},
		{"net.ipv4.tcp_rmem", "4096\t87380\t6291456"},
		{"kernel.shm_rmid_forced", "1\n"},
		{"net.ipv4.ip_local_reserved_ports", "8080,9000-9100"},
	} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, name, value string) {
		n, err := ParseName(name)
		if err != nil {
			return
		}
		p, err := n.Path(ProcSys)
		if err != nil {
			t.Fatalf("accepted name %q has no path: %v", name, err)
		}
		rel, err := filepath.Rel(ProcSys, p)
		if err != nil || p != filepath.Clean(p) || !strings.HasPrefix(p, ProcSys+"/") {
			t.Fatalf("accepted name %q maps to %q, outside %s", name, p, ProcSys)
		}
		// One directory level per name component, none of them "." or "..".
		levels, components := strings.Split(rel, "/"), strings.Split(string(n), ".")
		if len(levels) != len(components) {
			t.Fatalf("accepted name %q maps to %q: %d levels for %d components", name, p, len(levels), len(components))
		}
		for _, l := range levels {
			if l == "." || l == ".." || l == "" {
				t.Fatalf("accepted name %q maps to %q with level %q", name, p, l)
			}
		}
		if CheckValue(n, value) != nil {
			return
		}
		for _, r := range value {
			if r > unicode.MaxASCII || !unicode.IsPrint(r) {
				t.Fatalf("accepted value %q for %s holds %q", value, n, r)
			}
		}
	})
}
