package agent

import (
	"context"
	"fmt"
	"sync"
)

// backgroundWork is work a CRI call starts and leaves running when it answers (a sysctl
// verification, the read of a new sandbox's status). Shutdown waits for it, within its grace
// period, so that its results reach the registry.
type backgroundWork struct {
	name string
	wg   sync.WaitGroup
}

// Go runs fn in the background.
func (b *backgroundWork) Go(fn func()) { b.wg.Go(fn) }

// wait waits for the work started so far, until ctx ends.
func (b *backgroundWork) wait(ctx context.Context) error {
	done := make(chan struct{})
	go func() {
		b.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%s still running: %w", b.name, context.Cause(ctx))
	}
}
