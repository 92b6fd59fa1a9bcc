package resources

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	"go.opentelemetry.io/otel/attribute"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"

	"github.com/podgate/podgate/cri/pipeline"
	"github.com/podgate/podgate/cri/registry"
	"github.com/podgate/podgate/podresources/cgroup"
)

// verifyContainer reads the container's cgroup and compares it with what was asked. It
// returns an error only for a mismatch (the fail policy's answer to the kubelet); a cgroup
// that cannot be read is recorded and logged, not returned.
func (s *Hooks) verifyContainer(ctx context.Context, id, after string) (err error) {
	start := time.Now()
	defer func() { s.verifyTime.Observe(time.Since(start).Seconds()) }()
	ctx, span := pipeline.StartSpan(ctx, "cgroup verification", attribute.String("containerID", id), attribute.String("after", after))
	defer func() { pipeline.EndSpan(span, err) }()
	logger := klog.FromContext(ctx).WithValues("containerID", id)
	rec, ok := s.containers.Container(id)
	if !ok {
		return nil // removed meanwhile
	}
	e, _ := s.records.get(id) // none: nothing asked to compare with
	asked, path := e.asked, rec.CgroupsPath
	if path == "" {
		var err error
		if path, err = s.cgroupsPath(ctx, id); err != nil {
			if status.Code(err) == codes.NotFound {
				// Removed behind podgate's back (straight at the runtime): forget it, or it
				// would be read again every recheck period.
				s.containers.RemoveContainer(id)
				logger.V(2).Info("Container gone from the runtime: forgotten", "after", after)
				return nil
			}
			if s.record(id, after, nil, nil, err) {
				logger.Info("Cannot verify the container's cgroup", "after", after, "err", err)
			}
			return nil
		}
	}
	held, err := cgroup.Read(ctx, path, cgroup.ForResources(asked))
	if err != nil && rec.CgroupsPath != "" {
		// The path taken from the request may not be the runtime's (another runtime than
		// containerd): ask the runtime, once, and read again where it says.
		if rt, rerr := s.cgroupsPath(ctx, id); rerr == nil && rt != path {
			path = rt
			held, err = cgroup.Read(ctx, path, cgroup.ForResources(asked))
		}
	}
	if err != nil {
		if s.record(id, after, nil, nil, err) {
			logger.Info("Cannot read the container's cgroup", "after", after, "cgroupsPath", path, "err", err)
		}
		return nil
	}
	mismatches := cgroup.Compare(asked, held)
	changed := s.record(id, after, held, mismatches, nil)
	if len(mismatches) == 0 {
		if changed {
			logger.V(2).Info("Container's cgroup holds what was asked", "after", after)
		}
		return nil
	}
	var list []string
	for _, m := range mismatches {
		list = append(list, m.String())
	}
	if changed {
		logger.Info("Container's cgroup does not hold what was asked", "after", after, "cgroupsPath", path, "mismatches", list)
	}
	return errdefs.ErrFailedPrecondition.WithMessage(fmt.Sprintf("container %s: its cgroup does not hold what was asked: %v", id, list))
}

// record stores a verification's result. It reports whether it is news worth a log line: the
// check follows a CRI call, or a recheck found the result changed (a recheck repeating the
// last result stays quiet).
func (s *Hooks) record(id, after string, held *cgroup.Held, mismatches []cgroup.Mismatch, err error) bool {
	result := verificationResult(mismatches, err)
	s.verifications.WithLabelValues(after, result).Inc()
	news := false
	s.records.update(id, func(c *container) {
		prev := c.verification + "|" + strings.Join(c.mismatches, ";") + "|" + c.err
		c.verification, c.held, c.mismatches, c.err, c.verifiedAt = result, held, mismatchStrings(mismatches), "", time.Now()
		if err != nil {
			c.err = err.Error()
		}
		news = after != "recheck" || prev != c.verification+"|"+strings.Join(c.mismatches, ";")+"|"+c.err
	})
	return news
}

// cgroupsPath reads the container's linux.cgroupsPath from its runtime spec, and remembers it.
func (s *Hooks) cgroupsPath(ctx context.Context, id string) (string, error) {
	path, err := registry.ContainerCgroupsPath(ctx, s.runtime, id)
	if err != nil {
		return "", err
	}
	s.containers.UpdateContainer(id, func(c *registry.ContainerRecord) { c.CgroupsPath = path })
	return path, nil
}

// Run reads every known container's cgroup, and every pod cgroup read once after a resize,
// again each recheck period, until ctx ends: a change made behind the runtime's back shows as
// a mismatch.
func (s *Hooks) Run(ctx context.Context) {
	if s.recheck <= 0 {
		return
	}
	t := time.NewTicker(s.recheck)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		// Started (checked once already, or found running at start-up), not pending.
		for _, id := range s.records.started() {
			_ = s.verifyContainer(ctx, id, "recheck") // recorded and logged there
		}
		s.recheckPods(ctx)
	}
}

// Wait waits for the background verifications, until ctx ends (shutdown, tests).
func (s *Hooks) Wait(ctx context.Context) error { return s.background.Wait(ctx) }

// verificationResult is a cgroup check's result as the records and the metrics name it.
func verificationResult(mismatches []cgroup.Mismatch, err error) string {
	switch {
	case err != nil:
		return ResultError
	case len(mismatches) > 0:
		return ResultMismatch
	}
	return ResultOK
}
