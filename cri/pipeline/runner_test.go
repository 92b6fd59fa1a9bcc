package pipeline_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podgate/podgate/cri/pipeline"
	"github.com/podgate/podgate/cri/registry"
	"github.com/podgate/podgate/test/crifake"
)

// TestFailureAtEveryStageLeavesNothing: whichever stage fails, the kubelet gets that stage's
// own error; the stages done before it are undone, last first, and those after it never run;
// nothing of the sandbox is left, not in the runtime (the forward stage's undo removes it), not
// in the registry, not in its checkpoint; the failure is counted under the stage's name.
func TestFailureAtEveryStageLeavesNothing(t *testing.T) {
	features := func(j *journal) func(*pipeline.Core) []pipeline.Stage {
		return coreAround([]pipeline.Stage{step("check", j), step("prepare", j)}, []pipeline.Stage{step("verify", j), step("attach", j)})
	}
	var names []string
	for _, st := range features(&journal{})(pipeline.NewCore(nil, nil, nil)) {
		names = append(names, st.Name)
	}
	for i, name := range names {
		t.Run(name, func(t *testing.T) {
			j := &journal{}
			r := newRig(t, rigOptions{}, func(core *pipeline.Core) []pipeline.Stage {
				stages := features(j)(core)
				stages[i] = failing(stages[i], errdefs.ErrUnavailable.WithMessage("injected failure at "+name))
				return stages
			})
			_, err := r.proxy.RunPod(t, "p")
			if st := status.Convert(err); st.Code() != codes.Unavailable || st.Message() != "injected failure at "+name {
				t.Fatalf("RunPodSandbox: %v, want the stage's own error", err)
			}
			r.checkNothingLeft(t)
			if n := findMetric(t, r.metrics, "podgate_sandbox_stage_failures_total", "stage", name).GetCounter().GetValue(); n != 1 {
				t.Errorf("stage_failures_total{stage=%q} = %v, want 1", name, n)
			}
			forwarded := slices.Index(names, "forward") < i
			if called := strings.Join(r.runtime.RuntimeService.GetCalls(), ","); forwarded != strings.Contains(called, "RemovePodSandbox") {
				t.Errorf("runtime calls %s; forwarded before the failure: %v", called, forwarded)
			}
			var want []string
			for _, done := range names[:i] {
				if !slices.Contains([]string{"forward", "status"}, done) {
					want = append(want, "run "+done)
				}
			}
			for k := len(want) - 1; k >= 0; k-- {
				want = append(want, "undo "+strings.TrimPrefix(want[k], "run "))
			}
			if got := j.take(); !slices.Equal(got, want) {
				t.Errorf("stages did %q, want %q", got, want)
			}
		})
	}
}

// TestRollbackGoesOn: the undo runs to the end when an undo fails (counted under its stage),
// skips stages without one, and outlives the kubelet's call: a call given up still has its
// stages undone, under a deadline of their own.
func TestRollbackGoesOn(t *testing.T) {
	j := &journal{}
	a := step("a", j)
	a.Undo = func(ctx context.Context, _ *pipeline.Sandbox) error {
		_, deadline := ctx.Deadline()
		j.add("undo a (ended: %v, deadline: %v)", ctx.Err() != nil, deadline)
		return nil
	}
	b := step("b", j)
	b.Undo = func(context.Context, *pipeline.Sandbox) error { j.add("undo b"); return errInjected }
	noUndo := pipeline.Stage{Name: "no-undo", Run: func(context.Context, *pipeline.Sandbox) error { j.add("run no-undo"); return nil }}
	ctx, cancel := context.WithCancel(t.Context())
	gaveUp := pipeline.Stage{Name: "gave-up", Run: func(ctx context.Context, _ *pipeline.Sandbox) error {
		cancel() // the kubelet gives up on the call
		return context.Cause(ctx)
	}}
	metrics := prometheus.NewRegistry()
	p := pipeline.NewRunner([]pipeline.Stage{a, noUndo, b, gaveUp}, registry.NewRegistry(nil, registry.CheckpointData{}), metrics)
	_, err := p.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: crifake.PodConfig("p")}, nil)
	if !errors.Is(err, context.Canceled) {
		t.Errorf("RunPodSandbox: %v, want the failed stage's error", err)
	}
	want := []string{"run a", "run no-undo", "run b", "undo b", "undo a (ended: false, deadline: true)"}
	if got := j.take(); !slices.Equal(got, want) {
		t.Errorf("stages did %q, want %q", got, want)
	}
	for stage, want := range map[string]float64{"b": 1, "a": 0} {
		if n := findMetric(t, metrics, "podgate_sandbox_undo_errors_total", "stage", stage).GetCounter().GetValue(); n != want {
			t.Errorf("undo_errors_total{stage=%q} = %v, want %v", stage, n, want)
		}
	}
}

