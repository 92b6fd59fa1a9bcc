package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podgate/podgate/test/harness"
	"github.com/podgate/podgate/test/registry"
)

// The pull scenario of issue 3: 12 distinct images (11 ordinary, then one for a
// system-node-critical pod submitted last), 6 of the ordinary ones requested twice, maxParallel 3.
// Each image is one layer of layerSize random bytes, served at bandwidth bytes/s per download.
const (
	scenarioImages  = 12
	scenarioDups    = 6
	scenarioCap     = 3
	layerSize       = 8 << 20
	bandwidth       = 4 << 20
	scenarioTimeout = 5 * time.Minute // 4 rounds of ~2s each; generous for a loaded CI machine
)

// scenarioResult is what one run of the scenario measured.
type scenarioResult struct {
	makespan, ideal time.Duration
	reg             registry.Stats // what the registry counted
	images          []string       // repositories; the last is the critical pod's
	dups            []string       // repositories requested twice
	errs            []error
}

// runScenario pulls the scenario's images through podgate and measures the registry's side.
func runScenario(ctx context.Context, tb testing.TB, n *node, reg *registry.Registry, prefix string) scenarioResult {
	tb.Helper()
	refs := reg.Push(tb, prefix, scenarioImages, layerSize)
	reg.Reset()
	reg.Count(true)
	defer reg.Count(false)
	res := scenarioResult{}
	for _, ref := range refs {
		repo, _ := strings.CutSuffix(strings.TrimPrefix(ref, reg.Host+"/"), ":v1")
		res.images = append(res.images, repo)
	}
	ctx, cancel := context.WithTimeout(ctx, scenarioTimeout)
	defer cancel()

	var wg sync.WaitGroup
	var mu sync.Mutex
	pull := func(ref string, sb *runtimeapi.PodSandboxConfig) {
		wg.Go(func() {
			if _, err := n.through.Images.PullImage(ctx, &runtimeapi.ImageSpec{Image: ref}, nil, sb); err != nil {
				mu.Lock()
				res.errs = append(res.errs, fmt.Errorf("pull %s: %w", ref, err))
				mu.Unlock()
			}
		})
	}
	sandbox := func(ns, name string, labels map[string]string) *runtimeapi.PodSandboxConfig {
		return &runtimeapi.PodSandboxConfig{Metadata: &runtimeapi.PodSandboxMetadata{Namespace: ns, Name: name, Uid: "uid-" + prefix + "-" + name}, Labels: labels}
	}
	start := time.Now()
	ordinary := refs[:scenarioImages-1]
	for i, ref := range ordinary {
		pull(ref, sandbox("e2e", fmt.Sprint("pod", i), nil))
	}
	for i, ref := range ordinary[:scenarioDups] {
		pull(ref, sandbox("e2e", fmt.Sprint("dup", i), nil))
		res.dups = append(res.dups, res.images[i])
	}
	// The critical pod comes last, once the three slots are busy and everything else queued.
	waitFor(ctx, tb, "3 images in flight and the rest queued in podgate", func() bool {
		active := reg.Stats().ActiveImages()
		m, err := n.podgate.Scrape(ctx)
		if err != nil {
			return false
		}
		queued, _ := m.Value("podgate_image_pull_queue_length")
		joined, _ := m.Value("podgate_image_pull_deduplicated_total", "kind", "image")
		return active == scenarioCap && queued == float64(len(ordinary)-scenarioCap) && joined == scenarioDups
	})
	pull(refs[scenarioImages-1], sandbox("kube-system", "critical", map[string]string{"podgate.dev/priority-class": "system-node-critical"}))
	wg.Wait()
	res.makespan = time.Since(start)
	res.reg = reg.Stats()
	res.ideal = time.Duration(float64(res.reg.Bytes) / float64(bandwidth*scenarioCap) * float64(time.Second))
	return res
}

// waitFor polls cond (every 10ms) until it holds; the scenario's timeout bounds it.
func waitFor(ctx context.Context, tb testing.TB, what string, cond func() bool) {
	tb.Helper()
	err := wait.PollUntilContextCancel(ctx, 10*time.Millisecond, true, func(context.Context) (bool, error) {
		return cond(), nil
	})
	if err != nil {
		tb.Fatalf("waiting for %s: %v", what, err)
	}
}

