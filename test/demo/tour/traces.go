//go:build linux

package tour

import (
	"cmp"
	"context"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/podgate/podgate/test/demo/timeline"
	"github.com/podgate/podgate/test/otlpfake"
)

// Names of podgate's spans the timeline draws (agent/pipeline.go, cri/imagepull).
const (
	stageSpanPrefix = "RunPodSandbox/"
	pullWaitSpan    = "image pull: wait for a slot"
	pullSpan        = "image pull"
)

// traceEnv is what podgate needs to send its spans to the demo's collector: every trace sampled
// by the configuration, and exported every 100 ms instead of the SDK's 5 s, so that a pod's spans
// are there moments after it started.
var traceEnv = []string{"OTEL_BSP_SCHEDULE_DELAY=100"}

// podSpans are podgate's spans of one pod start, as timeline spans.
type podSpans struct {
	// stages are the RunPodSandbox pipeline's stages, in the order podgate ran them.
	stages []timeline.Span
	// wait is the pod's pull's wait for a slot in podgate's queue; pull the pull itself.
	wait, pull timeline.Span
}

// podgateSpans waits until podgate's traces of the pod's start have reached the collector (a
// span per stage of its RunPodSandbox, its pull's wait for a slot and the pull that followed)
// and returns them.
func (e *Env) podgateSpans(ctx context.Context, pod *corev1.Pod) (podSpans, error) {
	var out podSpans
	err := e.waitFor(ctx, "podgate's spans of pod "+pod.Namespace+"/"+pod.Name, func(context.Context) (bool, error) {
		all := e.Traces.Spans()
		var stages []otlpfake.Span
		for _, s := range all {
			if s.Service == "podgate" && strings.HasPrefix(s.Name, stageSpanPrefix) && s.Attributes["k8s.pod.uid"] == string(pod.UID) {
				stages = append(stages, s)
			}
		}
		waits := slices.DeleteFunc(otlpfake.Find(all, "podgate", pullWaitSpan), func(s otlpfake.Span) bool {
			return s.Attributes["pod"] != pod.Namespace+"/"+pod.Name
		})
		if len(stages) < len(SandboxStages) || len(waits) == 0 {
			return false, nil
		}
		// The pull runs in the trace of the call that started it: a child of the same call.
		pulls := slices.DeleteFunc(otlpfake.Find(all, "podgate", pullSpan), func(s otlpfake.Span) bool {
			return s.ParentID != waits[0].ParentID
		})
		if len(pulls) == 0 {
			return false, nil
		}
		slices.SortFunc(stages, func(a, b otlpfake.Span) int { return cmp.Compare(a.StartUnixNano, b.StartUnixNano) })
		out = podSpans{
			wait: span(waits[0], "pull-wait", "in podgate's queue: registry A's cap was full"),
			pull: span(pulls[0], "pull", "containerd pulling"),
		}
		// The wait's span ends when its caller has woken up to the pull's start, a little after
		// the pull's own span began: the wait ended when the pull took its slot.
		if out.wait.End.After(out.pull.Start) {
			out.wait.End = out.pull.Start
		}
		for _, s := range stages {
			name := strings.TrimPrefix(s.Name, stageSpanPrefix)
			out.stages = append(out.stages, span(s, name, stageDetail[name]))
		}
		return true, nil
	})
	return out, err
}

// span is one of podgate's spans on the timeline, as name.
func span(s otlpfake.Span, name, detail string) timeline.Span {
	return timeline.Span{
		Lane: timeline.Podgate, Name: name, Detail: detail,
		Start: time.Unix(0, int64(s.StartUnixNano)), End: time.Unix(0, int64(s.EndUnixNano)),
	}
}
