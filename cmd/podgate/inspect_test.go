package main

import (
	"bytes"
	"context"
	"encoding/json"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/podgate/podgate/cri"
	"github.com/podgate/podgate/podresources"
	pb "github.com/podgate/podgate/podresources/api/v1alpha1"
	"github.com/podgate/podgate/test/testfs"
)

// fakeSource is what a running podgate knows: one pod with a sandbox, and two pulls.
type fakeSource struct{ since time.Time }

func (f fakeSource) pod() *pb.Pod {
	return &pb.Pod{Uid: "uid-web", Name: "web", Namespace: "default",
		Sandbox: &pb.Sandbox{Id: "0123456789abcdef0123", State: pb.Sandbox_READY, Ips: []string{"10.0.0.5"},
			CreatedAt: timestamppb.New(f.since), Sysctls: &pb.Sysctls{Verification: "ok", Applied: map[string]string{"net.core.somaxconn": "1024"}}},
		ImagePulls: f.Pulls("default", "web")}
}

func (f fakeSource) Pods() ([]*pb.Pod, uint64) { return []*pb.Pod{f.pod()}, 1 }

func (f fakeSource) Pod(ns, name string) (*pb.Pod, bool) {
	if ns == "default" && name == "web" {
		return f.pod(), true
	}
	return nil, false
}

func (f fakeSource) Containers(*pb.Pod) ([]podresources.Container, bool) { return nil, false }

func (f fakeSource) Pulls(ns, name string) []*pb.ImagePull {
	all := []*pb.ImagePull{
		{Image: "registry.example.com/big:1", State: pb.ImagePull_PULLING, PodNamespace: "default", PodName: "db",
			Since: timestamppb.New(f.since), Started: timestamppb.New(f.since.Add(2 * time.Second)),
			BytesDone: 3 << 20, BytesTotal: 12 << 20, BytesPerSecond: 1 << 20,
			StallMinBytesPerSecond: 1 << 10, StallWindow: durationpb.New(5 * time.Minute), StallingFor: durationpb.New(40 * time.Second), StallBytesPerSecond: 210},
		{Image: "registry.example.com/app:1", State: pb.ImagePull_QUEUED, PodNamespace: "default", PodName: "web",
			Since: timestamppb.New(f.since), Position: 1, Queued: 2, WaitingFor: "node", MaxParallel: 1, InFlight: 1},
		{Image: "docker.io/library/redis:7", State: pb.ImagePull_QUEUED, PodNamespace: "default", PodName: "web", Registry: "docker.io",
			Since: timestamppb.New(f.since), Position: 2, Queued: 2, WaitingFor: "cool-down", PushBackCode: 429, Probing: true, PushBacks: 2,
			CoolingSince: timestamppb.New(time.Date(2026, 12, 8, 10, 0, 0, 0, time.UTC)), HeldUntil: timestamppb.New(time.Date(2026, 12, 8, 10, 5, 0, 0, time.UTC))},
	}
	if ns == "" {
		return all
	}
	var out []*pb.ImagePull
	for _, p := range all {
		if p.GetPodNamespace() == ns && p.GetPodName() == name {
			out = append(out, p)
		}
	}
	return out
}

