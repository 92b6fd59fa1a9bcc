//go:build linux

package tour

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podgate/podgate/test/cni/record"
	"github.com/podgate/podgate/test/demo/timeline"
	"github.com/podgate/podgate/test/dranode"
	"github.com/podgate/podgate/test/scrape"
)

// SandboxStages are the stages of podgate's RunPodSandbox pipeline, in the order they run
// (agent/pipeline.go, sandboxStages). The timeline takes the order from podgate's spans; the
// metrics say each stage's time (podgate_sandbox_stage_duration_seconds{stage}) but not the
// order, so the step lines read them in this order, and refuse a stage this list lacks.
var SandboxStages = []string{"sysctl-check", "dra-prepare", "forward", "status", "sysctl-verify", "dra-attach", "pod-resources", "record"}

// Metric names the pod starts read.
const (
	stageMetric     = "podgate_sandbox_stage_duration_seconds"
	pullWaitMetric  = "podgate_image_pull_wait_seconds"
	pullTimeMetric  = "podgate_image_pull_duration_seconds"
	blockersPerPull = registryACap // pulls from registry A ahead of a pod's own: its cap is full
)

// PodStart is one pod started as the kubelet starts it, with podgate's timings of it.
type PodStart struct {
	Pod         *corev1.Pod
	Image       string
	SandboxID   string
	ContainerID string
	// Stages are podgate's RunPodSandbox stages, in order, with their durations, from its
	// metrics.
	Stages []StageTime
	// PullWait is how long the pod's pull waited in podgate's queue, Pull how long containerd
	// then took, both as podgate's metrics timed them.
	PullWait, Pull time.Duration
	// Timeline is the pod's start on one time axis.
	Timeline timeline.Pod
	// CNIAdd is what the recording CNI plugin saw at the pod's CNI ADD.
	CNIAdd record.Entry
}

// StageTime is one stage's duration as podgate measured it.
type StageTime struct {
	Name     string
	Duration time.Duration
}

// Stage returns the named stage's duration.
func (s *PodStart) Stage(name string) time.Duration {
	for _, st := range s.Stages {
		if st.Name == name {
			return st.Duration
		}
	}
	return 0
}

// startedPod is a pod the demo started through podgate, for the cleanup.
type startedPod struct {
	pod                *corev1.Pod
	sandbox, container string
}

// call is a CRI call as the kubelet's side saw it.
type call struct{ start, end time.Time }

func timed(fn func() error) (call, error) {
	c := call{start: time.Now()}
	err := fn()
	c.end = time.Now()
	return c, err
}

