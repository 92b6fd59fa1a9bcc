package e2e

import (
	"context"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/random"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podgate/podgate/test/harness"
	"github.com/podgate/podgate/test/registry"
)

// The stall scenario of issue 31: a pull whose second layer trickles at trickleRate, below
// stallMin, is cancelled after stallWindow; layers are stallLayer bytes. containerd writes a
// blob to its content store in 1 MiB pieces or at its end, so the trickled layer shows no byte
// until it ends, and podgate counts the whole of it as possibly received: stallMin over the
// window (24 KiB) must exceed the layer (8 KiB and its tar header) for the stall to show.
const (
	stallMin     = 8 << 10
	stallWindow  = 3 * time.Second
	trickleRate  = 300
	stallLayer   = 8 << 10
	stallTimeout = 2 * time.Minute
	// stallMargin is what may pass, beyond the window, between the pull's start and its
	// callers' error: the first reading of its bytes (a poll a second, once the manifest is
	// stored), the reading that finds the window full (a second), and a loaded machine.
	stallMargin = 4 * time.Second
)

// stallConfig is podgate's configuration for the stall tests: one pull at a time, stalled
// below minRate over stallWindow.
func stallConfig(t testing.TB, minRate int) string {
	return writeConfig(t, fmt.Sprintf("imagePulls:\n  maxParallel: 1\n  stall:\n    minBytesPerSecond: %d\n    window: %s\n", minRate, stallWindow))
}

// pushTwoLayers pushes a random image of two layers of size bytes as <host>/<repoTag> and
// returns its reference, its config's digest and its layers' digests.
func pushTwoLayers(t *testing.T, reg *registry.Registry, repoTag string, size int64) (ref, config string, layers []string) {
	t.Helper()
	img, err := random.Image(size, 2)
	if err != nil {
		t.Fatal(err)
	}
	if ref, err = reg.PushImage(repoTag, img); err != nil {
		t.Fatal(err)
	}
	cfg, err := img.ConfigName()
	if err != nil {
		t.Fatal(err)
	}
	ls, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range ls {
		d, err := l.Digest()
		if err != nil {
			t.Fatal(err)
		}
		layers = append(layers, d.String())
	}
	return ref, cfg.String(), layers
}

// blobRequests is the blob GETs of the log by digest, each with its Range header.
func blobRequests(log []registry.Request) map[string][]string {
	out := map[string][]string{}
	for _, q := range log {
		if q.Kind == "blobs" && q.Method == http.MethodGet {
			out[q.Ref] = append(out[q.Ref], q.Range)
		}
	}
	return out
}

