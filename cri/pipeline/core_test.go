package pipeline_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	apitest "k8s.io/cri-api/pkg/apis/testing"

	"github.com/podgate/podgate/cri/pipeline"
	"github.com/podgate/podgate/cri/registry"
	"github.com/podgate/podgate/test/crifake"
)

// sameJSON reports whether a and b encode to the same JSON: what the checkpoint would hold.
func sameJSON(t *testing.T, a, b any) bool {
	t.Helper()
	ja, err := json.Marshal(a)
	if err != nil {
		t.Fatal(err)
	}
	jb, err := json.Marshal(b)
	if err != nil {
		t.Fatal(err)
	}
	return bytes.Equal(ja, jb)
}

// TestRecordStopsAndForgets: the core stages record a started sandbox (its pod, ready, with the
// IPs of its status read after the answer) in the registry and its checkpoint; a stop marks it
// not ready, a remove (twice: it is idempotent) forgets it everywhere.
func TestRecordStopsAndForgets(t *testing.T) {
	r := newRig(t, rigOptions{}, coreAround(nil, nil))
	id, err := r.proxy.RunPod(t, "p")
	if err != nil {
		t.Fatal(err)
	}
	// The sandbox's status is read after the answer (no stage needed it before).
	if err := r.core.Wait(t.Context()); err != nil {
		t.Fatal(err)
	}
	rec, ok := r.registry.Sandbox(id)
	if !ok {
		t.Fatalf("sandbox %s not recorded", id)
	}
	if rec.Pod != (registry.PodRef{UID: "uid-p", Name: "p", Namespace: "ns"}) || rec.Origin != registry.OriginStarted || !rec.Ready || rec.CreatedAt.IsZero() {
		t.Errorf("record %+v", rec)
	}
	if len(rec.IPs) == 0 || rec.IPs[0] != apitest.FakePodSandboxIPs[0] {
		t.Errorf("record IPs %v, want the runtime's %v", rec.IPs, apitest.FakePodSandboxIPs)
	}
	if n := findMetric(t, r.metrics, "podgate_registry_sandboxes", "", "").GetGauge().GetValue(); n != 1 {
		t.Errorf("registry_sandboxes = %v, want 1", n)
	}
	r.registry.Flush()
	if onDisk, err := registry.NewCheckpoint(r.stateDir).Read(); err != nil || !sameJSON(t, onDisk, r.registry.Sandboxes()) {
		t.Errorf("checkpoint %+v (%v), want the registry %+v", onDisk, err, r.registry.Sandboxes())
	}
	ctx := t.Context()
	if _, err := r.proxy.Client.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: id}); err != nil {
		t.Fatal(err)
	}
	if rec, _ := r.registry.Sandbox(id); rec.Ready {
		t.Error("stopped sandbox still ready in the registry")
	}
	for range 2 { // Remove is idempotent
		if _, err := r.proxy.Client.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: id}); err != nil {
			t.Fatal(err)
		}
	}
	r.checkNothingLeft(t)
	if n := findMetric(t, r.metrics, "podgate_registry_sandboxes", "", "").GetGauge().GetValue(); n != 0 {
		t.Errorf("registry_sandboxes = %v, want 0", n)
	}
}

// TestCheckpointWriteFailureDoesNotFailPods: a sandbox record is no obligation: a pod starts
// even when its record cannot reach the disk, and the failure is reported.
func TestCheckpointWriteFailureDoesNotFailPods(t *testing.T) {
	failures := make(chan error, 10)
	r := newRig(t, rigOptions{registry: []registry.Option{registry.WithWriteErrors(func(err error) { failures <- err })}}, coreAround(nil, nil))
	// A directory where the checkpoint goes: renaming the new file over it fails.
	if err := os.Mkdir(filepath.Join(r.stateDir, registry.CheckpointFile), 0o700); err != nil {
		t.Fatal(err)
	}
	id, err := r.proxy.RunPod(t, "p")
	if err != nil {
		t.Fatalf("RunPodSandbox: %v", err)
	}
	if _, ok := r.registry.Sandbox(id); !ok {
		t.Error("sandbox not in the registry")
	}
	r.registry.Flush()
	select {
	case err := <-failures:
		if !strings.Contains(err.Error(), "pod registry") {
			t.Errorf("write failure %v does not say what failed", err)
		}
	default:
		t.Error("the failed write was not reported")
	}
}

// heldQuiet is a quiet wait that holds the status reads until released, and tells when one
// waits.
type heldQuiet struct {
	waiting chan struct{}
	release chan struct{}
}

func newHeldQuiet() *heldQuiet {
	return &heldQuiet{waiting: make(chan struct{}, 10), release: make(chan struct{})}
}

func (q *heldQuiet) wait(context.Context) error {
	q.waiting <- struct{}{}
	<-q.release
	return nil
}