// TestImagePullGovernor: containerd pulls through podgate from a throttled registry with
// maxParallel 3; the registry never serves more than 3 images at once, duplicated images are
// fetched once, and the critical pod's pull, submitted last, starts at the next free slot.
func TestImagePullGovernor(t *testing.T) {
	n := startNode(t, "--config", writeConfig(t, fmt.Sprintf("imagePulls:\n  maxParallel: %d\n", scenarioCap)))
	reg := registry.New(bandwidth)
	host := reg.Serve(t)
	res := runScenario(t.Context(), t, n, reg, "e2e")
	for _, err := range res.errs {
		t.Error(err)
	}
	if reg := res.reg; reg.MaxImages > scenarioCap {
		t.Errorf("registry served %d images at once, maxParallel %d", reg.MaxImages, scenarioCap)
	}
	for key, gets := range res.reg.BlobGets {
		if gets != 1 {
			t.Errorf("blob %s fetched %d times, want once", key, gets)
		}
	}
	for _, repo := range res.dups {
		blobs := 0
		for key := range res.reg.BlobGets {
			if strings.HasPrefix(key, repo+"@") {
				blobs++
			}
		}
		if blobs < 2 { // config and layer
			t.Errorf("duplicated image %s: %d blobs fetched, want its config and layer", repo, blobs)
		}
	}
	critical := res.images[len(res.images)-1]
	started := res.reg.Started
	if len(started) != scenarioImages {
		t.Fatalf("registry saw %d images, want %d: %v", len(started), scenarioImages, started)
	}
	// 3 were running when it came; it must be the next to start. podgate's log has the
	// governor's start order; at the registry, the three first pulls end together, so the next
	// three start within milliseconds of each other: the critical one must be among them.
	if got := harness.PullsStarted(n.podgate.Log.String()); len(got) <= scenarioCap || got[scenarioCap] != host+"/"+critical+":v1" {
		t.Errorf("podgate started pulls in order %v: the critical pod's %s should be 4th, right after the 3 running", got, critical)
	}
	if !slices.Contains(started[scenarioCap:2*scenarioCap], critical) {
		t.Errorf("registry saw images start in order %v: the critical pod's %s should start with the next free slots", started, critical)
	}
	t.Logf("makespan %s, ideal %s (%.1f%% over); registry served at most %d images at once",
		res.makespan.Round(time.Millisecond), res.ideal.Round(time.Millisecond),
		100*(res.makespan.Seconds()/res.ideal.Seconds()-1), res.reg.MaxImages)
	m, err := n.podgate.Metrics(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(m, `podgate_image_pull_duration_seconds_count{kind="image",result="success"} 12`) {
		t.Errorf("metrics lack 12 successful backend pulls:\n%s", grepLines(m, "podgate_image_pull"))
	}
	if !strings.Contains(n.podgate.Log.String(), "Image pull waits") {
		t.Error("podgate logged no waiting pull")
	}
}

func grepLines(s, sub string) string {
	var out []string
	for line := range strings.Lines(s) {
		if strings.Contains(line, sub) {
			out = append(out, strings.TrimSpace(line))
		}
	}
	return strings.Join(out, "\n")
}

// BenchmarkImagePullMakespan runs the scenario of TestImagePullGovernor and reports its
// makespan against the ideal: total bytes ÷ (per-download bandwidth × maxParallel). Run it
// with -benchtime 1x (one run takes ~10s); each iteration pulls fresh images.
func BenchmarkImagePullMakespan(b *testing.B) {
	n := startNode(b, "--config", writeConfig(b, fmt.Sprintf("imagePulls:\n  maxParallel: %d\n", scenarioCap)))
	reg := registry.New(bandwidth)
	reg.Serve(b)
	var makespan, ideal time.Duration
	i := 0
	for b.Loop() {
		b.StopTimer()
		prefix := fmt.Sprintf("bench%d", i)
		i++
		b.StartTimer()
		res := runScenario(b.Context(), b, n, reg, prefix)
		for _, err := range res.errs {
			b.Error(err)
		}
		makespan += res.makespan
		ideal += res.ideal
	}
	b.ReportMetric(makespan.Seconds()/float64(i), "makespan-s")
	b.ReportMetric(ideal.Seconds()/float64(i), "ideal-s")
	b.ReportMetric(makespan.Seconds()/ideal.Seconds(), "makespan/ideal")
}
