package cri

import (
	"context"
	"net"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podgate/podgate/test/testfs"
)

// TestOversizedMessageDoesNotHurtOthers: a request over the 16 MiB limit is refused with
// ResourceExhausted, by podgate on the intercepted path and by the runtime (as without podgate)
// on the passthrough path, and the same connection and the kubelet's own go on working.
func TestOversizedMessageDoesNotHurtOthers(t *testing.T) {
	be := newTestRuntime(t, filepath.Join(testfs.ShortDir(t), "rt.sock"))
	_, hostile := proxyFor(t, be.path, "", func(s *Server) { passThrough(s, RunPodSandbox) })
	kubelet := runtimeapi.NewRuntimeServiceClient(dial(t, strings.TrimPrefix(hostile.Target(), "unix://")))
	big := make([]byte, MaxMessageSize+1)
	for _, m := range []string{RunPodSandbox.FullName(), "/runtime.v1.RuntimeService/Version"} {
		var resp frame
		err := hostile.Invoke(t.Context(), m, frameOf(big), &resp, grpc.ForceCodecV2(newRawCodec()),
			grpc.MaxCallSendMsgSize(64<<20))
		if status.Code(err) != codes.ResourceExhausted {
			t.Errorf("%s with %d bytes: %v, want ResourceExhausted", m, len(big), err)
		}
	}
	if _, err := runtimeapi.NewRuntimeServiceClient(hostile).Version(t.Context(), &runtimeapi.VersionRequest{}); err != nil {
		t.Errorf("the hostile client's own next call: %v", err)
	}
	if _, err := kubelet.Version(t.Context(), &runtimeapi.VersionRequest{}); err != nil {
		t.Errorf("the kubelet's call: %v", err)
	}
}

// TestIdleConnectionsDoNotHurtTheKubelet: thousands of connections that never speak (no HTTP/2
// preface) or sit idle after it do not keep podgate from answering the kubelet promptly.
func TestIdleConnectionsDoNotHurtTheKubelet(t *testing.T) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	// Each idle connection costs this process two descriptors (its end and podgate's).
	n := min(2000, int(lim.Cur-300)/2)
	if n < 500 {
		t.Skipf("RLIMIT_NOFILE %d leaves room for %d idle connections; want at least 500", lim.Cur, n)
	}
	be := newTestRuntime(t, filepath.Join(testfs.ShortDir(t), "rt.sock"))
	_, conn := proxyFor(t, be.path, "", nil)
	sock := strings.TrimPrefix(conn.Target(), "unix://")
	for i := range n {
		c, err := net.Dial("unix", sock)
		if err != nil {
			t.Fatalf("idle connection %d: %v", i, err)
		}
		t.Cleanup(func() { c.Close() })
		if i%2 == 1 { // half of them say the HTTP/2 preface, then nothing
			if _, err := c.Write([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")); err != nil {
				t.Fatal(err)
			}
		}
	}
	kubelet := runtimeapi.NewRuntimeServiceClient(dial(t, sock))
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	start := time.Now()
	if _, err := kubelet.Version(ctx, &runtimeapi.VersionRequest{}); err != nil {
		t.Fatalf("the kubelet's call with %d idle connections open: %v", n, err)
	}
	t.Logf("the kubelet's first call with %d idle connections open took %s", n, time.Since(start))
}