// TestStatusReadAfterTheAnswer: without a stage that needs it during the call, the sandbox's
// status is read once the kubelet has its answer and the CRI server is quiet; a sandbox stopped
// and removed before then is not read, nor recorded again.
func TestStatusReadAfterTheAnswer(t *testing.T) {
	t.Run("read", func(t *testing.T) {
		q := newHeldQuiet()
		r := newRig(t, rigOptions{quiet: q.wait}, coreAround(nil, nil))
		id, err := r.proxy.RunPod(t, "p")
		if err != nil {
			t.Fatal(err)
		}
		<-q.waiting
		if rec, _ := r.registry.Sandbox(id); len(rec.IPs) != 0 || slices.Contains(r.runtime.RuntimeService.GetCalls(), "PodSandboxStatus") {
			t.Errorf("status read before the quiet: record IPs %v, runtime calls %v", rec.IPs, r.runtime.RuntimeService.GetCalls())
		}
		close(q.release)
		if err := r.core.Wait(t.Context()); err != nil {
			t.Fatal(err)
		}
		if rec, _ := r.registry.Sandbox(id); len(rec.IPs) == 0 {
			t.Errorf("record %+v after the status read, want the runtime's IPs", rec)
		}
	})
	t.Run("removed meanwhile", func(t *testing.T) {
		q := newHeldQuiet()
		r := newRig(t, rigOptions{quiet: q.wait}, coreAround(nil, nil))
		id, err := r.proxy.RunPod(t, "p")
		if err != nil {
			t.Fatal(err)
		}
		<-q.waiting
		ctx := t.Context()
		if _, err := r.proxy.Client.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: id}); err != nil {
			t.Fatal(err)
		}
		if _, err := r.proxy.Client.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: id}); err != nil {
			t.Fatal(err)
		}
		close(q.release)
		if err := r.core.Wait(ctx); err != nil {
			t.Fatal(err)
		}
		if slices.Contains(r.runtime.RuntimeService.GetCalls(), "PodSandboxStatus") {
			t.Error("the status of a removed sandbox was read")
		}
		r.checkNothingLeft(t)
	})
}

// needsNetns is a stage that needs the sandbox's network namespace during the call, as a
// sysctl verification with verify: fail or a device attach does.
func needsNetns(seen chan<- string) pipeline.Stage {
	return pipeline.Stage{Name: "needs-netns", Run: func(_ context.Context, sb *pipeline.Sandbox) error {
		if err := sb.FromRuntime(); err != nil {
			return fmt.Errorf("enter the network namespace of sandbox %s: %w", sb.Rec.ID, err)
		}
		seen <- sb.Rec.NetNS
		return nil
	}}
}

// TestStatusDuringTheCall: a stage that needs the sandbox's status during the call has it,
// read once; when the runtime does not give it, the kubelet gets the runtime's own code, not
// FailedPrecondition, with what podgate was doing in the message, and nothing is left.
func TestStatusDuringTheCall(t *testing.T) {
	seen := make(chan string, 1)
	rt := crifake.NewRuntime()
	rt.NetNS = "/var/run/netns/cni-test"
	r := newRig(t, rigOptions{runtime: rt}, coreAround(nil, []pipeline.Stage{needsNetns(seen)}))
	id, err := r.proxy.RunPod(t, "p")
	if err != nil {
		t.Fatal(err)
	}
	if got := <-seen; got != rt.NetNS {
		t.Errorf("stage saw netns %q, want the runtime's %q", got, rt.NetNS)
	}
	if err := r.core.Wait(t.Context()); err != nil {
		t.Fatal(err)
	}
	if rec, _ := r.registry.Sandbox(id); rec.NetNS != rt.NetNS {
		t.Errorf("record netns %q, want %q", rec.NetNS, rt.NetNS)
	}
	if n := strings.Count(strings.Join(rt.RuntimeService.GetCalls(), ","), "PodSandboxStatus"); n != 1 {
		t.Errorf("the runtime was asked for the status %d times, want once", n)
	}

	for _, code := range []codes.Code{codes.Unavailable, codes.DeadlineExceeded} {
		t.Run(code.String(), func(t *testing.T) {
			rt := crifake.NewRuntime()
			rt.StatusErr = status.Error(code, "containerd says no")
			r := newRig(t, rigOptions{runtime: rt}, coreAround(nil, []pipeline.Stage{needsNetns(make(chan string, 1))}))
			_, err := r.proxy.RunPod(t, "p")
			st := status.Convert(err)
			if st.Code() != code {
				t.Errorf("RunPodSandbox: code %s (%v), want containerd's %s", st.Code(), err, code)
			}
			if !strings.HasPrefix(st.Message(), "enter the network namespace of sandbox ") || !strings.HasSuffix(st.Message(), ": containerd says no") {
				t.Errorf("message %q: want what podgate was doing, then containerd's message", st.Message())
			}
			r.checkNothingLeft(t)
		})
	}
}

// TestStatusUnreadAfterTheAnswer: a status the runtime does not give after the answer fails
// nothing: the sandbox runs, and its record says why it has no namespace.
func TestStatusUnreadAfterTheAnswer(t *testing.T) {
	rt := crifake.NewRuntime()
	rt.StatusErr = status.Error(codes.Unavailable, "containerd says no")
	r := newRig(t, rigOptions{runtime: rt}, coreAround(nil, nil))
	id, err := r.proxy.RunPod(t, "p")
	if err != nil {
		t.Fatalf("RunPodSandbox: %v", err)
	}
	if err := r.core.Wait(t.Context()); err != nil {
		t.Fatal(err)
	}
	if rec, _ := r.registry.Sandbox(id); !rec.Ready || !strings.Contains(rec.Status, "containerd says no") {
		t.Errorf("record %+v, want it ready, with the runtime's error as its status", rec)
	}
}
