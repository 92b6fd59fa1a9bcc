package agent

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/podgate/podgate/agent/kube"
	"github.com/podgate/podgate/cri/pipeline"
	"github.com/podgate/podgate/dra/attach"
	"github.com/podgate/podgate/dra/dratest/rig"
	"github.com/podgate/podgate/dra/manager"
	"github.com/podgate/podgate/test/kubefake"
)

// TestPipelineEvents: a stage of podgate's that holds a sandbox longer than heldAfter tells
// the pod which stage holds it; one that refuses it tells the pod which stage and why; the
// kubelet still gets the error with its class.
func TestPipelineEvents(t *testing.T) {
	client := fake.NewClientset()
	rec := kube.NewEventRecorder(kubefake.Wrap(client), "node-a")
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); rec.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "held", UID: types.UID("uid-held")}}
	change := func(stages []pipeline.Stage) {
		for i, st := range stages {
			if st.Name != "dra-prepare" {
				continue
			}
			stages[i].Run = func(context.Context, *pipeline.Sandbox) error {
				// Held until the pod has been told so.
				awaitEvent(t, client, pod, "SandboxHeld", `stage "dra-prepare" has held the pod sandbox`, "DRA drivers prepare")
				return fmt.Errorf("prepare claim ns/gpu: driver gpu.example.com: not registered: %w", errdefs.ErrUnavailable)
			}
		}
	}
	// DRA on, its prepare stage the one that holds and refuses the sandbox.
	withDRA := func(r *pipelineRig) (*manager.Manager, *attach.Attacher) {
		m := manager.New(rig.NewPods(fake.NewClientset()), nil, nil, r.claimStore, r.registry, r.runtimeClient, r.metrics)
		return m, attach.New(r.registry, r.intents, r.metrics)
	}
	r := newPipelineRigWith(t, rigOptions{change: change, dra: withDRA, runner: []pipeline.RunnerOption{pipeline.WithEvents(sandboxEvents(rec), 50*time.Millisecond)}})
	_, err := r.run(t, "held")
	if status.Code(err) != codes.Unavailable {
		t.Errorf("RunPodSandbox = %v, want Unavailable", err)
	}
	e := awaitEvent(t, client, pod, "FailedDRAPrepare", `stage "dra-prepare" refused the pod sandbox`, "driver gpu.example.com: not registered")
	if e.Type != corev1.EventTypeWarning || e.Action != "RunPodSandbox" {
		t.Errorf("Event %s: type %s, action %s", e.Reason, e.Type, e.Action)
	}
	r.checkNothingLeft(t)
}