// runtimeState is the sandbox's state in the runtime, read past podgate; "gone" when it has
// none by that ID.
func runtimeState(t *testing.T, rt *crifake.Runtime, id string) string {
	t.Helper()
	for _, sb := range rt.Sandboxes(t) {
		if sb.Id == id {
			return sb.State.String()
		}
	}
	return "gone"
}

// observing is st whose stop and removed steps record the runtime's state of the sandbox when
// they run.
func observing(t *testing.T, st pipeline.Stage, rt *crifake.Runtime, j *journal) pipeline.Stage {
	st.Stop = func(_ context.Context, rec registry.SandboxRecord) error {
		j.add("stop %s, runtime %s", st.Name, runtimeState(t, rt, rec.ID))
		return nil
	}
	st.Removed = func(_ context.Context, id string) error {
		j.add("removed %s, runtime %s", st.Name, runtimeState(t, rt, id))
		return nil
	}
	return st
}

// TestStopAndRemove: StopPodSandbox runs the stages' stop steps, last stage first, before the
// runtime stops the sandbox (a device must leave the pod's namespace while it exists), and
// marks the record not ready; RemovePodSandbox runs their removed steps, last first, once the
// runtime has removed it, and the record goes; both are idempotent. A sandbox the registry
// does not know is stopped by the runtime alone.
func TestStopAndRemove(t *testing.T) {
	rt, j := crifake.NewRuntime(), &journal{}
	r := newRig(t, rigOptions{runtime: rt}, coreAround(
		[]pipeline.Stage{observing(t, step("a", j), rt, j)}, []pipeline.Stage{observing(t, step("b", j), rt, j)}))
	id, err := r.proxy.RunPod(t, "p")
	if err != nil {
		t.Fatal(err)
	}
	j.take()
	ctx := t.Context()
	if _, err := r.proxy.Client.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: id}); err != nil {
		t.Fatal(err)
	}
	ready := runtimeapi.PodSandboxState_SANDBOX_READY.String()
	if got, want := j.take(), []string{"stop b, runtime " + ready, "stop a, runtime " + ready}; !slices.Equal(got, want) {
		t.Errorf("stop: stages did %q, want %q", got, want)
	}
	if rec, ok := r.registry.Sandbox(id); !ok || rec.Ready {
		t.Errorf("stopped sandbox: record %+v (recorded: %v), want it kept, not ready", rec, ok)
	}
	if s := runtimeState(t, rt, id); s != runtimeapi.PodSandboxState_SANDBOX_NOTREADY.String() {
		t.Errorf("runtime's sandbox %s after the stop", s)
	}
	for range 2 {
		if _, err := r.proxy.Client.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: id}); err != nil {
			t.Fatal(err)
		}
		if got, want := j.take(), []string{"removed b, runtime gone", "removed a, runtime gone"}; !slices.Equal(got, want) {
			t.Errorf("remove: stages did %q, want %q", got, want)
		}
	}
	r.checkNothingLeft(t)

	// A sandbox made past podgate: the registry does not know it, no stage has anything of it.
	other, err := rt.RuntimeService.RunPodSandbox(ctx, crifake.PodConfig("other"), "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.proxy.Client.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: other}); err != nil {
		t.Fatal(err)
	}
	if got := j.take(); len(got) != 0 || runtimeState(t, rt, other) != runtimeapi.PodSandboxState_SANDBOX_NOTREADY.String() {
		t.Errorf("stop of an unknown sandbox: stages did %q, runtime %s", got, runtimeState(t, rt, other))
	}
}

