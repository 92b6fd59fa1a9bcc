package agent

import (
	"strings"
	"testing"
)

func TestSysctlsSection(t *testing.T) {
	for _, tc := range []struct {
		doc, want string
	}{
		{"sysctls: {verify: sometimes}", "sysctls.verify:"},
		{"sysctls: {allowedUnsafe: [\"kernel.*\"]}", "sysctls.allowedUnsafe[0]"},
		{"sysctls: {allowedUnsafe: [\"net.core.no_such_sysctl\"]}", "no such sysctl"},
		{"sysctls: {podDefaults: {kernel.core_pattern: core}}", "sysctls.podDefaults"},
		{"sysctls: {podDefaults: {net.ipv4.tcp_keepalive_time: \"10 minutes\"}}", "not a plain decimal integer"},
		{"sysctls: {node: {net.netfilter.no_such: \"1\"}}", "sysctls.node"},
		{"sysctls: {node: {vm.swappiness: \"1\\n2\"}}", "sysctls.node"},
		{"sysctls: {podDefault: {}}", `unknown field "podDefault"`},
	} {
		c, err := Parse([]byte(header + tc.doc + "\n"))
		if err == nil {
			err = c.Validate()
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want an error with %q", tc.doc, err, tc.want)
		}
	}
	c, err := Parse([]byte(header + `sysctls:
  podDefaults: {net.ipv4.tcp_keepalive_time: "600"}
  namespaceDefaults: {kube-system: {net.ipv4.tcp_keepalive_time: "300"}}
  allowedUnsafe: ["net.core.somaxconn", "net.ipv4.conf.*"]
  node: {vm.swappiness: "60"}
`))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatalf("valid section: %v", err)
	}
	if c.Sysctls.Verify != VerifyRepair {
		t.Errorf("verify defaults to %q, want repair", c.Sysctls.Verify)
	}
}
