package main

import (
	"strings"
	"testing"
)

// TestReleaseStartupPages: the binary's resident pages go down, and the process goes on
// running code and reading data of the binary, which the kernel maps back.
func TestReleaseStartupPages(t *testing.T) {
	before, after, err := releaseStartupPages()
	if err != nil {
		t.Fatal(err)
	}
	if before <= 0 || after >= before {
		t.Fatalf("RssFile %d KiB before, %d after: want fewer after", before, after)
	}
	t.Logf("RssFile %d KiB before, %d after", before, after)
	// Code and read-only data of the binary work as before: a whole command runs.
	var stdout, stderr strings.Builder
	if code := run([]string{"config", "defaults"}, &stdout, &stderr); code != 0 || !strings.Contains(stdout.String(), "kind: AgentConfiguration") {
		t.Fatalf("podgate config defaults after the release: exit %d, %q, %q", code, stdout.String(), stderr.String())
	}
}
