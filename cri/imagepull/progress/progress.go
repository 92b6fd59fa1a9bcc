package progress

import (
	"context"
	"fmt"
	"sync"
	"time"

	contentapi "github.com/containerd/containerd/api/services/content/v1"
	leasesapi "github.com/containerd/containerd/api/services/leases/v1"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"k8s.io/klog/v2"
)

// DefaultNamespace is the containerd namespace of the CRI's images.
const DefaultNamespace = "k8s.io"

// Labels containerd puts on the blobs of a pull.
const (
	distributionSourceLabel = "containerd.io/distribution.source."
	configLabel             = "containerd.io/gc.ref.content.config"
)

// callTimeout bounds each call to containerd's content service: they read metadata and one
// small manifest, which containerd answers in milliseconds; a containerd that does not answer
// within it is asked again at the next poll.
const callTimeout = 5 * time.Second

// copyBuffer is the size of the pieces in which containerd writes a blob it fetches to its
// content store: its content.Copy reads a full 1 MiB buffer (io.ReadAtLeast) before each
// write (containerd v2 core/content/helpers.go, copyWithBuffer). A registry that sends less
// than that shows no bytes at all until the blob ends.
const copyBuffer = 1 << 20

// Running is a pull the runtime is busy with.
type Running struct {
	// Image is the normalised reference (docker.io/library/busybox:latest).
	Image string
	// Registry is the metric label of the image's registry.
	Registry string
	// Started is when the backend pull started.
	Started time.Time
}

// Progress is how far a pull has got.
type Progress struct {
	// Done and Total are the bytes of the image's config and layers in the content store, and
	// all of them; Total is 0 while the manifest is not known.
	Done, Total int64
	// Rate is bytes per second over the last few seconds.
	Rate float64
	// Blobs and BlobsDone count the config and layers, and those committed.
	Blobs, BlobsDone int
	// Unseen is what containerd may hold of the blobs it is fetching without having written
	// it to the content store yet: it writes a blob in pieces of copyBuffer bytes (or at its
	// end), so up to that much of each blob being fetched is not in Done.
	Unseen int64
	// Updated is when this was read.
	Updated time.Time
	// Stall is the pull against the tracker's StallRule (WithStall); zero without one, and once
	// every blob is fetched (the runtime unpacks: no more bytes are due).
	Stall Stall
}

// Known reports whether the pull's manifest, so its size, is known.
func (p Progress) Known() bool { return p.Total > 0 }

// Tracker follows the running pulls in containerd's content store; see the package
// documentation.
type Tracker struct {
	client    contentapi.ContentClient
	leases    leasesapi.LeasesClient
	conn      *grpc.ClientConn
	namespace string
	interval  time.Duration
	now       func() time.Time
	stall     StallRule

	bytes      *prometheus.CounterVec
	throughput *prometheus.GaugeVec

	mu    sync.Mutex
	pulls map[string]*pullState
	// manifests caches the blobs of the manifests read, by digest.
	manifests map[string][]blob
	// unavailable is the last error that stopped a poll, logged once until a poll works.
	unavailable string
}

type blob struct {
	digest string
	size   int64
}

// pullState is what the tracker knows of one running pull.
type pullState struct {
	started  time.Time
	registry string
	manifest string
	blobs    []blob
	progress Progress
	// counted is the bytes already added to podgate_image_pull_bytes_total.
	counted int64
	// samples are (time, done) of the last polls, for the rate.
	samples []sample
	// window holds the readings of the stall window (WithStall); stalled: Pulls.Stalled was
	// called.
	window  stallWindow
	stalled bool
}

type sample struct {
	at   time.Time
	done int64
}

// rateWindow is how far back the rate looks.
const rateWindow = 5 * time.Second

// Option configures a Tracker.
type Option func(*Tracker)

// WithNamespace sets the containerd namespace (default k8s.io).
func WithNamespace(ns string) Option { return func(t *Tracker) { t.namespace = ns } }

// WithInterval sets how often the tracker reads the content store while pulls run (default 1s).
func WithInterval(d time.Duration) Option { return func(t *Tracker) { t.interval = d } }

// WithRegisterer registers podgate_image_pull_bytes_total and
// podgate_image_pull_throughput_bytes_per_second with reg.
func WithRegisterer(reg prometheus.Registerer) Option {
	return func(t *Tracker) { reg.MustRegister(t.bytes, t.throughput) }
}

// WithStall measures each running pull against rule, from the first reading of its bytes (a
// poll after its backend call started) until every blob of its manifest is fetched, and tells
// Pulls.Stalled once of a pull that stalls, from the polling goroutine, without the tracker's
// lock. Progress then shows each pull's Stall. Without it, or with a rule that is off, no pull
// stalls.
func WithStall(rule StallRule) Option {
	return func(t *Tracker) { t.stall = rule }
}

// Pulls are the pulls a tracker follows (Run, Poll): the pull governor's. It is given to each
// poll, not to New, because the governor that runs the pulls is built with the tracker (it asks
// it to Keep what a cancelled pull fetched).
type Pulls interface {
	// Running lists the pulls the runtime is busy with.
	Running() []Running
	// Stalled is told, once, of a pull that stalled (WithStall).
	Stalled(ctx context.Context, r Running, p Progress)
}

