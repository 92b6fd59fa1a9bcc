package e2e

import (
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/cri-client/pkg/fake"

	"github.com/podgate/podgate/test/crifake"
	"github.com/podgate/podgate/test/testfs"
)

// e2eProfileReq is a PullSecurityProfileRequest as the kubelet 1.38 sends it: a seccomp
// profile named name on registry.example.com, for pod name.
func e2eProfileReq(name string) crifake.ProfileRequest {
	ref := fmt.Sprintf("registry.example.com/profiles/%s@sha256:%x", name, sha256.Sum256([]byte(name)))
	return crifake.ProfileRequest{
		PullImageRequest: &runtimeapi.PullImageRequest{
			Image:         &runtimeapi.ImageSpec{Image: ref, UserSpecifiedImage: ref},
			SandboxConfig: &runtimeapi.PodSandboxConfig{Metadata: &runtimeapi.PodSandboxMetadata{Namespace: "default", Name: name, Uid: "uid-" + name}},
		},
		Kind: crifake.SeccompKind,
	}
}

// profileClient is a client of the CRI endpoint's security-profile methods.
func profileClient(t testing.TB, endpoint string) crifake.ProfileClient {
	t.Helper()
	conn, err := grpc.NewClient(endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return crifake.ProfileClient{Conn: conn}
}

// TestSecurityProfilePullsUnderMaxParallel is issue 48's measurement, through the podgate
// binary: in front of a fake Kubernetes 1.38 runtime (cri-api v0.38's security-profile methods
// on a real gRPC server, test/crifake) with imagePulls.maxParallel 2, six concurrent
// PullSecurityProfile calls, each taking the runtime 1 s. Before podgate governed them, all six
// reached the runtime at once, counted as method="other"; now at most two at once, each
// answered, counted under its name and under kind="security_profile". It needs root (podgate
// runs as root), not the rig.
func TestSecurityProfilePullsUnderMaxParallel(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: podgate runs as root")
	}
	var mu sync.Mutex
	active, most := 0, 0
	profiles := &crifake.Profiles{Before: func(ctx context.Context, _ crifake.ProfileRequest) error {
		mu.Lock()
		active++
		most = max(most, active)
		mu.Unlock()
		defer func() {
			mu.Lock()
			active--
			mu.Unlock()
		}()
		select {
		case <-time.After(time.Second): // the pull's own time: the workload
			return nil
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		}
	}}
	rt := fake.NewFakeRemoteRuntime()
	sock := filepath.Join(testfs.ShortDir(t), "rt.sock")
	crifake.ServeImages(t, sock, rt, &crifake.Images{ImageServiceServer: rt, ProfileServer: profiles})
	pg := startPodgate(t, "unix://"+sock, "--config", writeConfig(t, "imagePulls:\n  maxParallel: 2\n"))
	client := profileClient(t, pg.Endpoint)

	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	errs := make(chan error, 6)
	start := time.Now()
	for i := range 6 {
		go func() {
			_, err := client.PullSecurityProfile(ctx, e2eProfileReq(fmt.Sprint("p", i)))
			errs <- err
		}()
	}
	for range 6 {
		if err := <-errs; err != nil {
			t.Errorf("PullSecurityProfile: %v", err)
		}
	}
	took := time.Since(start)
	mu.Lock()
	t.Logf("6 profile pulls of 1 s through podgate, maxParallel 2: at most %d at the runtime at once; all answered in %s", most, took.Round(10*time.Millisecond))
	if most != 2 {
		t.Errorf("the runtime served %d profile pulls at once, want 2 (imagePulls.maxParallel)", most)
	}
	mu.Unlock()
	m, err := pg.Scrape(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"podgate_cri_requests_total", []string{"method", "PullSecurityProfile", "code", "OK"}, 6},
		{"podgate_cri_requests_total", []string{"method", "other", "code", "OK"}, 0},
	} {
		if got, _ := m.Value(s.name, s.labels...); got != s.want {
			t.Errorf("%s%v = %v, want %v", s.name, s.labels, got, s.want)
		}
	}
	if h := m.Histogram("podgate_image_pull_duration_seconds", "kind", "security_profile", "result", "success"); h.Count != 6 {
		t.Errorf("podgate_image_pull_duration_seconds{kind=security_profile,result=success}: %d pulls, want 6", h.Count)
	}
}

// TestSecurityProfileUnimplementedByContainerd: containerd 2.3 and 2.4 have no security-profile
// calls (cri-api v0.38); what they answer reaches the kubelet through podgate as it does
// directly, code and message: Unimplemented, which a 1.38 kubelet does not retry.
// PullSecurityProfile goes through podgate's governor first (a slot, then containerd's
// answer), ListSecurityProfiles and RemoveSecurityProfile straight through; each is counted
// under its name.
func TestSecurityProfileUnimplementedByContainerd(t *testing.T) {
	n := startNode(t)
	direct, through := profileClient(t, n.rig.Endpoint), profileClient(t, n.podgate.Endpoint)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	calls := map[string]func(c crifake.ProfileClient) error{
		"PullSecurityProfile": func(c crifake.ProfileClient) error {
			_, err := c.PullSecurityProfile(ctx, e2eProfileReq("strict"))
			return err
		},
		"ListSecurityProfiles": func(c crifake.ProfileClient) error {
			_, err := c.ListSecurityProfiles(ctx)
			return err
		},
		"RemoveSecurityProfile": func(c crifake.ProfileClient) error {
			return c.RemoveSecurityProfile(ctx, "sha256:2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae")
		},
	}
	for method, call := range calls {
		want, got := status.Convert(call(direct)), status.Convert(call(through))
		t.Logf("%s: containerd answers %s %q; through podgate %s %q", method, want.Code(), want.Message(), got.Code(), got.Message())
		if want.Code() != codes.Unimplemented {
			t.Errorf("%s: containerd answered %v; this test expects a containerd without the call (2.3, 2.4)", method, want.Err())
		}
		if !proto.Equal(got.Proto(), want.Proto()) {
			t.Errorf("%s through podgate: %v, want containerd's own %v", method, got.Proto(), want.Proto())
		}
	}
	m, err := n.podgate.Scrape(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for method := range calls {
		if v, _ := m.Value("podgate_cri_requests_total", "method", method, "code", "Unimplemented"); v != 1 {
			t.Errorf("podgate_cri_requests_total{method=%q,code=Unimplemented} = %v, want 1", method, v)
		}
	}
	if h := m.Histogram("podgate_image_pull_duration_seconds", "kind", "security_profile", "result", "error"); h.Count != 1 {
		t.Errorf("podgate_image_pull_duration_seconds{kind=security_profile,result=error}: %d pulls, want 1 (the governor's)", h.Count)
	}
}
