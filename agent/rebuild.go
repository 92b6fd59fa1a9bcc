package agent

import (
	"context"
	"math"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/klog/v2"

	"github.com/podgate/podgate/cri/registry"
)

// rebuildBackoff spaces the attempts while the runtime is unreachable (podgate may start
// before containerd): soon at first, at most every 30 seconds.
var rebuildBackoff = wait.Backoff{Duration: 500 * time.Millisecond, Factor: 2, Cap: 30 * time.Second, Steps: math.MaxInt32}

// rebuildRegistry makes the pod registry match the runtime: it runs once at start-up, in the
// background so that podgate serves CRI while containerd is still starting, and retries until
// the runtime answers or ctx ends.
func (a *Agent) rebuildRegistry(ctx context.Context, sandboxes *registry.Registry, rt runtimeapi.RuntimeServiceClient) {
	logger := klog.FromContext(ctx)
	attempt := 0
	err := wait.ExponentialBackoffWithContext(ctx, rebuildBackoff, func(ctx context.Context) (bool, error) {
		attempt++
		known, added, dropped, err := sandboxes.Rebuild(ctx, rt)
		if err != nil {
			a.rebuilds.WithLabelValues("error").Inc()
			logger.V(1).Info("Pod registry not rebuilt yet", "attempt", attempt, "err", err)
			if attempt == 1 {
				logger.Info("Pod registry waits for the runtime to rebuild from it", "err", err)
			}
			return false, nil
		}
		logger.Info("Pod registry rebuilt from the runtime", "sandboxes", known, "adopted", added, "dropped", dropped, "attempts", attempt)
		a.rebuilds.WithLabelValues("ok").Inc()
		close(a.rebuilt)
		return true, nil
	})
	if err != nil && ctx.Err() == nil {
		logger.Error(err, "Pod registry not rebuilt")
	}
}
