package compat

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/apimachinery/pkg/util/wait"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	criapitesting "k8s.io/cri-api/pkg/apis/testing"
	"k8s.io/cri-client/pkg/fake"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
)

// The kubelet's and the runtime's versions are logged against the tested range, with a
// warning outside it, and exported as podgate_peer_version_info.
func TestPeerVersions(t *testing.T) {
	logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true)))
	ctx := klog.NewContext(t.Context(), logger)
	p := NewPeers(prometheus.NewRegistry())
	p.See(ctx, "kubelet", "kubelet", Kubelet.Check("v1.37.2"))
	p.See(ctx, "kubelet", "kubelet", Kubelet.Check("v1.33.1"))
	p.ReadRuntime(ctx, fakeRuntime(t), wait.Backoff{Duration: time.Millisecond, Steps: 100})

	for _, want := range []struct {
		labels []string
		value  float64
	}{
		{[]string{"kubelet", "kubelet", "v1.37.2", "true"}, 1},
		{[]string{"kubelet", "kubelet", "v1.33.1", "false"}, 1},
		{[]string{"runtime", criapitesting.FakeRuntimeName, criapitesting.FakeVersion, "false"}, 1},
	} {
		if got := testutil.ToFloat64(p.info.WithLabelValues(want.labels...)); got != want.value {
			t.Errorf("podgate_peer_version_info%v = %v, want %v", want.labels, got, want.value)
		}
	}
	if n := testutil.CollectAndCount(p.info); n != 3 {
		t.Errorf("podgate_peer_version_info has %d series, want 3", n)
	}

	logs := logger.GetSink().(ktesting.Underlier).GetBuffer().String()
	for _, want := range []string{
		`INFO Peer version component="kubelet" name="kubelet" version="v1.37.2" tested=true`,
		`ERROR Peer version outside podgate's tested range: podgate runs, untested component="kubelet" name="kubelet" version="v1.33.1" tested=false why="older than the tested kubelet 1.35–1.37"`,
		`ERROR Peer version outside podgate's tested range: podgate runs, untested component="runtime" name="fakeRuntime" version="0.1.0" tested=false why="runtime \"fakeRuntime\" is not tested (podgate is tested with containerd 2.3–2.4)"`,
	} {
		if !strings.Contains(logs, want) {
			t.Errorf("log lacks %s\nlog:\n%s", want, logs)
		}
	}
}

// fakeRuntime serves cri-client's fake runtime on a unix socket until the test ends, and returns
// a client of it.
func fakeRuntime(t *testing.T) runtimeapi.RuntimeServiceClient {
	t.Helper()
	path := filepath.Join(t.TempDir(), "rt.sock")
	f := fake.NewFakeRemoteRuntime()
	if err := f.Start("unix://" + path); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.Stop)
	conn, err := grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return runtimeapi.NewRuntimeServiceClient(conn)
}
