package main

import (
	"bytes"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/podgate/podgate/podresources/api/v1alpha1"
)

// TestPullsShowTheirKind: podgate pulls ends each row with the pull's kind, a security
// profile's (Kubernetes 1.38's PullSecurityProfile) apart from an image's, and an older
// podgate's pull, which says none, as an image; podgate pod says it of a profile's pull.
func TestPullsShowTheirKind(t *testing.T) {
	now := time.Now()
	since := timestamppb.New(now.Add(-time.Minute))
	pulls := []*pb.ImagePull{
		{Image: "registry.example.com/app:1", Kind: "image", State: pb.ImagePull_PULLING, PodNamespace: "default", PodName: "web", Since: since, Started: since},
		{Image: "registry.example.com/seccomp@sha256:1234", Kind: "security_profile", State: pb.ImagePull_QUEUED, PodNamespace: "default", PodName: "web",
			Since: since, Position: 1, Queued: 1, WaitingFor: "node", MaxParallel: 1, InFlight: 1},
		{Image: "registry.example.com/old:1", State: pb.ImagePull_PULLING, PodNamespace: "default", PodName: "old", Since: since, Started: since},
	}
	var out bytes.Buffer
	w := tabwriter.NewWriter(&out, 0, 8, 3, ' ', 0) // as print makes it
	pullsTable(w, pulls, now)
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	want := [][2]string{
		{"POD", "KIND"},
		{"default/web   registry.example.com/app:1", " image"},
		{"default/web   registry.example.com/seccomp@sha256:1234", " security_profile"},
		{"default/old   registry.example.com/old:1", " image"},
	}
	if len(lines) != len(want) {
		t.Fatalf("%d lines, want %d:\n%s", len(lines), len(want), out.String())
	}
	for i, w := range want {
		if !strings.HasPrefix(lines[i], w[0]) || !strings.HasSuffix(strings.TrimRight(lines[i], " "), w[1]) {
			t.Errorf("line %d %q: want it to start %q and end %q", i, lines[i], w[0], w[1])
		}
	}

	out.Reset()
	w = tabwriter.NewWriter(&out, 0, 8, 3, ' ', 0) // as print makes it
	describePod(w, &pb.Pod{Name: "web", Namespace: "default", ImagePulls: pulls[:2]}, now)
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"registry.example.com/app:1", "Pulling", "registry.example.com/seccomp@sha256:1234", "security_profile, Queued, place 1 of 1"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("podgate pod lacks %q:\n%s", want, out.String())
		}
	}
	if strings.Contains(out.String(), "image, Pulling") {
		t.Errorf("podgate pod names the kind of an image pull:\n%s", out.String())
	}
}
