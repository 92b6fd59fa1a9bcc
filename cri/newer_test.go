package cri

import (
	"bytes"
	"context"
	"path/filepath"
	"testing"

	"github.com/containerd/errdefs"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podgate/podgate/test/testfs"
)

// profileRequest is a PullSecurityProfileRequest of cri-api v0.38: PullImageRequest's fields 1
// to 3, profile_kind (4) Seccomp, and a field 99 no CRI has.
func profileRequest(t *testing.T) []byte {
	t.Helper()
	b, err := proto.Marshal(&runtimeapi.PullImageRequest{
		Image:         &runtimeapi.ImageSpec{Image: "example.com/p@sha256:2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae"},
		Auth:          &runtimeapi.AuthConfig{Username: "u", Password: "p"},
		SandboxConfig: &runtimeapi.PodSandboxConfig{Metadata: &runtimeapi.PodSandboxMetadata{Name: "web", Namespace: "ns", Uid: "uid"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	b = protowire.AppendVarint(protowire.AppendTag(b, 4, protowire.VarintType), 1)
	return protowire.AppendString(protowire.AppendTag(b, 99, protowire.BytesType), "future")
}

// TestRawMethod: a RawMethod's hook gets the request's bytes as the client sent them, the
// backend gets them byte for byte through next, and the client the backend's answer as it
// came; the hook's refusal and its own answer reach the client instead. A malformed request,
// or one with a list no kubelet sends, is refused InvalidArgument with the method's refusal
// word before the hook runs, and nothing reaches the backend. The method is counted under its
// name, as are the newer methods that only pass through, which are served as unary calls.
func TestRawMethod(t *testing.T) {
	be := newTestRuntime(t, filepath.Join(testfs.ShortDir(t), "rt.sock"))
	reg := prometheus.NewRegistry()
	var hook func(ctx context.Context, req []byte, next RawForward) ([]byte, error)
	var hooked [][]byte
	srv, conn := proxyFor(t, be.path, "", func(s *Server) {
		s.metrics = NewMetrics(reg)
		InterceptRaw(s, PullSecurityProfile, func(ctx context.Context, req []byte, next RawForward) ([]byte, error) {
			hooked = append(hooked, bytes.Clone(req))
			return hook(ctx, req, next)
		})
	})
	call := func(method string, req []byte) ([]byte, error) {
		var resp frame
		err := conn.Invoke(t.Context(), "/runtime.v1.ImageService/"+method, frameOf(req), &resp, grpc.ForceCodecV2(newRawCodec()))
		if err != nil {
			return nil, err
		}
		return resp.bytes(), nil
	}
	req := profileRequest(t)

	t.Run("forwarded byte for byte", func(t *testing.T) {
		hook, hooked = func(ctx context.Context, _ []byte, next RawForward) ([]byte, error) { return next(ctx) }, nil
		got, err := call("PullSecurityProfile", req)
		if err != nil {
			t.Fatal(err)
		}
		be.mu.Lock()
		method, body := be.rawMethod, be.rawBody
		be.mu.Unlock()
		if method != PullSecurityProfile.FullName() || !bytes.Equal(body, req) {
			t.Errorf("backend got %s %x, want %s %x", method, body, PullSecurityProfile.FullName(), req)
		}
		if !bytes.Equal(got, req) { // the test runtime echoes the request
			t.Errorf("client got %x, want the backend's %x", got, req)
		}
		if len(hooked) != 1 || !bytes.Equal(hooked[0], req) {
			t.Errorf("hook got %x, want %x", hooked, req)
		}
	})
	t.Run("the hook's refusal and answer", func(t *testing.T) {
		calls := be.calls.Load()
		hook = func(context.Context, []byte, RawForward) ([]byte, error) {
			return nil, &classError{class: errdefs.ErrAborted, msg: "pod gone"}
		}
		if _, err := call("PullSecurityProfile", req); status.Code(err) != codes.Aborted || status.Convert(err).Message() != "pod gone" {
			t.Errorf("refused by the hook: %v, want Aborted \"pod gone\"", err)
		}
		hook = func(context.Context, []byte, RawForward) ([]byte, error) { return []byte{0x08, 0x01}, nil }
		if got, err := call("PullSecurityProfile", req); err != nil || !bytes.Equal(got, []byte{0x08, 0x01}) {
			t.Errorf("answered by the hook: %x, %v; want 0801", got, err)
		}
		if n := be.calls.Load() - calls; n != 0 {
			t.Errorf("backend got %d calls, want 0", n)
		}
	})
	t.Run("refused before the hook", func(t *testing.T) {
		calls := be.calls.Load()
		hook, hooked = func(ctx context.Context, _ []byte, next RawForward) ([]byte, error) { return next(ctx) }, nil
		annotations := fieldNum(t, PullSecurityProfile.shape, "sandbox_config.annotations")
		for _, tc := range []struct {
			name string
			msg  []byte
			want string
		}{
			{"truncated", req[:5], "SecurityProfileInvalid: decode PullSecurityProfile request: unexpected EOF"},
			{"300,000 annotations", nested(annotations, repeated(annotations[len(annotations)-1], 300000, mapEntry("a", ""))),
				"SecurityProfileInvalid: decode PullSecurityProfile request: sandbox_config.annotations: 300000 entries, at most 262144"},
		} {
			_, err := call("PullSecurityProfile", tc.msg)
			if st := status.Convert(err); st.Code() != codes.InvalidArgument || st.Message() != tc.want {
				t.Errorf("%s: %v, want InvalidArgument %q", tc.name, err, tc.want)
			}
		}
		if len(hooked) != 0 || be.calls.Load() != calls {
			t.Errorf("hook ran %d times, backend got %d calls; want none", len(hooked), be.calls.Load()-calls)
		}
	})
	t.Run("newer methods pass through", func(t *testing.T) {
		for _, m := range []string{"ListSecurityProfiles", "RemoveSecurityProfile"} {
			body := []byte("\x0a\x06sha256")
			if got, err := call(m, body); err != nil || !bytes.Equal(got, body) {
				t.Errorf("%s: %x, %v; want the backend's echo %x", m, got, err, body)
			}
			if !srv.unary["/runtime.v1.ImageService/"+m] {
				t.Errorf("%s is not served as a unary call", m)
			}
		}
	})
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		method, code string
		want         float64
	}{
		{"PullSecurityProfile", "OK", 2}, {"PullSecurityProfile", "Aborted", 1}, {"PullSecurityProfile", "InvalidArgument", 2},
		{"ListSecurityProfiles", "OK", 1}, {"RemoveSecurityProfile", "OK", 1}, {"other", "OK", 0},
	} {
		if got := metricValue(mfs, "podgate_cri_requests_total", map[string]string{"method": tt.method, "code": tt.code}); got != tt.want {
			t.Errorf("podgate_cri_requests_total{method=%s,code=%s} = %v, want %v", tt.method, tt.code, got, tt.want)
		}
	}
}

// TestInterceptRawTwice: a RawMethod has one hook; a second is a programming error.
func TestInterceptRawTwice(t *testing.T) {
	be := newTestRuntime(t, filepath.Join(testfs.ShortDir(t), "rt.sock"))
	rt, err := NewBackend(t.Context(), "runtime", be.path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close() })
	s := NewServer(rt, rt)
	hook := func(ctx context.Context, _ []byte, next RawForward) ([]byte, error) { return next(ctx) }
	InterceptRaw(s, PullSecurityProfile, hook)
	defer func() {
		if r := recover(); r == nil {
			t.Error("a second hook was taken")
		}
	}()
	InterceptRaw(s, PullSecurityProfile, hook)
}
