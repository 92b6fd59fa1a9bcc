package agent

import (
	"context"
	"errors"
	"sync"

	"k8s.io/klog/v2"
)

// runnable is one thing podgate runs between start-up and shutdown: a server, a loop, or work
// that only has something to do at shutdown. Run starts the runnables in the order of their
// list and shuts them down in that same order, so the list says both: the CRI socket, first,
// stops taking calls first, and what its last calls started is waited for right after it.
type runnable struct {
	name string
	// run runs until ctx ends and returns nil then; an error ends podgate, with it as the
	// cause. nil: nothing runs.
	run func(ctx context.Context) error
	// stop, once ctx has ended, makes run return and waits for what must finish first, within
	// the grace period ctx carries. nil: run returns when ctx ends.
	stop func(ctx context.Context) error
	// release, after every run has returned, gives back what the runnable holds (its last
	// writes, its connections). nil: nothing to give back.
	release func(ctx context.Context) error
}

// start runs every runnable's run in the background; a run that fails cancels ctx with its
// error, which names what failed. The WaitGroup ends when every run has returned.
func start(ctx context.Context, cancel context.CancelCauseFunc, list []runnable) *sync.WaitGroup {
	var running sync.WaitGroup
	for _, r := range list {
		if r.run == nil {
			continue
		}
		running.Go(func() {
			if err := r.run(ctx); err != nil {
				cancel(err) // each run says what failed
			}
		})
	}
	return &running
}

// shutdown stops the runnables in list order, waits for every run to return, then releases
// them in list order; what fails is logged and the rest still runs.
func shutdown(ctx context.Context, list []runnable, running *sync.WaitGroup) {
	logger := klog.FromContext(ctx)
	for _, r := range list {
		if r.stop != nil {
			if err := r.stop(ctx); err != nil {
				logger.Error(err, "Stop", "runnable", r.name)
			}
		}
	}
	running.Wait()
	for _, r := range list {
		if r.release != nil {
			if err := r.release(ctx); err != nil {
				logger.Error(err, "Release", "runnable", r.name)
			}
		}
	}
}

// loop makes a loop that runs until ctx ends into a run; nil stays nil (nothing to run).
func loop(fn func(ctx context.Context)) func(ctx context.Context) error {
	if fn == nil {
		return nil
	}
	return func(ctx context.Context) error {
		fn(ctx)
		return nil
	}
}

// waitAll waits for each of waits in turn, within ctx, and joins what gave up.
func waitAll(waits ...func(ctx context.Context) error) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		var errs []error
		for _, w := range waits {
			errs = append(errs, w(ctx))
		}
		return errors.Join(errs...)
	}
}
