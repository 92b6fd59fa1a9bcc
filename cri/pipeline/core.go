package pipeline

import (
	"context"
	"fmt"
	"sync"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podgate/podgate/cri/registry"
)

// Core is the pipeline's own stages, which every pod sandbox goes through whatever features
// are on: the forward to the runtime, the read of the new sandbox's status, and its record in
// the registry.
type Core struct {
	registry *registry.Registry
	// runtime is the backend runtime, for the forward stage's undo and for sandbox status.
	runtime runtimeapi.RuntimeServiceClient
	// quiet waits until the CRI server has served no call for a moment (Quiet); nil: no wait.
	quiet func(context.Context) error
	// background holds the status reads that finish records after their answer.
	background *Background
}

// NewCore returns the core stages over reg and the runtime; quiet (nil: none) is what a
// status read after the answer waits for.
func NewCore(reg *registry.Registry, rt runtimeapi.RuntimeServiceClient, quiet func(context.Context) error) *Core {
	return &Core{registry: reg, runtime: rt, quiet: quiet, background: NewBackground("sandbox status reads")}
}

// Wait waits for the status reads started after answers, until ctx ends.
func (c *Core) Wait(ctx context.Context) error { return c.background.Wait(ctx) }

// Forward hands the (possibly completed) request to the runtime. Its undo stops and removes
// the sandbox at the runtime.
func (c *Core) Forward() Stage {
	return Stage{
		Name: "forward",
		Run: func(ctx context.Context, sb *Sandbox) error {
			resp, err := sb.next(ctx, sb.Req)
			if err != nil {
				return err // the runtime cleans up a sandbox it failed to create
			}
			sb.Resp = resp
			sb.Rec.ID = resp.GetPodSandboxId()
			return nil
		},
		Undo: c.removeSandbox,
	}
}

func (c *Core) removeSandbox(ctx context.Context, sb *Sandbox) error {
	id := sb.Rec.ID
	if _, err := c.runtime.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: id}); err != nil {
		return fmt.Errorf("stop sandbox %s (the kubelet will remove it): %w", id, err)
	}
	if _, err := c.runtime.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: id}); err != nil {
		return fmt.Errorf("remove sandbox %s (the kubelet will remove it): %w", id, err)
	}
	sb.Logger.Info("Removed pod sandbox podgate failed", "podSandboxID", id)
	// Not recorded yet, but a start-up rebuild may have seen the sandbox meanwhile:
	// forgetting it keeps that rebuild from adopting a sandbox that is gone.
	c.registry.Remove(id)
	return nil
}

// Status arranges for the new sandbox's verbose status to be read once, for the stages after
// it and the registry's readers: at once by a stage that needs the sandbox's namespaces before
// the answer (verify: fail, device attach), otherwise after the answer, in the background, so
// that a pod that needs nothing of it does not wait for it, and once the kubelet's calls have
// paused (quiet), so that it does not run beside them: containerd encodes the sandbox's whole
// runtime spec for it. A status the runtime does not give is noted in the record, not a
// failure: the sandbox runs, and what needs its namespace says it has none.
func (c *Core) Status() Stage {
	return Stage{Name: "status", Run: c.status}
}

func (c *Core) status(ctx context.Context, sb *Sandbox) error {
	id, logger := sb.Rec.ID, sb.Logger
	base := registry.SandboxRecord{ID: id, RuntimeHandler: sb.Rec.RuntimeHandler, CgroupParent: sb.Rec.CgroupParent, Origin: sb.Rec.Origin}
	// The view may be read after the kubelet's call has ended.
	vctx := context.WithoutCancel(ctx)
	sb.runtimeView = sync.OnceValues(func() (registry.SandboxRecord, error) {
		v := base
		err := registry.InspectSandbox(vctx, c.runtime, &v)
		if err != nil {
			v.Status = err.Error() // what the registry's readers see
			logger.Error(err, "Read new pod sandbox's status", "podSandboxID", id)
		}
		return v, err
	})
	view := sb.runtimeView
	sb.OnAnswer(func() {
		c.background.Go(func() {
			if c.quiet != nil {
				_ = c.quiet(vctx) // vctx does not end, and the wait is bounded
			}
			if _, ok := c.registry.Sandbox(id); !ok {
				return // stopped and removed meanwhile: nothing to read
			}
			v, _ := view() // logged by the view
			c.registry.Update(id, func(r *registry.SandboxRecord) { r.FillFromRuntime(&v) })
		})
	})
	return nil
}

// Record adds the sandbox to the pod registry, which persists it.
func (c *Core) Record() Stage {
	return Stage{
		Name: "record",
		Run: func(_ context.Context, sb *Sandbox) error {
			sb.Rec.Ready = true // the runtime just created it
			return c.registry.Add(sb.Rec)
		},
		Undo: func(_ context.Context, sb *Sandbox) error {
			c.registry.Remove(sb.Rec.ID)
			return nil
		},
		Removed: func(_ context.Context, id string) error {
			c.registry.Remove(id)
			return nil
		},
	}
}
