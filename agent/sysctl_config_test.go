package agent

import (
	"strings"
	"testing"

	"github.com/podgate/podgate/agent/config"
	"github.com/podgate/podgate/sysctl"
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

// TestAllowedUnsafeUnsetTrustsTheKubelet: without allowedUnsafe a pod's unsafe namespaced
// sysctls pass (the kubelet admitted them); with it they must be listed.
func TestAllowedUnsafeUnsetTrustsTheKubelet(t *testing.T) {
	pod := map[string]string{"kernel.msgmax": "10000", "fs.mqueue.msg_max": "100"}
	for _, tc := range []struct {
		doc, why string // why "" = accepted
	}{
		{"sysctls: {}", ""},
		{"sysctls: {allowedUnsafe: []}", ""},
		{"sysctls: {allowedUnsafe: [\"kernel.msg*\", \"fs.mqueue.*\"]}", ""},
		{"sysctls: {allowedUnsafe: [\"kernel.msg*\"]}", "unsafe and not in sysctls.allowedUnsafe"},
	} {
		c, err := config.Parse([]byte(configHeader + tc.doc + "\n"))
		if err != nil {
			t.Fatalf("%s: %v", tc.doc, err)
		}
		policy, err := sysctlPolicy(&c.Sysctls, nil)
		if err != nil {
			t.Fatalf("%s: %v", tc.doc, err)
		}
		_, _, err = policy.Complete(sysctl.Pod{}, pod)
		switch {
		case tc.why == "" && err != nil:
			t.Errorf("%s: refused: %v", tc.doc, err)
		case tc.why != "" && (err == nil || !strings.Contains(err.Error(), tc.why)):
			t.Errorf("%s: got %v, want a refusal for %q", tc.doc, err, tc.why)
		}
	}
}
