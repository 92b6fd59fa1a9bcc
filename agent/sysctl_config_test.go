package agent

import (
	"strings"
	"testing"

	"github.com/podgate/podgate/agent/config"
)

func TestSysctlsSection(t *testing.T) {
	for _, tc := range []struct {
		doc, want string
	}{
		{"sysctls: {verify: sometimes}", "sysctls.verify:"},
		{"sysctls: {allowedUnsafe: [\"kernel.*\"]}", "sysctls.allowedUnsafe[0]"},
		{"sysctls: {allowedUnsafe: [\"net.core.no_such_sysctl\"]}", "no such sysctl"},
		{"sysctls: {podDefaults: {kernel.core_pattern: core}}", "sysctls.podDefaults"},
		// Defaults are podgate's own: an empty allowedUnsafe trusts the kubelet for pods, not them.
		{"sysctls: {podDefaults: {net.core.somaxconn: \"1024\"}}", "not in sysctls.allowedUnsafe"},
		{"sysctls: {podDefaults: {net.ipv4.tcp_keepalive_time: \"10 minutes\"}}", "not a plain decimal integer"},
		{"sysctls: {node: {net.netfilter.no_such: \"1\"}}", "sysctls.node"},
		{"sysctls: {node: {vm.swappiness: \"1\\n2\"}}", "sysctls.node"},
		{"sysctls: {podDefault: {}}", `unknown field "podDefault"`},
	} {
		c, err := config.Parse([]byte(configHeader + tc.doc + "\n"))
		if err == nil {
			err = Validate(c)
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want an error with %q", tc.doc, err, tc.want)
		}
	}
	c, err := config.Parse([]byte(configHeader + `sysctls:
  podDefaults: {net.ipv4.tcp_keepalive_time: "600"}
  namespaceDefaults: {kube-system: {net.ipv4.tcp_keepalive_time: "300"}}
  allowedUnsafe: ["net.core.somaxconn", "net.ipv4.conf.*"]
  node: {vm.swappiness: "60"}
`))
	if err != nil {
		t.Fatal(err)
	}
	if err := Validate(c); err != nil {
		t.Fatalf("valid section: %v", err)
	}
	if c.Sysctls.Verify != config.VerifyRepair {
		t.Errorf("verify defaults to %q, want repair", c.Sysctls.Verify)
	}
}
