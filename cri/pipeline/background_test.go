package pipeline_test

import (
	"context"
	"errors"
	"testing"

	"github.com/podgate/podgate/cri/pipeline"
)

// TestBackgroundWaitWaitsForTheWork: Wait returns at once when no work runs; otherwise it
// returns once every piece of work has ended, work started after it began waiting included,
// as the work's own ends show.
func TestBackgroundWaitWaitsForTheWork(t *testing.T) {
	b := pipeline.NewBackground("test work")
	if err := b.Wait(t.Context()); err != nil {
		t.Fatalf("wait without work: %v", err)
	}
	first, second := make(chan struct{}), make(chan struct{})
	firstDone, secondDone := make(chan struct{}), make(chan struct{})
	b.Go(func() { <-first; close(firstDone) })
	waited := make(chan error, 1)
	go func() { waited <- b.Wait(t.Context()) }()
	b.Go(func() { <-second; close(secondDone) })
	close(first)
	<-firstDone
	close(second)
	if err := <-waited; err != nil {
		t.Fatalf("wait: %v", err)
	}
	select {
	case <-secondDone:
	default:
		t.Error("Wait returned before the work started while it waited had ended")
	}
}

// TestBackgroundWaitGivesUp: a Wait whose context ends returns the cause, with the work still
// running and left alone; giving up leaves nothing that changes a later Wait, which waits for
// the same work and returns once it has ended.
func TestBackgroundWaitGivesUp(t *testing.T) {
	b := pipeline.NewBackground("test work")
	release, done := make(chan struct{}), make(chan struct{})
	b.Go(func() { <-release; close(done) })
	over := errors.New("grace period over")
	ctx, cancel := context.WithCancelCause(t.Context())
	cancel(over)
	for range 100 {
		if err := b.Wait(ctx); !errors.Is(err, over) || err.Error() != "test work still running (1): grace period over" {
			t.Fatalf("wait = %v, want the work still running and the cause", err)
		}
	}
	// A context that ends while Wait waits.
	ctx, cancel = context.WithCancelCause(t.Context())
	waited := make(chan error, 1)
	go func() { waited <- b.Wait(ctx) }()
	cancel(over)
	if err := <-waited; !errors.Is(err, over) {
		t.Errorf("wait = %v, want the cause", err)
	}
	select {
	case <-done:
		t.Fatal("the work ended when the waits gave up")
	default:
	}

	go func() { waited <- b.Wait(t.Context()) }()
	close(release)
	if err := <-waited; err != nil {
		t.Fatalf("wait: %v", err)
	}
	select {
	case <-done:
	default:
		t.Error("Wait returned before the work had ended")
	}
}
