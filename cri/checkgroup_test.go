package cri

import (
	"os/user"
	"strings"
	"testing"
)

// missingGID is a group id no group on this machine has.
func missingGID(t *testing.T) string {
	t.Helper()
	for _, g := range []string{"2147483646", "987654321", "55555"} {
		if _, err := user.LookupGroupId(g); err != nil {
			return g
		}
	}
	t.Skip("every candidate gid exists on this machine")
	return ""
}

// TestCheckSocketGroup: a socket's group is a group name or id this machine has; none (empty)
// is fine; an unknown one is named.
func TestCheckSocketGroup(t *testing.T) {
	for _, g := range []string{"", "root", "0"} {
		if err := CheckSocketGroup(g); err != nil {
			t.Errorf("group %q: %v", g, err)
		}
	}
	for _, g := range []string{"podgate-no-such-group", missingGID(t)} {
		if err := CheckSocketGroup(g); err == nil || !strings.Contains(err.Error(), `group "`+g+`": not found`) {
			t.Errorf("group %q: %v, want it not found", g, err)
		}
	}
}
