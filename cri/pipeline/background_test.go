package pipeline

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"testing"
)

// TestBackgroundWorkWaitLeavesNothing: a wait that gives up leaves no goroutine behind, and a
// later wait sees the work end, including work started while it waited.
func TestBackgroundWorkWaitLeavesNothing(t *testing.T) {
	b := NewBackground("test work")
	release := make(chan struct{})
	b.Go(func() { <-release })
	before := runtime.NumGoroutine()
	ctx, cancel := context.WithCancelCause(t.Context())
	cancel(errors.New("grace period over"))
	for range 100 {
		if err := b.Wait(ctx); err == nil || !strings.Contains(err.Error(), "test work still running (1): grace period over") {
			t.Fatalf("wait = %v, want the work still running and the cause", err)
		}
	}
	if after := runtime.NumGoroutine(); after > before {
		t.Errorf("%d goroutines after 100 waits that gave up, %d before: waits left something behind", after, before)
	}

	waited := make(chan error, 1)
	go func() { waited <- b.Wait(t.Context()) }()
	second := make(chan struct{})
	b.Go(func() { <-second })
	close(release)
	select {
	case err := <-waited:
		t.Fatalf("wait returned %v while work still ran", err)
	default:
	}
	close(second)
	if err := <-waited; err != nil {
		t.Errorf("wait: %v", err)
	}
}