// startPod starts pod as the kubelet does: RunPodSandbox, then PullImage of its image (which
// waits in podgate's queue behind pulls of other pods from registry A, whose cap they fill),
// then CreateContainer and StartContainer. The timeline draws the calls as the demo saw them
// and, inside them, podgate's spans of its stages, the pull's wait and the pull (its traces).
// The same times come from podgate's histograms too: one pod starts at a time, so their change
// across each call is that call's own; the step lines print those, and the test checks that
// both sources agree.
func (e *Env) startPod(ctx context.Context, pod *corev1.Pod, image string) (*PodStart, error) {
	ps := &PodStart{Pod: pod, Image: image}
	sb := e.sandboxConfig(pod)
	// The pods whose pulls fill registry A's cap are ready beforehand: the kubelet pulls right
	// after RunPodSandbox.
	ahead, err := e.podsAhead(ctx, pod.Name)
	if err != nil {
		return nil, err
	}
	before, err := e.Podgate.Scrape(ctx)
	if err != nil {
		return nil, err
	}
	run, err := timed(func() (err error) {
		ps.SandboxID, err = e.Through.Runtime.RunPodSandbox(ctx, sb, "")
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("RunPodSandbox %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	e.sandboxes = append(e.sandboxes, startedPod{pod: pod, sandbox: ps.SandboxID})
	after, err := e.Podgate.Scrape(ctx)
	if err != nil {
		return nil, err
	}
	if ps.Stages, err = stageTimes(before, after); err != nil {
		return nil, err
	}

	pull, err := e.queuedPull(ctx, ps, sb, ahead)
	if err != nil {
		return nil, err
	}

	var ctrID string
	create, err := timed(func() (err error) {
		ctrID, err = e.Through.Runtime.CreateContainer(ctx, ps.SandboxID, &runtimeapi.ContainerConfig{
			Metadata: &runtimeapi.ContainerMetadata{Name: "c"},
			Image:    &runtimeapi.ImageSpec{Image: image},
			Command:  []string{"sleep", "3600"},
			LogPath:  "c/0.log",
			Linux:    &runtimeapi.LinuxContainerConfig{},
		}, sb)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("CreateContainer in %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	ps.ContainerID = ctrID
	e.sandboxes[len(e.sandboxes)-1].container = ctrID
	start, err := timed(func() error { return e.Through.Runtime.StartContainer(ctx, ctrID) })
	if err != nil {
		return nil, fmt.Errorf("StartContainer in %s/%s: %w", pod.Namespace, pod.Name, err)
	}

	spans, err := e.podgateSpans(ctx, pod)
	if err != nil {
		return nil, err
	}
	ps.Timeline = timeline.Pod{Name: pod.Namespace + "/" + pod.Name}
	tl := &ps.Timeline
	tl.Spans = append(tl.Spans, timeline.Span{Lane: timeline.Kubelet, Name: "RunPodSandbox", Start: run.start, End: run.end})
	tl.Spans = append(tl.Spans, spans.stages...)
	tl.Spans = append(tl.Spans, timeline.Span{Lane: timeline.Kubelet, Name: "PullImage", Start: pull.start, End: pull.end, Detail: image})
	tl.Spans = append(tl.Spans, spans.wait, spans.pull,
		timeline.Span{Lane: timeline.Kubelet, Name: "CreateContainer", Start: create.start, End: create.end},
		timeline.Span{Lane: timeline.Kubelet, Name: "StartContainer", Start: start.start, End: start.end},
	)
	if err := e.markCNIAdd(ps); err != nil {
		return nil, err
	}
	return ps, nil
}

// markCNIAdd marks on the pod's timeline when the recording CNI plugin ran the pod's CNI ADD.
func (e *Env) markCNIAdd(ps *PodStart) error {
	add, ok, err := dranode.CNIAdd(e.Records, ps.Pod.Namespace, ps.Pod.Name)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("the recording CNI plugin saw no CNI ADD of %s/%s", ps.Pod.Namespace, ps.Pod.Name)
	}
	var present []string
	for name, there := range add.Interfaces {
		if there {
			present = append(present, name)
		}
	}
	slices.Sort(present)
	detail := "recording CNI plugin; driver interfaces on the host: none"
	if len(present) > 0 {
		detail = "recording CNI plugin; driver interfaces on the host: " + strings.Join(present, ", ")
	}
	ps.Timeline.Marks = append(ps.Timeline.Marks, timeline.Mark{Name: "CNI ADD", At: add.Time, Detail: detail})
	ps.CNIAdd = add
	return nil
}

// Zoomed is the pod's RunPodSandbox alone, with its stages and the instants inside it: on the
// whole start's axis, stages of microseconds are lines.
func (ps *PodStart) Zoomed() timeline.Pod {
	z := timeline.Pod{Name: ps.Timeline.Name + ": RunPodSandbox"}
	run := ps.Timeline.Spans[0]
	for _, s := range ps.Timeline.Spans {
		if !s.Start.Before(run.Start) && !s.End.After(run.End) {
			z.Spans = append(z.Spans, s)
		}
	}
	for _, m := range ps.Timeline.Marks {
		if !m.At.Before(run.Start) && !m.At.After(run.End) {
			z.Marks = append(z.Marks, m)
		}
	}
	return z
}

// stageDetail says what each stage does, for the timeline's hover text.
var stageDetail = map[string]string{
	"sysctl-check":  "validate the pod's sysctls, add the node defaults",
	"dra-prepare":   "the DRA drivers prepare the pod's claims: devices exist before CNI",
	"forward":       "containerd creates the sandbox: network namespace, CNI, pause",
	"status":        "the new sandbox's status, read once",
	"sysctl-verify": "sysctls read back inside the pod (verify: fail)",
	"dra-attach":    "network devices moved into the pod",
	"record":        "the pod registry and its checkpoint",
}

// aheadPull is a pull of another pod that goes ahead of a pod's own.
type aheadPull struct {
	pod *corev1.Pod
	ref string
}

// podsAhead makes, for the pod of that name, the pods (and their images, on registry A) whose
// pulls go ahead of its own and fill registry A's cap.
func (e *Env) podsAhead(ctx context.Context, name string) ([]aheadPull, error) {
	var out []aheadPull
	for i := range blockersPerPull {
		img, err := randomImage()
		if err != nil {
			return nil, err
		}
		ahead := fmt.Sprintf("%s-ahead-%d", name, i+1)
		ref, err := e.RegA.PushImage("ahead/"+ahead+":v1", img)
		if err != nil {
			return nil, err
		}
		pod, err := e.createPod(ctx, Namespace, ahead, ref, nil)
		if err != nil {
			return nil, err
		}
		out = append(out, aheadPull{pod: pod, ref: ref})
	}
	return out, nil
}

// queuedPull pulls the pod's image once the pulls ahead fill registry A's cap, so that it waits
// in podgate's queue (the wait includes the time registry A held the downloads ahead), and takes podgate's wait and pull times of it from the change of its
// histograms: once the pulls ahead have been answered (their times are recorded before their
// answers) and before the pod's own is (recorded just before its answer).
func (e *Env) queuedPull(ctx context.Context, ps *PodStart, sb *runtimeapi.PodSandboxConfig, ahead []aheadPull) (call, error) {
	// Registry A holds the downloads ahead until the pod's own pull waits behind them: they
	// take a second, and on a loaded machine starting the pod's pull may take longer.
	e.RegA.Hold()
	defer e.RegA.Release()
	var wg sync.WaitGroup
	errs := make([]error, len(ahead)+1)
	for i, a := range ahead {
		wg.Go(func() {
			_, errs[i+1] = e.Through.Images.PullImage(ctx, &runtimeapi.ImageSpec{Image: a.ref}, nil, e.sandboxConfig(a.pod))
		})
	}
	if err := e.waitMetric(ctx, "registry A's cap filled", "podgate_image_pull_registry_in_flight", float64(len(ahead)), "registry", e.RegA.Host); err != nil {
		return call{}, errors.Join(err, waitErrs(&wg, errs))
	}
	var pull call
	done := make(chan struct{})
	go func() {
		defer close(done)
		pull, errs[0] = timed(func() error {
			_, err := e.Through.Images.PullImage(ctx, &runtimeapi.ImageSpec{Image: ps.Image}, nil, sb)
			return err
		})
	}()
	// Every pull started here has ended when queuedPull returns, whatever went wrong.
	if err := e.waitMetric(ctx, "the pod's pull queued", "podgate_image_pull_queue_length", 1); err != nil {
		err = errors.Join(err, waitErrs(&wg, errs[1:]))
		<-done
		return call{}, err
	}
	e.RegA.Release()
	if err := waitErrs(&wg, errs[1:]); err != nil {
		<-done
		return call{}, err
	}
	mid, err := e.Podgate.Scrape(ctx)
	<-done
	if err != nil {
		return call{}, err
	}
	if errs[0] != nil {
		return call{}, fmt.Errorf("PullImage %s for %s/%s: %w", ps.Image, ps.Pod.Namespace, ps.Pod.Name, errs[0])
	}
	after, err := e.Podgate.Scrape(ctx)
	if err != nil {
		return call{}, err
	}
	wait, err := once(after, mid, pullWaitMetric, "kind", "image")
	if err != nil {
		return call{}, err
	}
	took, err := once(after, mid, pullTimeMetric, "kind", "image", "result", "success")
	if err != nil {
		return call{}, err
	}
	ps.PullWait, ps.Pull = wait, took
	return pull, nil
}

func waitErrs(wg *sync.WaitGroup, errs []error) error {
	wg.Wait()
	return errors.Join(errs...)
}

// once is the one observation of a histogram between two scrapes; anything else means the
// scrapes do not isolate one call, and the timeline would lie.
func once(after, before scrape.Metrics, name string, labels ...string) (time.Duration, error) {
	d := after.Histogram(name, labels...).Sub(before.Histogram(name, labels...))
	if d.Count != 1 {
		return 0, fmt.Errorf("%s%v: %d observations between two scrapes, want exactly one: the timeline cannot tell whose they are", name, labels, d.Count)
	}
	return secs(d.Sum), nil
}

// stageTimes returns the duration of each pipeline stage between two scrapes around one
// RunPodSandbox, in pipeline order.
func stageTimes(before, after scrape.Metrics) ([]StageTime, error) {
	var out []StageTime
	for _, name := range SandboxStages {
		d, err := once(after, before, stageMetric, "stage", name)
		if err != nil {
			return nil, err
		}
		out = append(out, StageTime{Name: name, Duration: d})
	}
	seen := map[string]bool{}
	for _, m := range after[stageMetric].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "stage" {
				seen[l.GetValue()] = true
			}
		}
	}
	for _, name := range SandboxStages {
		delete(seen, name)
	}
	if len(seen) > 0 {
		return nil, fmt.Errorf("podgate reports pipeline stages %v the demo does not know: add them to tour.SandboxStages in their order (agent/pipeline.go)",
			slices.Sorted(maps.Keys(seen)))
	}
	return out, nil
}

func secs(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
