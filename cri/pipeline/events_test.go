package pipeline_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podgate/podgate/cri"
	"github.com/podgate/podgate/cri/pipeline"
	"github.com/podgate/podgate/cri/registry"
	"github.com/podgate/podgate/test/crifake"
)

// sandboxEvent is one Event the runner told a pod.
type sandboxEvent struct {
	pod                                registry.PodRef
	eventType, reason, action, message string
}

// eventsTo is an EventFunc that sends each Event to ch.
func eventsTo(ch chan<- sandboxEvent) pipeline.EventFunc {
	return func(pod registry.PodRef, eventType, reason, action, note string) {
		ch <- sandboxEvent{pod, eventType, reason, action, note}
	}
}

// TestHeldAndRefusedEvents: a stage of podgate's that holds a sandbox longer than heldAfter
// tells the pod which stage holds it and what it does; one that refuses it tells the pod which
// stage and why; the kubelet still gets the error with its class, and nothing is left.
func TestHeldAndRefusedEvents(t *testing.T) {
	events, held := make(chan sandboxEvent, 10), make(chan sandboxEvent, 1)
	prepare := pipeline.Stage{Name: "prepare", Holds: "the drivers prepare the pod's claims", RefusedReason: "FailedPrepare",
		Run: func(ctx context.Context, _ *pipeline.Sandbox) error {
			select { // held until the pod has been told so
			case e := <-events:
				held <- e
			case <-ctx.Done():
				return ctx.Err()
			}
			return fmt.Errorf("driver gpu.example.com: not registered: %w", errdefs.ErrUnavailable)
		}}
	r := newRig(t, rigOptions{runner: []pipeline.RunnerOption{pipeline.WithEvents(eventsTo(events), 50*time.Millisecond)}},
		coreAround([]pipeline.Stage{prepare}, nil))
	_, err := r.proxy.RunPod(t, "p")
	if status.Code(err) != codes.Unavailable {
		t.Errorf("RunPodSandbox = %v, want Unavailable", err)
	}
	pod := registry.PodRef{UID: "uid-p", Name: "p", Namespace: "ns"}
	want := sandboxEvent{pod, corev1.EventTypeNormal, "SandboxHeld", "Waiting",
		`podgate's stage "prepare" has held the pod sandbox for 50ms: the drivers prepare the pod's claims`}
	if e := <-held; e != want {
		t.Errorf("held Event %+v, want %+v", e, want)
	}
	want = sandboxEvent{pod, corev1.EventTypeWarning, "FailedPrepare", "RunPodSandbox",
		`podgate's stage "prepare" refused the pod sandbox: driver gpu.example.com: not registered: unavailable`}
	if e := <-events; e != want {
		t.Errorf("refused Event %+v, want %+v", e, want)
	}
	r.checkNothingLeft(t)
}

// TestNoEventsButPodgates: the runtime's failures are the kubelet's to report, a call the
// kubelet gave up was not refused, and a stage that never holds a sandbox (no Holds) is not
// reported however long it runs: no Event for any of them.
func TestNoEventsButPodgates(t *testing.T) {
	const heldAfter = 20 * time.Millisecond
	events := make(chan sandboxEvent, 10)
	run := func(t *testing.T, stages []pipeline.Stage, next cri.Forward[*runtimeapi.RunPodSandboxRequest, *runtimeapi.RunPodSandboxResponse]) error {
		t.Helper()
		p := pipeline.NewRunner(stages, registry.NewRegistry(nil, registry.CheckpointData{}), prometheus.NewRegistry(),
			pipeline.WithEvents(eventsTo(events), heldAfter))
		_, err := p.RunPodSandbox(t.Context(), &runtimeapi.RunPodSandboxRequest{Config: crifake.PodConfig("p")}, next)
		return err
	}
	refuses := func(err error) pipeline.Stage {
		return pipeline.Stage{Name: "refuses", RefusedReason: "Refused", Holds: "refusing",
			Run: func(context.Context, *pipeline.Sandbox) error { return err }}
	}
	t.Run("runtime", func(t *testing.T) {
		refused := status.Error(codes.Unavailable, "runtime says no")
		core := pipeline.NewCore(nil, nil, nil)
		err := run(t, []pipeline.Stage{core.Forward()}, func(context.Context, *runtimeapi.RunPodSandboxRequest) (*runtimeapi.RunPodSandboxResponse, error) {
			return nil, refused
		})
		if !errors.Is(err, refused) {
			t.Errorf("RunPodSandbox: %v, want the runtime's error", err)
		}
	})
	t.Run("given up", func(t *testing.T) {
		if err := run(t, []pipeline.Stage{refuses(fmt.Errorf("wait for the drivers: %w", context.Canceled))}, nil); !errors.Is(err, context.Canceled) {
			t.Errorf("RunPodSandbox: %v, want the stage's error", err)
		}
	})
	t.Run("never holds", func(t *testing.T) {
		long := pipeline.Stage{Name: "long", RefusedReason: "Refused", Run: func(context.Context, *pipeline.Sandbox) error {
			<-time.After(4 * heldAfter) // what is tested: a stage running past heldAfter
			return nil
		}}
		if err := run(t, []pipeline.Stage{long}, nil); err != nil {
			t.Errorf("RunPodSandbox: %v", err)
		}
	})
	select {
	case e := <-events:
		t.Errorf("Event %+v, want none", e)
	default:
	}
}
