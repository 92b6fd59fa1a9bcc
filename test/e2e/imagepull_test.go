package e2e

import (
	"context"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
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

var repoPath = regexp.MustCompile(`^/v2/(.+)/(manifests|blobs)/([^/]+)$`)

// countingRegistry is an in-process OCI registry whose blob downloads are throttled to a fixed
// bandwidth each, and which records, per image (repository), the requests it serves.
type countingRegistry struct {
	handler   http.Handler
	bandwidth int
	counting  atomic.Bool // off while the test pushes its images

	mu        sync.Mutex
	active    map[string]int // requests being served, per repository
	maxImages int            // most repositories served at once
	blobGets  map[string]int // GETs per repository@digest
	started   []string       // repositories in the order of their first request
	firstSeen map[string]time.Time
	lastDone  time.Time
	bytes     int64 // blob bytes served
}

func newCountingRegistry(bw int) *countingRegistry {
	return &countingRegistry{
		handler:   registry.New(registry.Logger(log.New(io.Discard, "", 0))),
		bandwidth: bw,
		active:    map[string]int{}, blobGets: map[string]int{}, firstSeen: map[string]time.Time{},
	}
}

func (r *countingRegistry) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	m := repoPath.FindStringSubmatch(req.URL.Path)
	if m == nil || !r.counting.Load() || (req.Method != http.MethodGet && req.Method != http.MethodHead) {
		r.handler.ServeHTTP(w, req)
		return
	}
	repo, kind := m[1], m[2]
	r.begin(repo, kind == "blobs" && req.Method == http.MethodGet, m[3])
	defer r.end(repo)
	if kind == "blobs" && req.Method == http.MethodGet {
		pw := &pacedWriter{ResponseWriter: w, bps: r.bandwidth, start: time.Now()}
		r.handler.ServeHTTP(pw, req)
		r.mu.Lock()
		r.bytes += pw.written
		r.mu.Unlock()
		return
	}
	r.handler.ServeHTTP(w, req)
}

// reset forgets what was counted.
func (r *countingRegistry) reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.active, r.blobGets, r.firstSeen = map[string]int{}, map[string]int{}, map[string]time.Time{}
	r.maxImages, r.started, r.bytes = 0, nil, 0
}

func (r *countingRegistry) begin(repo string, blobGet bool, digest string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, seen := r.firstSeen[repo]; !seen {
		r.firstSeen[repo] = time.Now()
		r.started = append(r.started, repo)
	}
	if blobGet {
		r.blobGets[repo+"@"+digest]++
	}
	r.active[repo]++
	n := 0
	for _, a := range r.active {
		if a > 0 {
			n++
		}
	}
	r.maxImages = max(r.maxImages, n)
}

func (r *countingRegistry) end(repo string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.active[repo]--
	r.lastDone = time.Now()
}

// activeImages returns how many repositories are being served and how many were ever started.
func (r *countingRegistry) activeImages() (active, started int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, a := range r.active {
		if a > 0 {
			active++
		}
	}
	return active, len(r.started)
}

// pacedWriter throttles a response to bps bytes per second.
type pacedWriter struct {
	http.ResponseWriter
	bps     int
	start   time.Time
	written int64
}

func (p *pacedWriter) Write(b []byte) (int, error) {
	const chunk = 32 << 10
	n := 0
	for len(b) > 0 {
		c := min(chunk, len(b))
		w, err := p.ResponseWriter.Write(b[:c])
		n += w
		p.written += int64(w)
		if err != nil {
			return n, err
		}
		b = b[c:]
		due := p.start.Add(time.Duration(float64(p.written) / float64(p.bps) * float64(time.Second)))
		time.Sleep(time.Until(due)) // the throttle: this download may not run ahead of bps
	}
	return n, nil
}

// scenarioResult is what one run of the scenario measured.
type scenarioResult struct {
	makespan, ideal time.Duration
	reg             *countingRegistry
	images          []string // repositories; the last is the critical pod's
	dups            []string // repositories requested twice
	errs            []error
}

// serveRegistry starts the counting registry on 127.0.0.1 and returns its host:port.
func serveRegistry(tb testing.TB, reg *countingRegistry) string {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	srv := &http.Server{Handler: reg, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(l) }() // ErrServerClosed after Close below
	tb.Cleanup(func() { _ = srv.Close() })
	return l.Addr().String()
}

// pushImages pushes n random one-layer images as host/<prefix>/imgI:v1.
func pushImages(tb testing.TB, host, prefix string, n int) []string {
	tb.Helper()
	var refs []string
	for i := range n {
		img, err := random.Image(layerSize, 1)
		if err != nil {
			tb.Fatal(err)
		}
		ref, err := name.ParseReference(fmt.Sprintf("%s/%s/img%d:v1", host, prefix, i))
		if err != nil {
			tb.Fatal(err)
		}
		if err := remote.Write(ref, img); err != nil {
			tb.Fatalf("push %s: %v", ref, err)
		}
		refs = append(refs, ref.String())
	}
	return refs
}