// New creates a tracker of containerd's content store at the unix socket path. It does not
// connect until a pull runs.
func New(path string, opts ...Option) (*Tracker, error) {
	conn, err := grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("containerd %s: %w", path, err)
	}
	t := &Tracker{
		client: contentapi.NewContentClient(conn), leases: leasesapi.NewLeasesClient(conn), conn: conn,
		namespace: DefaultNamespace, interval: time.Second, now: time.Now,
		pulls: map[string]*pullState{}, manifests: map[string][]blob{},
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "podgate", Name: "image_pull_bytes_total",
			Help: "Bytes of images the runtime fetched for pulls podgate governs (from containerd's content store), by registry host for the hosts in imagePulls.perRegistry, \"other\" for the rest.",
		}, []string{"registry"}),
		throughput: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "podgate", Name: "image_pull_throughput_bytes_per_second",
			Help: "Bytes per second the runtime fetches for the running pulls, over the last 5 s, by registry as in podgate_image_pull_bytes_total.",
		}, []string{"registry"}),
	}
	for _, o := range opts {
		o(t)
	}
	return t, nil
}

// Close closes the connection to containerd.
func (t *Tracker) Close() error { return t.conn.Close() }

// Run polls the content store for pulls every interval while they run, until ctx ends.
func (t *Tracker) Run(ctx context.Context, pulls Pulls) {
	tick := time.NewTicker(t.interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			t.Poll(ctx, pulls)
		}
	}
}

// Progress returns what the tracker last read of the running pull of image.
func (t *Tracker) Progress(image string) (Progress, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	p, ok := t.pulls[image]
	if !ok {
		return Progress{}, false
	}
	return p.progress, true
}

// Poll reads the content store once for the running pulls.
func (t *Tracker) Poll(ctx context.Context, pulls Pulls) {
	running := pulls.Running()
	t.mu.Lock()
	t.forgetEnded(running)
	t.mu.Unlock()
	if len(running) == 0 {
		return
	}
	ctx = metadata.AppendToOutgoingContext(ctx, "containerd-namespace", t.namespace)
	err := t.poll(ctx, pulls, running)
	logger := klog.FromContext(ctx)
	t.mu.Lock()
	defer t.mu.Unlock()
	switch {
	case err == nil && t.unavailable != "":
		logger.Info("Reading image pull progress from containerd again")
		t.unavailable = ""
	case err != nil && ctx.Err() == nil && t.unavailable != err.Error():
		t.unavailable = err.Error()
		logger.Info("Cannot read image pull progress from containerd's content store; retrying", "err", err)
	}
}

// forgetEnded drops the pulls that no longer run and their throughput. t.mu is held.
func (t *Tracker) forgetEnded(running []Running) {
	live := map[string]bool{}
	for _, r := range running {
		live[r.Image] = true
	}
	rates := map[string]float64{}
	for image, p := range t.pulls {
		if !live[image] {
			delete(t.pulls, image)
			continue
		}
		rates[p.registry] += p.progress.Rate
	}
	for _, r := range running {
		if _, ok := rates[r.Registry]; !ok {
			rates[r.Registry] = 0
		}
	}
	t.throughput.Reset()
	for reg, v := range rates {
		t.throughput.WithLabelValues(reg).Set(v)
	}
	if len(t.pulls) == 0 {
		clear(t.manifests) // nothing runs: a later pull reads its manifests afresh
	}
}

func (t *Tracker) poll(ctx context.Context, pulls Pulls, running []Running) error {
	statuses, err := t.activeIngests(ctx)
	if err != nil {
		return err
	}
	now := t.now()
	for _, r := range running {
		t.mu.Lock()
		p := t.pulls[r.Image]
		if p == nil || !p.started.Equal(r.Started) {
			p = &pullState{started: r.Started, registry: r.Registry}
			t.pulls[r.Image] = p
		}
		t.mu.Unlock()
		if p.manifest == "" {
			if err := t.findManifest(ctx, r, p); err != nil {
				return err
			}
		}
		if p.manifest == "" {
			continue
		}
		prog, err := t.measure(ctx, p.blobs, statuses)
		if err != nil {
			return err
		}
		if prog = t.record(p, prog, now); prog.Stall.Stalled && t.claimStall(p) {
			pulls.Stalled(ctx, r, prog)
		}
	}
	return nil
}

// claimStall reports whether p's stall is yet to be told, and marks it told.
func (t *Tracker) claimStall(p *pullState) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	first := !p.stalled
	p.stalled = true
	return first
}

// record stores a pull's new progress, its rate, where it stands against the stall rule and
// its bytes in the metrics, and returns it.
func (t *Tracker) record(p *pullState, prog Progress, now time.Time) Progress {
	t.mu.Lock()
	defer t.mu.Unlock()
	prog.Updated = now
	if len(p.samples) == 0 {
		// What was there before the first look (layers shared with other images, or fetched
		// between the start and the first poll) is not counted as this pull's traffic unless
		// it was being written.
		p.counted = prog.Done
	}
	p.samples = append(p.samples, sample{at: now, done: prog.Done})
	for len(p.samples) > 1 && now.Sub(p.samples[0].at) > rateWindow {
		p.samples = p.samples[1:]
	}
	if first := p.samples[0]; now.After(first.at) && prog.Done >= first.done {
		prog.Rate = float64(prog.Done-first.done) / now.Sub(first.at).Seconds()
	}
	if prog.Done > p.counted {
		t.bytes.WithLabelValues(p.registry).Add(float64(prog.Done - p.counted))
		p.counted = prog.Done
	}
	if prog.Blobs > 0 && prog.BlobsDone == prog.Blobs {
		// Fetched: the runtime unpacks, which reads no bytes from the registry.
		p.window.complete = true
	}
	if t.stall.On() && !p.window.complete {
		p.window.add(now, prog.Done, t.stall.Window)
	}
	prog.Stall = p.window.judge(t.stall, prog.Unseen)
	p.progress = prog
	return prog
}