// TestImagePullStall: containerd pulls through podgate with maxParallel 1 from a registry
// whose second layer trickles at 300 B/s; a second pod shares the pull and a third image
// waits behind it. podgate finds the stall within the window and a small margin, cancels the
// pull, both callers get one Unavailable error naming image, registry, rate and minimum, the
// queued pull starts next, and once the registry recovers a retry fetches only what was
// missing: not the config nor the first layer, which containerd kept under podgate's lease,
// and the rest of the second layer (a Range request: its partial download was kept too).
func TestImagePullStall(t *testing.T) {
	n := startNode(t, "--config", stallConfig(t, stallMin))
	reg := registry.New(4 << 20)
	host := reg.Serve(t)
	ref, config, layers := pushTwoLayers(t, reg, "stall/img:v1", stallLayer)
	other := reg.Push(t, "stall-other", 1, 64<<10)[0]
	reg.Trickle(layers[1], trickleRate)
	reg.Reset()
	reg.Count(true)
	ctx, cancel := context.WithTimeout(t.Context(), stallTimeout)
	defer cancel()

	sandbox := func(name string) *runtimeapi.PodSandboxConfig {
		return &runtimeapi.PodSandboxConfig{Metadata: &runtimeapi.PodSandboxMetadata{Namespace: "e2e", Name: name, Uid: "uid-stall-" + name}}
	}
	type outcome struct {
		err error
		at  time.Time
	}
	pull := func(image, pod string) <-chan outcome {
		ch := make(chan outcome, 1)
		go func() {
			_, err := n.through.Images.PullImage(ctx, &runtimeapi.ImageSpec{Image: image}, nil, sandbox(pod))
			ch <- outcome{err, time.Now()}
		}()
		return ch
	}
	start := time.Now()
	a := pull(ref, "a")
	waitFor(ctx, t, "the trickling layer requested", func() bool { return reg.Stats().BlobGets["stall/img@"+layers[1]] == 1 })
	b := pull(ref, "b")
	waitFor(ctx, t, "pod b sharing pod a's pull", func() bool { return metricIs(ctx, n, "podgate_image_pull_deduplicated_total", 1) })
	c := pull(other, "c")
	waitFor(ctx, t, "the other image queued", func() bool { return metricIs(ctx, n, "podgate_image_pull_queue_length", 1) })

	rate := regexp.MustCompile(`stalled: (\d+) B/s from registry ` + regexp.QuoteMeta(host) + ` over the last 3s, below imagePulls.stall.minBytesPerSecond 8.0 KiB/s`)
	for pod, ch := range map[string]<-chan outcome{"a": a, "b": b} {
		o := <-ch
		took := o.at.Sub(start)
		st, _ := status.FromError(o.err)
		msg := st.Message()
		if st.Code() != codes.Unavailable || !strings.HasPrefix(msg, "pull of "+ref+" stalled: ") || !rate.MatchString(msg) {
			t.Errorf("pod %s: %v; want Unavailable naming %s, %s, the rate and 8.0 KiB/s", pod, o.err, ref, host)
		} else if m := rate.FindStringSubmatch(msg); len(m[1]) > 4 {
			t.Errorf("pod %s: rate %s B/s, want below the minimum", pod, m[1])
		}
		if took < stallWindow || took > stallWindow+stallMargin {
			t.Errorf("pod %s: stall reported %s after the pull started, want between %s and %s", pod, took.Round(time.Millisecond), stallWindow, stallWindow+stallMargin)
		}
		t.Logf("pod %s: %s after the start: %v", pod, took.Round(time.Millisecond), o.err)
	}
	if o := <-c; o.err != nil {
		t.Errorf("queued pull of %s: %v", other, o.err)
	}
	// The slot went to the queued pull: podgate started it right after the stall, before
	// anything else.
	log := n.podgate.Log.String()
	if got := harness.PullsStarted(log); !slices.Equal(got, []string{ref, other}) {
		t.Errorf("podgate started pulls %v, want %s then %s", got, ref, other)
	}
	stalledAt, startedAt := strings.Index(log, `"Image pull stalled; cancelling it"`), strings.Index(log, `"Image pull started" image="`+other+`"`)
	if stalledAt < 0 || startedAt < stalledAt {
		t.Errorf("log: the stall at %d, the queued pull's start at %d; want the stall logged, then the start", stalledAt, startedAt)
	}
	m, err := n.podgate.Scrape(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := m.Value("podgate_image_pull_stalls_total", "registry", "other"); v != 1 {
		t.Errorf("podgate_image_pull_stalls_total{registry=other} = %v, want 1", v)
	}
	first := blobRequests(reg.Requests())
	t.Logf("blobs asked before the stall: %v", first)

	// The registry recovers; the kubelet's retry fetches what was missing.
	reg.Trickle(layers[1], 0)
	reg.Reset()
	if o := <-pull(ref, "a"); o.err != nil {
		t.Fatalf("retry after the registry recovered: %v", o.err)
	}
	// The registry logs a request when its handler returns, which may be just after
	// containerd has read the whole blob.
	waitFor(ctx, t, "the retry's request of the unfinished layer logged", func() bool {
		return len(blobRequests(reg.Requests())[layers[1]]) > 0
	})
	retry := blobRequests(reg.Requests())
	t.Logf("blobs asked by the retry: %v", retry)
	for _, d := range []string{config, layers[0]} {
		if len(retry[d]) != 0 {
			t.Errorf("the retry fetched %s again (%q): containerd had it", d, retry[d])
		}
	}
	// containerd kept the partial download (podgate's lease held its ingest) and resumes it
	// where it stopped.
	if got := retry[layers[1]]; len(got) != 1 || !regexp.MustCompile(`^bytes=[1-9]\d*-$`).MatchString(got[0]) {
		t.Errorf("the retry asked for the unfinished layer with Range %q, want once, from where it stopped", got)
	}
}

// TestImagePullSlowButSteady: a registry that sends a 4 MiB layer at 320 KiB/s, above the
// 256 KiB/s minimum, for several windows is never cancelled: the pull completes. containerd
// shows the layer in 1 MiB steps, one every 3.2 s, so some windows of 3 s see no byte at all:
// podgate must count what containerd may hold unwritten.
func TestImagePullSlowButSteady(t *testing.T) {
	n := startNode(t, "--config", stallConfig(t, 256<<10))
	reg := registry.New(4 << 20)
	reg.Serve(t)
	ref, _, layers := pushTwoLayers(t, reg, "steady/img:v1", 4<<20)
	reg.Trickle(layers[1], 320<<10)
	reg.Reset()
	reg.Count(true)
	ctx, cancel := context.WithTimeout(t.Context(), stallTimeout)
	defer cancel()
	start := time.Now()
	if _, err := n.through.Images.PullImage(ctx, &runtimeapi.ImageSpec{Image: ref}, nil, nil); err != nil {
		t.Fatalf("slow but steady pull: %v", err)
	}
	if took := time.Since(start); took < 2*stallWindow {
		t.Errorf("the pull took %s: not the several windows the test is about", took)
	}
	m, err := n.podgate.Scrape(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := m.Value("podgate_image_pull_stalls_total", "registry", "other"); v != 0 {
		t.Errorf("podgate_image_pull_stalls_total = %v, want 0", v)
	}
}

// metricIs reports whether podgate's metric name (no labels) has value want.
func metricIs(ctx context.Context, n *node, name string, want float64) bool {
	m, err := n.podgate.Scrape(ctx)
	if err != nil {
		return false
	}
	v, _ := m.Value(name)
	return v == want
}
