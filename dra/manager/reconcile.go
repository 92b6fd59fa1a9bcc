package manager

// The reconciler: the claims of pods that are gone are released, the last user's unprepared.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/containerd/errdefs"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/klog/v2"

	"github.com/podgate/podgate/cri/registry"
	"github.com/podgate/podgate/dra"
)

// sandboxRemoved asks the reconciler to look: the pod's last sandbox may be gone.
func (d *Manager) sandboxRemoved(context.Context, string) error {
	d.wake()
	return nil
}

func (d *Manager) wake() {
	select {
	case d.poke <- struct{}{}:
	default: // a look is already due
	}
}

// Run releases the claims of pods that are gone until ctx ends: periodically, and when a pod is
// deleted or a sandbox removed. Once the registry is rebuilt from the runtime, it settles the
// intents that are left too (Settler), at once and then each time.
func (d *Manager) Run(ctx context.Context) {
	d.pods.OnDeleted(func(*corev1.Pod) { d.wake() })
	ticker := time.NewTicker(draReconcilePeriod)
	defer ticker.Stop()
	rebuilt, settle := d.rebuilt, false
	for {
		d.Reconcile(ctx)
		if settle && d.settler != nil {
			d.settler.Settle(ctx)
		}
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		case <-d.poke:
		case <-rebuilt:
			rebuilt, settle = nil, true
		}
	}
}

// Reconcile releases the claims of each pod that is gone from the API server (or deleted) and
// has no running sandbox left in the runtime: a stopped sandbox of such a pod never runs again
// (the kubelet makes new sandboxes only for pods the API server still has, undeleted), and the
// kubelet's garbage collection may keep it for minutes. The pod leaves its claims' users; a
// claim no pod of the node uses any more is unprepared, once; a claim another pod still uses
// stays prepared for it: the last user unprepares it.
func (d *Manager) Reconcile(ctx context.Context) {
	logger := klog.FromContext(ctx)
	for _, p := range d.store.Pods() {
		if ctx.Err() != nil {
			return
		}
		gone, err := d.podGone(ctx, p.Pod)
		if err != nil {
			logger.V(1).Info("Cannot tell yet whether a pod with prepared claims is gone", "pod", klog.KRef(p.Pod.Namespace, p.Pod.Name), "err", err)
			continue
		}
		if !gone {
			continue
		}
		unused, err := d.store.ReleasePod(p.Pod.UID)
		if err != nil {
			logger.Error(err, "Release claims of a gone pod", "pod", klog.KRef(p.Pod.Namespace, p.Pod.Name))
			continue
		}
		if shared := len(p.Claims) - len(unused); shared > 0 {
			d.unprepared.WithLabelValues("shared").Add(float64(shared))
			logger.Info("Pod gone: claims other pods of the node use stay prepared", "pod", klog.KRef(p.Pod.Namespace, p.Pod.Name), "shared", shared)
		}
	}
	for _, c := range d.store.List() {
		if ctx.Err() != nil {
			return
		}
		if len(c.PodUIDs) > 0 || !d.due(c.UID) {
			continue
		}
		if err := d.unprepare(ctx, c); err != nil {
			after := d.failed(c.UID)
			logger.Error(err, "Unprepare claim no pod uses", "claim", klog.KRef(c.Namespace, c.Name), "retryIn", after)
			continue
		}
		d.mu.Lock()
		delete(d.retry, c.UID)
		d.mu.Unlock()
	}
}

