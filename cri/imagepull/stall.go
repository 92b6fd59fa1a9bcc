package imagepull

import (
	"fmt"
	"time"

	"github.com/containerd/errdefs"
	"k8s.io/klog/v2"

	"github.com/podgate/podgate/cri/imagepull/progress"
)

// stallError is what every caller of a stalled pull gets: the image, its registry host, the
// rate containerd's content store showed over the window (the bytes containerd wrote there)
// and the minimum.
//
// Its class is errdefs.ErrUnavailable, which the CRI boundary sends as gRPC Unavailable. The
// kubelet turns any PullImage error into ErrImagePull and retries under its image back-off
// (ImagePullBackOff; pkg/kubelet/images/image_manager.go, evalCRIPullErr), whatever the code;
// Unavailable is the code gRPC defines for a transient condition to retry with back-off, which
// a registry that trickles is. DeadlineExceeded would say a deadline passed, and there is
// none: the kubelet gives PullImage no deadline, and the window is podgate's own measure.
type stallError struct {
	image, registry string
	rate            float64
	rule            progress.StallRule
}

func (e *stallError) Error() string {
	return fmt.Sprintf("pull of %s stalled: %s from registry %s over the last %s, below imagePulls.stall.minBytesPerSecond %s; podgate cancelled the pull",
		e.image, rateString(e.rate), e.registry, progress.ShortDuration(e.rule.Window), rateString(float64(e.rule.MinBytesPerSecond)))
}

// Unwrap returns the class, for errors.Is and the CRI boundary's mapping.
func (e *stallError) Unwrap() error { return errdefs.ErrUnavailable }

// rateString writes bytes per second as podgate's pull Events write rates: "210 B/s".
func rateString(bps float64) string { return progress.Bytes(int64(bps)).String() + "/s" }

// Stall cancels the running backend pull of image that started at started, found stalled at
// rate bytes per second against rule: the way a pull whose callers all left is cancelled, but
// every caller still waiting (its own and those sharing it) gets one error naming the image,
// the registry, the rate and the minimum, and the slot goes to the next queued pull as soon as
// the cancelled call returns. A new caller of the image starts a pull of its own. It reports
// whether a running pull was cancelled.
func (g *Governor) Stall(image string, started time.Time, rate float64, rule progress.StallRule) bool {
	g.mu.Lock()
	var stalled []*flight
	for key, f := range g.flights {
		if f.image != image || !f.started.Equal(started) || f.stall != nil || f.key.kind != KindImage {
			continue
		}
		f.stall = &stallError{image: f.image, registry: f.registry, rate: rate, rule: rule}
		delete(g.flights, key) // a new caller starts afresh rather than join a dying pull
		stalled = append(stalled, f)
		g.metrics.stalls.WithLabelValues(g.registryLabel(f.registry)).Inc()
		g.traceEvent("stalled", f)
	}
	waiters := make([]int, len(stalled))
	for i, f := range stalled {
		waiters[i] = f.waiters
	}
	g.mu.Unlock()
	for i, f := range stalled {
		klog.FromContext(f.ctx).Info("Image pull stalled; cancelling it", "image", f.image, "registry", f.registry,
			"bytesPerSecond", int64(rate), "minBytesPerSecond", rule.MinBytesPerSecond, "window", rule.Window, "waiters", waiters[i])
		f.cancel(f.stall) // the backend call ends; run gives its callers the stall
	}
	return len(stalled) > 0
}