// runScenario pulls the scenario's images through podgate and measures the registry's side.
func runScenario(ctx context.Context, tb testing.TB, n *node, reg *countingRegistry, host, prefix string) scenarioResult {
	tb.Helper()
	refs := pushImages(tb, host, prefix, scenarioImages)
	reg.reset()
	reg.counting.Store(true)
	defer reg.counting.Store(false)
	res := scenarioResult{reg: reg}
	for _, ref := range refs {
		repo, _ := strings.CutSuffix(strings.TrimPrefix(ref, host+"/"), ":v1")
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
		active, _ := reg.activeImages()
		m, err := n.podgate.Metrics(ctx)
		return err == nil && active == scenarioCap &&
			metricValue(m, "podgate_image_pull_queue_length") == float64(len(ordinary)-scenarioCap) &&
			metricValue(m, "podgate_image_pull_deduplicated_total") == scenarioDups
	})
	pull(refs[scenarioImages-1], sandbox("kube-system", "critical", map[string]string{"podgate.dev/priority-class": "system-node-critical"}))
	wg.Wait()
	res.makespan = time.Since(start)
	var total int64
	reg.mu.Lock()
	total = reg.bytes
	reg.mu.Unlock()
	res.ideal = time.Duration(float64(total) / float64(bandwidth*scenarioCap) * float64(time.Second))
	return res
}

// waitFor polls cond (every 10ms) until it holds; the scenario's timeout bounds it.
func waitFor(ctx context.Context, tb testing.TB, what string, cond func() bool) {
	tb.Helper()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			tb.Fatalf("waiting for %s: %v", what, ctx.Err())
		case <-tick.C:
		}
	}
}

// metricValue returns the value of an unlabelled metric on a /metrics page, or -1.
func metricValue(page, metric string) float64 {
	for line := range strings.Lines(page) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), metric+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err == nil {
				return f
			}
		}
	}
	return -1
}

// TestImagePullGovernor: containerd pulls through podgate from a throttled registry with
// maxParallel 3; the registry never serves more than 3 images at once, duplicated images are
// fetched once, and the critical pod's pull, submitted last, starts at the next free slot.
func TestImagePullGovernor(t *testing.T) {
	n := startNode(t, "--config", writeConfig(t, fmt.Sprintf("imagePulls:\n  maxParallel: %d\n", scenarioCap)))
	reg := newCountingRegistry(bandwidth)
	host := serveRegistry(t, reg)
	res := runScenario(t.Context(), t, n, reg, host, "e2e")
	for _, err := range res.errs {
		t.Error(err)
	}
	reg.mu.Lock()
	defer reg.mu.Unlock()
	if reg.maxImages > scenarioCap {
		t.Errorf("registry served %d images at once, maxParallel %d", reg.maxImages, scenarioCap)
	}
	for key, gets := range reg.blobGets {
		if gets != 1 {
			t.Errorf("blob %s fetched %d times, want once", key, gets)
		}
	}
	for _, repo := range res.dups {
		blobs := 0
		for key := range reg.blobGets {
			if strings.HasPrefix(key, repo+"@") {
				blobs++
			}
		}
		if blobs < 2 { // config and layer
			t.Errorf("duplicated image %s: %d blobs fetched, want its config and layer", repo, blobs)
		}
	}
	critical := res.images[len(res.images)-1]
	if len(reg.started) != scenarioImages {
		t.Fatalf("registry saw %d images, want %d: %v", len(reg.started), scenarioImages, reg.started)
	}
	// 3 were running when it came; it must be the next to start. podgate's log has the
	// governor's start order; at the registry, the three first pulls end together, so the next
	// three start within milliseconds of each other: the critical one must be among them.
	if got := startOrder(n.podgate.Log.String()); len(got) <= scenarioCap || got[scenarioCap] != host+"/"+critical+":v1" {
		t.Errorf("podgate started pulls in order %v: the critical pod's %s should be 4th, right after the 3 running", got, critical)
	}
	if !slices.Contains(reg.started[scenarioCap:2*scenarioCap], critical) {
		t.Errorf("registry saw images start in order %v: the critical pod's %s should start with the next free slots", reg.started, critical)
	}
	t.Logf("makespan %s, ideal %s (%.1f%% over); registry served at most %d images at once",
		res.makespan.Round(time.Millisecond), res.ideal.Round(time.Millisecond),
		100*(res.makespan.Seconds()/res.ideal.Seconds()-1), reg.maxImages)
	m, err := n.podgate.Metrics(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(m, `podgate_image_pull_duration_seconds_count{result="success"} 12`) {
		t.Errorf("metrics lack 12 successful backend pulls:\n%s", grepLines(m, "podgate_image_pull"))
	}
	if !strings.Contains(n.podgate.Log.String(), "Image pull waits") {
		t.Error("podgate logged no waiting pull")
	}
}

var startedLine = regexp.MustCompile(`"Image pull started" image="([^"]+)"`)

// startOrder returns the images in the order podgate's log says their pulls started.
func startOrder(log string) []string {
	var out []string
	for _, m := range startedLine.FindAllStringSubmatch(log, -1) {
		out = append(out, m[1])
	}
	return out
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
	reg := newCountingRegistry(bandwidth)
	host := serveRegistry(b, reg)
	var makespan, ideal time.Duration
	i := 0
	for b.Loop() {
		b.StopTimer()
		prefix := fmt.Sprintf("bench%d", i)
		i++
		b.StartTimer()
		res := runScenario(b.Context(), b, n, reg, host, prefix)
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