// unprepare has the drivers unprepare a claim no pod uses, unless a sandbox is taking it up
// again (preparing it), and then forgets it. A claim that was never prepared is unprepared too:
// a crash may have come between the driver's prepare and its record. A sandbox whose pod takes
// the claim up while the drivers unprepare it waits (prepareOnce) and then finds it unprepared,
// used by its pod (ClaimUnprepared, ClaimUnprepareFailed): it prepares it again.
func (d *Manager) unprepare(ctx context.Context, c ClaimInfo) error {
	d.mu.Lock()
	if _, busy := d.busy[c.UID]; busy {
		d.mu.Unlock()
		return nil // a sandbox is preparing it: it is used again
	}
	c, ok := d.store.Claim(c.UID)
	if !ok || len(c.PodUIDs) > 0 {
		d.mu.Unlock()
		return nil
	}
	op := &claimOp{done: make(chan struct{}), unprepare: c.PreparedBy != PreparedByKubelet}
	d.busy[c.UID] = op
	d.mu.Unlock()
	defer func() {
		d.mu.Lock()
		close(op.done)
		delete(d.busy, c.UID)
		d.mu.Unlock()
	}()
	logger := klog.FromContext(ctx)
	if c.PreparedBy == PreparedByKubelet {
		// The kubelet unprepares what it prepared, once its own pods are gone.
		d.unprepared.WithLabelValues("kubelet").Inc()
		logger.V(2).Info("Forgot claim the kubelet prepared", "claim", klog.KRef(c.Namespace, c.Name))
		d.claims.Forget(c.Namespace, c.Name)
		return d.store.ClaimUnprepared(c.UID)
	}
	claim := dra.Claim{Namespace: c.Namespace, Name: c.Name, UID: c.UID}
	var errs []error
	for _, name := range c.Drivers {
		drv, err := d.drivers.Lookup(name)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if _, err := drv.Unprepare(ctx, []dra.Claim{claim}); err != nil {
			errs = append(errs, err)
			continue
		}
		logger.Info("Unprepared claim", "claim", klog.KRef(c.Namespace, c.Name), "driver", name)
	}
	if err := errors.Join(errs...); err != nil {
		// A driver may have torn part of the claim down: a pod that took it up meanwhile
		// must not find it prepared.
		return errors.Join(err, d.store.ClaimUnprepareFailed(c.UID))
	}
	d.unprepared.WithLabelValues("unprepared").Inc()
	d.claims.Forget(c.Namespace, c.Name)
	return d.store.ClaimUnprepared(c.UID)
}

// releaseRetry is when a failed release of a pod's claims is tried again.
type releaseRetry struct {
	next    time.Time
	backoff time.Duration
}

// due reports whether the pod's release may be tried now.
func (d *Manager) due(uid types.UID) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	r, ok := d.retry[uid]
	return !ok || !d.now().Before(r.next)
}

// failed records a failed release and returns when it is tried again.
func (d *Manager) failed(uid types.UID) time.Duration {
	d.mu.Lock()
	defer d.mu.Unlock()
	r := d.retry[uid]
	r.backoff = min(max(2*r.backoff, RetryInitial), RetryMax)
	r.next = d.now().Add(r.backoff)
	d.retry[uid] = r
	return r.backoff
}

// podGone reports whether the pod is deleted in the API server and has no running sandbox.
func (d *Manager) podGone(ctx context.Context, ref registry.PodRef) (bool, error) {
	if d.inFlight(ref.UID) {
		return false, nil
	}
	if pod, ok := d.pods.Get(ref.UID); ok && pod.DeletionTimestamp == nil {
		return false, nil
	} else if !ok {
		if !d.pods.HasSynced() {
			return false, errors.New("pod informer not synced")
		}
		// The informer may lag behind a pod podgate fetched itself: ask once.
		pod, err := d.pods.GetOrFetch(ctx, ref.UID, ref.Namespace, ref.Name)
		switch {
		case err == nil && pod.DeletionTimestamp == nil:
			return false, nil
		case err != nil && !errdefs.IsNotFound(err) && !errdefs.IsFailedPrecondition(err):
			return false, err
		}
	}
	if slices.ContainsFunc(d.sandboxes.PodSandboxes(ref.UID), func(r registry.SandboxRecord) bool { return r.Ready }) {
		return false, nil
	}
	// Sandboxes made past podgate count too: the kubelet labels each with its pod's UID.
	resp, err := d.runtime.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{Filter: &runtimeapi.PodSandboxFilter{
		LabelSelector: map[string]string{"io.kubernetes.pod.uid": string(ref.UID)},
		State:         &runtimeapi.PodSandboxStateValue{State: runtimeapi.PodSandboxState_SANDBOX_READY},
	}})
	if err != nil {
		return false, fmt.Errorf("list the pod's sandboxes: %w", err)
	}
	return len(resp.GetItems()) == 0, nil
}
