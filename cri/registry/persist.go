package registry

import (
	"fmt"
	"time"
)

// writeWithLocked writes the checkpoint as the registry will be once rec is recorded (in
// place of a record of that ID). persistMu is held.
func (r *Registry) writeWithLocked(rec SandboxRecord) error {
	r.mu.Lock()
	snap, err := r.snapshotLocked(&rec, nil, nil)
	r.mu.Unlock()
	if err != nil {
		return err
	}
	if err := r.checkpoint.Write(snap); err != nil {
		return fmt.Errorf("pod registry: %w", err)
	}
	return nil
}

// WriteDelay is how long a background checkpoint write waits before it takes its snapshot, so
// that the changes of one pod start (the record, then what the status read and the sysctl
// verification add) reach the disk in one write, after the kubelet's next calls rather than
// beside them: each write is two fsyncs on the journal containerd's own commits fsync on. What
// a crash loses of them, the start-up rebuild finds again in the runtime; changes of the DRA
// claims never wait (Commit writes them before they count).
const WriteDelay = time.Second

// WriteInterval is the least time between the starts of two background writes: on a node that
// starts and stops pods without pause, each write's two fsyncs make containerd's own commits
// wait behind them (critest's pod calls took 7-12 % longer through podgate than through a
// minimal forwarder with the checkpoint written after each pod; none with it on tmpfs). What a
// crash loses of these writes is no obligation (the rebuild finds the sandboxes again); the
// writes that are one (Add of a record holding attached devices, UpdateDurable, Commit) do not
// wait.
const WriteInterval = 10 * time.Second

// persistSoon writes the checkpoint in the background, writeDelay from now. Writes coalesce:
// while one is queued, later changes join it; one runs at a time.
func (r *Registry) persistSoon() {
	if r.checkpoint == nil {
		return
	}
	r.mu.Lock()
	if r.writeQueued {
		r.mu.Unlock()
		return
	}
	r.writeQueued = true
	r.writes++
	kick, delay := make(chan struct{}), r.delayLocked(time.Now())
	r.kick = kick
	r.mu.Unlock()
	go func() {
		defer func() {
			r.mu.Lock()
			r.writes--
			r.written.Broadcast()
			r.mu.Unlock()
		}()
		if delay > 0 {
			t := time.NewTimer(delay)
			select {
			case <-t.C:
			case <-kick:
				t.Stop()
			}
		}
		r.persistMu.Lock()
		defer r.persistMu.Unlock()
		r.mu.Lock()
		r.writeQueued = false // from here on, a change queues the next write
		r.lastWrite = time.Now()
		if r.kick == kick {
			r.kick = nil
		}
		r.mu.Unlock()
		if err := r.writeLocked(); err != nil {
			r.mu.Lock()
			report := r.writeFailed
			r.mu.Unlock()
			report(err)
		}
	}()
}

// SetWriteDelay sets how long a background write waits for more changes, as WithWriteDelay
// does, for a test that builds its registry through a helper. Call it before the registry is
// used.
func (r *Registry) SetWriteDelay(d time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.writeDelay = d
}

// delayLocked is how long a background write queued at now waits: writeDelay, and at least
// until WriteInterval after the last background write began (unless writeDelay is 0).
func (r *Registry) delayLocked(now time.Time) time.Duration {
	if r.writeDelay == 0 || r.lastWrite.IsZero() {
		return r.writeDelay
	}
	return max(r.writeDelay, r.lastWrite.Add(WriteInterval).Sub(now))
}

// Flush writes a queued background write now, without its delay, and waits until no
// background write is queued or running (shutdown, tests).
func (r *Registry) Flush() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for r.writes > 0 {
		if r.kick != nil {
			close(r.kick)
			r.kick = nil
		}
		r.written.Wait()
	}
}

// writeLocked writes a snapshot of the registry; persistMu is held.
func (r *Registry) writeLocked() error {
	r.mu.Lock()
	snap, err := r.snapshotLocked(nil, nil, nil)
	r.mu.Unlock()
	if err != nil {
		return err
	}
	if err := r.checkpoint.Write(snap); err != nil {
		return fmt.Errorf("pod registry: %w", err)
	}
	return nil
}
