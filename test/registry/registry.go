// Package registry is a real OCI registry for pull tests (go-containerregistry's, in process,
// on 127.0.0.1) that throttles every blob download to a fixed bandwidth and counts, per image,
// the requests it serves: how many images it served at once, how often each blob was fetched,
// in which order images were first asked for.
package registry

import (
	"fmt"
	"io"
	"log"
	"maps"
	"net"
	"net/http"
	"regexp"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	ggcr "github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

var repoPath = regexp.MustCompile(`^/v2/(.+)/(manifests|blobs)/([^/]+)$`)

// Registry is the counting, throttled registry. It counts only while Count(true).
type Registry struct {
	// Host is host:port, once Serve has run.
	Host string

	handler   http.Handler
	bandwidth int
	counting  atomic.Bool

	mu    sync.Mutex
	stats Stats
}

// Stats is what the registry counted since the last Reset.
type Stats struct {
	// Active is the number of requests being served, per repository.
	Active map[string]int
	// MaxImages is the most repositories served at once.
	MaxImages int
	// BlobGets is the number of GETs per repository@digest.
	BlobGets map[string]int
	// Started holds the repositories in the order of their first request.
	Started []string
	// Bytes is the number of blob bytes served.
	Bytes int64
}

// ActiveImages is the number of repositories being served.
func (s Stats) ActiveImages() int {
	n := 0
	for _, a := range s.Active {
		if a > 0 {
			n++
		}
	}
	return n
}

// New returns a registry whose blob downloads each get bandwidth bytes per second.
func New(bandwidth int) *Registry {
	r := &Registry{handler: ggcr.New(ggcr.Logger(log.New(io.Discard, "", 0))), bandwidth: bandwidth}
	r.Reset()
	return r
}

// Serve serves the registry on 127.0.0.1 until the test ends and returns its host:port.
func (r *Registry) Serve(tb testing.TB) string {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	srv := &http.Server{Handler: r, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(l) }() // ErrServerClosed after Close below
	tb.Cleanup(func() { _ = srv.Close() })
	r.Host = l.Addr().String()
	return r.Host
}

// Push pushes n random one-layer images of layerSize bytes as <Host>/<prefix>/imgI:v1 and
// returns their references. Pushing is not counted.
func (r *Registry) Push(tb testing.TB, prefix string, n, layerSize int) []string {
	tb.Helper()
	var refs []string
	for i := range n {
		img, err := random.Image(int64(layerSize), 1)
		if err != nil {
			tb.Fatal(err)
		}
		ref, err := name.ParseReference(fmt.Sprintf("%s/%s/img%d:v1", r.Host, prefix, i))
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

// Count turns counting on or off.
func (r *Registry) Count(on bool) { r.counting.Store(on) }

// Reset forgets what was counted.
func (r *Registry) Reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stats = Stats{Active: map[string]int{}, BlobGets: map[string]int{}}
}

// Stats returns a copy of what was counted.
func (r *Registry) Stats() Stats {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.stats
	s.Active, s.BlobGets, s.Started = maps.Clone(s.Active), maps.Clone(s.BlobGets), slices.Clone(s.Started)
	return s
}

func (r *Registry) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	m := repoPath.FindStringSubmatch(req.URL.Path)
	if m == nil || !r.counting.Load() || (req.Method != http.MethodGet && req.Method != http.MethodHead) {
		r.handler.ServeHTTP(w, req)
		return
	}
	repo, blobGet := m[1], m[2] == "blobs" && req.Method == http.MethodGet
	r.begin(repo, blobGet, m[3])
	defer r.end(repo)
	if !blobGet {
		r.handler.ServeHTTP(w, req)
		return
	}
	pw := &pacedWriter{ResponseWriter: w, bps: r.bandwidth, start: time.Now()}
	r.handler.ServeHTTP(pw, req)
	r.mu.Lock()
	r.stats.Bytes += pw.written
	r.mu.Unlock()
}

func (r *Registry) begin(repo string, blobGet bool, digest string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !slices.Contains(r.stats.Started, repo) {
		r.stats.Started = append(r.stats.Started, repo)
	}
	if blobGet {
		r.stats.BlobGets[repo+"@"+digest]++
	}
	r.stats.Active[repo]++
	r.stats.MaxImages = max(r.stats.MaxImages, r.stats.ActiveImages())
}

func (r *Registry) end(repo string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stats.Active[repo]--
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
