package e2e

import (
	"os"
	"testing"
	"time"

	"github.com/podgate/podgate/test/harness"
	"github.com/podgate/podgate/test/rig"
	"github.com/podgate/podgate/test/testfs"
)

// podgateBin is the podgate binary built once for the package's tests.
var podgateBin string

func TestMain(m *testing.M) {
	os.Exit(harness.RunTests(m, &podgateBin, true))
}

// node is a real containerd with podgate in front of it.
type node struct {
	rig     *rig.Rig
	podgate *harness.Podgate
	// direct talks to containerd, through talks to podgate: the kubelet's view.
	direct, through *rig.Client
}

// startNode starts a rig and podgate in front of it; both stop at the test's end.
func startNode(t testing.TB, args ...string) *node {
	t.Helper()
	r := rig.Start(t)
	p := startPodgate(t, r.Endpoint, args...)
	return &node{rig: r, podgate: p, direct: rig.Connect(t, r.Endpoint), through: rig.Connect(t, p.Endpoint)}
}

// startPodgate starts podgate in front of the runtime at endpoint; it stops at the test's end.
func startPodgate(t testing.TB, endpoint string, args ...string) *harness.Podgate {
	t.Helper()
	p, err := harness.Start(t.Context(), podgateBin, harness.Options{Dir: testfs.ShortDir(t), RuntimeEndpoint: endpoint, Args: args})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		code, err := p.Stop(30 * time.Second)
		if err != nil || code != 0 {
			t.Errorf("podgate stop: exit %d, %v", code, err)
		}
		if t.Failed() {
			t.Logf("podgate log:\n%s", p.Log)
		}
	})
	return p
}
