package pipeline_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/podgate/podgate/cri/pipeline"
	"github.com/podgate/podgate/cri/registry"
	"github.com/podgate/podgate/test/crifake"
)

// rig is the runner plugged into podgate's CRI server in front of cri-client's fake runtime,
// both on unix sockets, recording sandboxes in a registry with its checkpoint in stateDir.
type rig struct {
	runtime  *crifake.Runtime
	proxy    *crifake.Proxy
	registry *registry.Registry
	core     *pipeline.Core
	runner   *pipeline.Runner
	metrics  *prometheus.Registry
	stateDir string
}

// rigOptions vary the rig.
type rigOptions struct {
	// runtime is the fake runtime; nil: one without hooks.
	runtime *crifake.Runtime
	// quiet is what the status read after the answer waits for; nil: the CRI server's Quiet.
	quiet func(context.Context) error
	// runner configures the runner, registry the registry.
	runner   []pipeline.RunnerOption
	registry []registry.Option
}

// newRig builds the rig; stages lists the runner's stages, the core's among the test's own.
func newRig(t *testing.T, o rigOptions, stages func(core *pipeline.Core) []pipeline.Stage) *rig {
	t.Helper()
	r := &rig{runtime: o.runtime, metrics: prometheus.NewRegistry()}
	if r.runtime == nil {
		r.runtime = crifake.NewRuntime()
	}
	r.proxy = crifake.NewProxy(t, r.runtime)
	r.stateDir = filepath.Join(r.proxy.Dir, "state")
	if err := os.Mkdir(r.stateDir, 0o700); err != nil {
		t.Fatal(err)
	}
	r.registry = registry.NewRegistry(registry.NewCheckpoint(r.stateDir), registry.CheckpointData{}, o.registry...)
	quiet := o.quiet
	if quiet == nil {
		quiet = pipeline.Quiet(r.proxy.Server)
	}
	r.core = pipeline.NewCore(r.registry, r.proxy.Server.RuntimeClient(), quiet)
	r.runner = pipeline.NewRunner(stages(r.core), r.registry, r.metrics, o.runner...)
	r.runner.Register(r.proxy.Server)
	r.proxy.Start(t)
	t.Cleanup(func() {
		// The status reads end before the state directory goes.
		if err := r.core.Wait(context.Background()); err != nil {
			t.Error(err)
		}
		r.registry.Flush()
	})
	return r
}

// coreAround is the core stages with the test's stages before the forward and between the
// status read and the record, as features place theirs.
func coreAround(before, after []pipeline.Stage) func(*pipeline.Core) []pipeline.Stage {
	return func(core *pipeline.Core) []pipeline.Stage {
		stages := slices.Clone(before)
		stages = append(stages, core.Forward(), core.Status())
		stages = append(stages, after...)
		return append(stages, core.Record())
	}
}

// checkNothingLeft checks that neither the runtime, nor the registry, nor its checkpoint holds
// a sandbox.
func (r *rig) checkNothingLeft(t *testing.T) {
	t.Helper()
	if got := r.runtime.Sandboxes(t); len(got) != 0 {
		t.Errorf("the runtime holds %d sandboxes: %v", len(got), got)
	}
	if got := r.registry.Sandboxes(); len(got) != 0 {
		t.Errorf("the registry holds %v", got)
	}
	r.registry.Flush()
	onDisk, err := registry.NewCheckpoint(r.stateDir).Read()
	if err != nil {
		t.Fatal(err)
	}
	if len(onDisk) != 0 {
		t.Errorf("the checkpoint holds %v", onDisk)
	}
}

// journal records what the test's stages did, in order.
type journal struct {
	mu      sync.Mutex
	entries []string
}

func (j *journal) add(format string, args ...any) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.entries = append(j.entries, fmt.Sprintf(format, args...))
}

// take returns what was recorded since the last take.
func (j *journal) take() []string {
	j.mu.Lock()
	defer j.mu.Unlock()
	out := j.entries
	j.entries = nil
	return out
}

// step is a stage of a feature that leaves something behind: each of its steps is recorded in j.
func step(name string, j *journal) pipeline.Stage {
	return pipeline.Stage{
		Name: name,
		Run:  func(context.Context, *pipeline.Sandbox) error { j.add("run %s", name); return nil },
		Undo: func(context.Context, *pipeline.Sandbox) error { j.add("undo %s", name); return nil },
		Stop: func(_ context.Context, rec registry.SandboxRecord) error {
			j.add("stop %s %s", name, rec.Pod.Name)
			return nil
		},
		Removed: func(context.Context, string) error { j.add("removed %s", name); return nil },
	}
}

// failing is st with a Run that fails with err.
func failing(st pipeline.Stage, err error) pipeline.Stage {
	st.Run = func(context.Context, *pipeline.Sandbox) error { return err }
	return st
}

var errInjected = errors.New("injected")

// findMetric returns the series name{label=value} in reg (label "": its first series); nil,
// whose getters give zeros, when absent.
func findMetric(t *testing.T, reg prometheus.Gatherer, name, label, value string) *dto.Metric {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if label == "" {
				return m
			}
			for _, lp := range m.GetLabel() {
				if lp.GetName() == label && lp.GetValue() == value {
					return m
				}
			}
		}
	}
	return nil
}
