package agent

import (
	"strings"
	"testing"

	"github.com/podgate/podgate/agent/config"
)

// TestSysctlsSection: Validate checks the sysctls section by config's rules (verify) and, for
// the running kernel, the feature's (the pod policy, the node sysctls), reporting every error;
// a valid section passes. Each rule is tested where it is written.
func TestSysctlsSection(t *testing.T) {
	c, err := config.Parse([]byte(configHeader + `sysctls:
  verify: sometimes
  podDefaults: {kernel.core_pattern: core}
  node: {net.netfilter.no_such: "1"}
`))
	if err != nil {
		t.Fatal(err)
	}
	err = Validate(c)
	for _, w := range []string{"sysctls.verify:", "sysctls.podDefaults", "sysctls.node"} {
		if err == nil || !strings.Contains(err.Error(), w) {
			t.Errorf("Validate: %v, want an error with %q", err, w)
		}
	}
	c, err = config.Parse([]byte(configHeader + `sysctls:
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
}
