package config

import (
	"strings"
	"testing"
)

// TestSectionChecks: what the file alone tells of the imagePulls and sysctls sections (and the
// node name the pulls' Events report): each error names its key; a valid section passes. The
// features' own rules (registry hosts, sysctl names) are theirs to test.
func TestSectionChecks(t *testing.T) {
	for _, tc := range []struct {
		doc  string
		want string // "" = valid
	}{
		{"", ""},
		{"imagePulls: {maxParallel: 1}", ""},
		{"kubeconfig: /etc/podgate/kubeconfig\nnodeName: node-1", ""},
		{"imagePulls: {maxParallel: 0}", "imagePulls.maxParallel: must be positive"},
		{"imagePulls: {maxParallel: -2}", "imagePulls.maxParallel: must be positive, got -2"},
		{`imagePulls: {priorityLabel: "not a label"}`, "imagePulls.priorityLabel"},
		{"imagePulls: {priorityNamespaces: [Kube_System]}", "imagePulls.priorityNamespaces[0]"},
		{"imagePulls: {maxParalel: 2}", `"maxParalel"`},
		{"nodeName: Node_1", `nodeName: "Node_1"`},
		{"sysctls: {verify: sometimes}", "sysctls.verify:"},
		{"sysctls: {podDefault: {}}", `unknown field "podDefault"`},
	} {
		c, err := Parse([]byte(header + tc.doc + "\n"))
		if err == nil {
			err = c.Validate()
		}
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v", tc.doc, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: got %v, want an error with %q", tc.doc, err, tc.want)
		}
	}
	c, err := Parse([]byte(header))
	if err != nil {
		t.Fatal(err)
	}
	if c.Sysctls.Verify != VerifyRepair {
		t.Errorf("verify defaults to %q, want repair", c.Sysctls.Verify)
	}
}