// TestStopAndRemoveFailures: a stop step that fails fails StopPodSandbox, naming the sandbox and
// the stage, before the runtime is asked (the sandbox runs on, still ready in the registry);
// a removed step that fails does not fail RemovePodSandbox (the runtime removed the sandbox),
// nor keep the others from running; Removed joins their errors, each naming its stage. A
// RemovePodSandbox the runtime fails runs no removed step.
func TestStopAndRemoveFailures(t *testing.T) {
	j := &journal{}
	a, b, c := step("a", j), step("b", j), step("c", j)
	b.Stop = func(context.Context, registry.SandboxRecord) error { return errInjected }
	a.Removed = func(context.Context, string) error { j.add("removed a"); return errors.New("a failed") }
	c.Removed = func(context.Context, string) error { j.add("removed c"); return errors.New("c failed") }
	r := newRig(t, rigOptions{}, coreAround([]pipeline.Stage{a}, []pipeline.Stage{b, c}))
	id, err := r.proxy.RunPod(t, "p")
	if err != nil {
		t.Fatal(err)
	}
	j.take()
	ctx := t.Context()
	_, err = r.proxy.Client.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: id})
	if want := "stop pod sandbox " + id + ": b: injected"; status.Convert(err).Message() != want {
		t.Errorf("StopPodSandbox: %v, want %q", err, want)
	}
	if got := j.take(); !slices.Equal(got, []string{"stop c p"}) {
		t.Errorf("stop: stages did %q, want c's stop only (b failed, a comes after it)", got)
	}
	if rec, _ := r.registry.Sandbox(id); !rec.Ready || runtimeState(t, r.runtime, id) != runtimeapi.PodSandboxState_SANDBOX_READY.String() {
		t.Errorf("after a failed stop step: record ready %v, runtime %s; want the sandbox running", rec.Ready, runtimeState(t, r.runtime, id))
	}

	r.runtime.RuntimeService.InjectError("RemovePodSandbox", errors.New("runtime says no"))
	if _, err := r.proxy.Client.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: id}); err == nil || !strings.Contains(err.Error(), "runtime says no") {
		t.Errorf("RemovePodSandbox the runtime failed: %v, want the runtime's error", err)
	}
	if got := j.take(); len(got) != 0 {
		t.Errorf("stages did %q after a failed remove, want nothing", got)
	}
	if _, err := r.proxy.Client.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: id}); err != nil {
		t.Errorf("RemovePodSandbox with failing removed steps: %v, want the runtime's success", err)
	}
	if got, want := j.take(), []string{"removed c", "removed b", "removed a"}; !slices.Equal(got, want) {
		t.Errorf("remove: stages did %q, want %q", got, want)
	}
	if _, ok := r.registry.Sandbox(id); ok {
		t.Error("removed sandbox still recorded")
	}
	err = r.runner.Removed(ctx, id)
	if err == nil || err.Error() != "c: c failed\na: a failed" {
		t.Errorf("Removed: %v, want c's and a's errors, each naming its stage", err)
	}
}

// TestStagesRunInOrderOnce: a successful call runs each stage once, in the list's order, and
// times each under its name.
func TestStagesRunInOrderOnce(t *testing.T) {
	j := &journal{}
	r := newRig(t, rigOptions{}, coreAround([]pipeline.Stage{step("a", j), step("b", j)}, []pipeline.Stage{step("c", j)}))
	if _, err := r.proxy.RunPod(t, "p"); err != nil {
		t.Fatal(err)
	}
	if got, want := j.take(), []string{"run a", "run b", "run c"}; !slices.Equal(got, want) {
		t.Errorf("stages did %q, want %q", got, want)
	}
	for _, st := range r.runner.Stages() {
		if n := findMetric(t, r.metrics, "podgate_sandbox_stage_duration_seconds", "stage", st.Name).GetHistogram().GetSampleCount(); n != 1 {
			t.Errorf("stage_duration_seconds{stage=%q} has %d samples, want 1", st.Name, n)
		}
	}
}