// servePodResources serves podgate's PodResources socket on fakeSource until the test ends.
func servePodResources(t *testing.T) string {
	t.Helper()
	src := fakeSource{since: time.Now().Add(-time.Minute)}
	s, err := podresources.NewServer(podresources.Options{Source: src, Pulls: src})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(testfs.ShortDir(t), "pr.sock")
	l, err := cri.Listen(path, cri.SocketOptions{Mode: 0o600})
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- s.Serve(l) }()
	t.Cleanup(func() {
		s.Shutdown(context.Background())
		if err := <-served; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return path
}

// TestInspectCommands runs pods, pod and pulls against a PodResources server, as a person
// would: tables by default, JSON and YAML on request; bad input says what is wrong, with
// exit status 2 for a usage error and 1 when podgate cannot answer.
func TestInspectCommands(t *testing.T) {
	sock := servePodResources(t)
	tests := []struct {
		name   string
		args   []string
		code   int
		stdout []string // lines or fragments the output must hold
		stderr string
	}{
		{"pods", []string{"pods"}, 0, []string{
			"NAMESPACE   NAME   SANDBOX         STATE   SYSCTLS   CLAIMS   CONTAINERS   PULLS   AGE",
			"default     web    0123456789abc   Ready   ok        0/0      0            2       "}, ""},
		{"pods yaml", []string{"pods", "-o", "yaml"}, 0, []string{"pods:", "- image_pulls:", "  name: web", "    ips:", "    - 10.0.0.5"}, ""},
		{"pod", []string{"pod", "default/web"}, 0, []string{"Name:", "web", "Sandbox:", "0123456789abcdef0123", "net.core.somaxconn", "1024",
			"registry.example.com/app:1", "Queued, place 1 of 2, waiting for the node (1) cap",
			"docker.io/library/redis:7    Queued, place 2 of 2, waiting for docker.io's cool-down since 10:00:00Z (429, probing, refused 2 times; held until 10:05:00Z)"}, ""},
		{"pulls", []string{"pulls"}, 0, []string{
			"POD           IMAGE                        STATE     PLACE   WAITING FOR                          WAITED   PROGRESS         RATE       SHARED WITH",
			"default/db    registry.example.com/big:1   Pulling   -       -                                    2s       3.0MiB/12.0MiB   1.0MiB/s   -",
			"stalling: 210B/s < 1.0KiB/s for 40s of 5m",
			"default/web   registry.example.com/app:1   Queued    1/2     node (1)                             1m",
			"default/web   docker.io/library/redis:7    Queued    2/2     docker.io cool-down (429, probing)   1m"}, ""},
		// protojson's spacing varies from build to build on purpose: the JSON is compared
		// compacted (see below).
		{"pulls of a pod", []string{"pulls", "default/db", "-o", "json"}, 0, []string{`"pulls":[`, `"pod_name":"db"`, `"bytes_total":"12582912"`}, ""},
		{"unknown pod", []string{"pod", "default/nope"}, 1, nil, "podgate: pod default/nope: not known to podgate\n"},
		{"bad output", []string{"pods", "-o", "xml"}, 2, nil, `invalid output format "xml": want table, json or yaml`},
		{"pod without namespace", []string{"pod", "web"}, 2, nil, `"web": want NAMESPACE/NAME`},
		{"no podgate", []string{"pods", "--socket", "/nonexistent/pr.sock"}, 1, nil, "podgate: cannot reach podgate at /nonexistent/pr.sock (is podgate running"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := tt.args
			if !strings.Contains(strings.Join(args, " "), "--socket") {
				args = append(args, "--socket", sock)
			}
			var stdout, stderr bytes.Buffer
			code := run(args, &stdout, &stderr)
			if code != tt.code {
				t.Errorf("exit status %d, want %d; stderr %q", code, tt.code, stderr.String())
			}
			out := stdout.String()
			if slices.Contains(args, "json") {
				var compact bytes.Buffer
				if err := json.Compact(&compact, stdout.Bytes()); err != nil {
					t.Fatalf("-o json printed no JSON: %v\n%s", err, out)
				}
				out = compact.String()
			}
			for _, want := range tt.stdout {
				if !strings.Contains(out, want) {
					t.Errorf("output lacks %q:\n%s", want, stdout.String())
				}
			}
			if tt.stderr != "" && !strings.Contains(stderr.String(), tt.stderr) {
				t.Errorf("stderr %q, want %q", stderr.String(), tt.stderr)
			}
			if tt.code == 0 && stderr.Len() > 0 {
				t.Errorf("stderr %q on success", stderr.String())
			}
		})
	}
}

// TestInspectJSONIsTheMessage: -o json is the extension's message, as grpcurl shows it.
func TestInspectJSONIsTheMessage(t *testing.T) {
	sock := servePodResources(t)
	var stdout, stderr bytes.Buffer
	if code := run([]string{"pod", "default/web", "-o", "json", "--socket", sock}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit status %d: %s", code, stderr.String())
	}
	var p pb.Pod
	if err := protojson.Unmarshal(stdout.Bytes(), &p); err != nil {
		t.Fatal(err)
	}
	if p.GetName() != "web" || p.GetSandbox().GetId() != "0123456789abcdef0123" || len(p.GetImagePulls()) != 2 || p.GetImagePulls()[1].GetPushBackCode() != 429 {
		t.Errorf("pod %v", &p)
	}
}
