package agent

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	criapitesting "k8s.io/cri-api/pkg/apis/testing"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"

	"github.com/podgate/podgate/agent/compat"
	"github.com/podgate/podgate/agent/config"
)

// The kubelet's and the runtime's versions are logged against the tested range, with a
// warning outside it, and exported as podgate_peer_version_info.
func TestPeerVersions(t *testing.T) {
	logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true)))
	ctx := klog.NewContext(t.Context(), logger)
	a := New(config.DefaultConfiguration(), "test")
	a.seeVersion(ctx, "kubelet", "kubelet", compat.Kubelet.Check("v1.37.2"))
	a.seeVersion(ctx, "kubelet", "kubelet", compat.Kubelet.Check("v1.33.1"))

	_, socket := startFakeRuntime(t, t.TempDir())
	a.readRuntimeVersion(ctx, criClient(t, socket))

	for _, want := range []struct {
		labels []string
		value  float64
	}{
		{[]string{"kubelet", "kubelet", "v1.37.2", "true"}, 1},
		{[]string{"kubelet", "kubelet", "v1.33.1", "false"}, 1},
		{[]string{"runtime", criapitesting.FakeRuntimeName, criapitesting.FakeVersion, "false"}, 1},
	} {
		if got := testutil.ToFloat64(a.peerVersions.WithLabelValues(want.labels...)); got != want.value {
			t.Errorf("podgate_peer_version_info%v = %v, want %v", want.labels, got, want.value)
		}
	}
	if n := testutil.CollectAndCount(a.peerVersions); n != 3 {
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
