package main

import (
	"errors"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestVerdictNamesTheKubeletsFirstFailure: a kubelet-shaped client that missed a call breaks
// every attack's verdict, and the verdict says which call failed and how; one answered
// throughout breaks nothing; one that made no call breaks it too.
func TestVerdictNamesTheKubeletsFirstFailure(t *testing.T) {
	failed := status.Error(codes.Unavailable, "connection shed")
	cases := []struct {
		name   string
		probe  probed
		broken []string // what the verdict's one error must say; none when it holds
	}{
		{"answered throughout", probed{answered: 30, calls: 30}, nil},
		{"one call failed", probed{answered: 29, calls: 30, failed: failed}, []string{"29 of 30 answered within 10s", "connection shed"}},
		{"no call made", probed{}, []string{"0 of 0 answered"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			errs := verdict(attack{name: c.name}, outcome{kubelet: c.probe})
			if len(c.broken) == 0 {
				if len(errs) != 0 {
					t.Fatalf("verdict: %v, want none", errs)
				}
				return
			}
			if len(errs) != 1 {
				t.Fatalf("verdict: %v, want one error", errs)
			}
			for _, want := range c.broken {
				if !strings.Contains(errs[0].Error(), want) {
					t.Errorf("verdict %q does not say %q", errs[0], want)
				}
			}
			if c.probe.failed != nil && !errors.Is(errs[0], c.probe.failed) {
				t.Errorf("verdict %q does not wrap the failure %q", errs[0], c.probe.failed)
			}
		})
	}
}

// TestKubeletProbeRecordsFirstFailure: the kubelet-shaped client, pointed at a socket nobody
// serves, counts its calls as made and unanswered and keeps the first failure.
func TestKubeletProbeRecordsFirstFailure(t *testing.T) {
	k, err := startKubelet(t.TempDir() + "/nobody.sock")
	if err != nil {
		t.Fatal(err)
	}
	if err := k.waitCalls(2); err != nil {
		t.Fatal(err)
	}
	p := k.finish()
	if p.calls < 2 || p.answered != 0 {
		t.Fatalf("probe: %d of %d answered, want 0 of at least 2", p.answered, p.calls)
	}
	if status.Code(errors.Unwrap(p.failed)) != codes.Unavailable || !strings.Contains(p.failed.Error(), "call 1 failed") {
		t.Fatalf("first failure %v, want call 1 Unavailable", p.failed)
	}
}
