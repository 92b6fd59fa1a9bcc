package pipeline

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/podgate/podgate/cri"
)

// backgroundQuiet is how long the CRI server must have served no call before background work
// that can wait starts (a new sandbox's status read for the registry, a container's cgroup
// check after StartContainer): longer than the kubelet's pauses between the calls of a pod
// start (a millisecond or two), so that the work does not meet its next call.
// backgroundQuietMost bounds the wait on a node whose kubelet is never quiet for that long.
const (
	backgroundQuiet     = 20 * time.Millisecond
	backgroundQuietMost = 2 * time.Second
)

// Quiet returns a wait for s to be quiet (cri.Server.Quiet) for background work: a feature's
// work after an answer waits for it, so that it does not run beside the kubelet's next calls.
func Quiet(s *cri.Server) func(context.Context) error {
	return func(ctx context.Context) error { return s.Quiet(ctx, backgroundQuiet, backgroundQuietMost) }
}

// Background is work a CRI call starts and leaves running when it answers (a sysctl
// verification, the read of a new sandbox's status). Shutdown waits for it, within its grace
// period, so that its results reach the registry.
//
// Unlike a WaitGroup, work may start while wait waits (a CRI call still finishing during
// shutdown), and a wait that gives up leaves nothing behind.
type Background struct {
	name string

	mu      sync.Mutex
	running int
	// idle is closed when running drops to 0, and replaced when work starts again.
	idle chan struct{}
}

// NewBackground returns an empty set of background work; name says what it is in the error
// of a Wait that gave up ("sysctl verifications").
func NewBackground(name string) *Background { return &Background{name: name} }

// Go runs fn in the background.
func (b *Background) Go(fn func()) {
	b.mu.Lock()
	if b.running == 0 {
		b.idle = make(chan struct{})
	}
	b.running++
	b.mu.Unlock()
	go func() {
		defer b.done()
		fn()
	}()
}

func (b *Background) done() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.running--; b.running == 0 {
		close(b.idle)
	}
}

// Wait waits until no work runs, or until ctx ends.
func (b *Background) Wait(ctx context.Context) error {
	for {
		b.mu.Lock()
		if b.running == 0 {
			b.mu.Unlock()
			return nil
		}
		idle, n := b.idle, b.running
		b.mu.Unlock()
		select {
		case <-idle: // work may have started again meanwhile: look again
		case <-ctx.Done():
			return fmt.Errorf("%s still running (%d): %w", b.name, n, context.Cause(ctx))
		}
	}
}
