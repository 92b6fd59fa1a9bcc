package imagepull

import (
	"context"
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// queuedPollInterval is how often the feature asks a DeletionPoller about the pods whose pulls
// wait in the queue: a local call per waiting pod, and at most this long before a deleted pod's
// waiting pull leaves.
const queuedPollInterval = 2 * time.Second

// DeletionPoller is a Pods source whose deletions can come late: the kubelet's Pods API (1.37)
// tells a deletion with the pod's next status change, and a pod whose pull waits has none until
// the pull is over. The feature asks it about the pods whose pulls wait in the queue.
type DeletionPoller interface {
	// PollDeleted asks about the pods with these UIDs and tells OnDeleted's subscribers of the
	// deleted ones.
	PollDeleted(ctx context.Context, uids []types.UID)
}

// pollQueued asks poller every interval about the pods whose pulls wait in the queue, until ctx
// ends.
func (f *Feature) pollQueued(ctx context.Context, poller DeletionPoller, interval time.Duration) {
	every(ctx, interval, func() {
		if uids := f.governor.queuedPods(); len(uids) > 0 {
			poller.PollDeleted(ctx, uids)
		}
	})
}

// every calls do each interval, the first time one interval from now, until ctx ends.
func every(ctx context.Context, interval time.Duration, do func()) {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			do()
		}
	}
}

// queuedPods returns the UIDs of the pods with a caller whose pull has not started, sorted.
func (g *Governor) queuedPods() []types.UID {
	g.mu.Lock()
	defer g.mu.Unlock()
	var uids []types.UID
	for uid, ws := range g.pods {
		for w := range ws {
			if w.flight != nil && w.flight.started.IsZero() {
				uids = append(uids, types.UID(uid))
				break
			}
		}
	}
	slices.Sort(uids)
	return uids
}
