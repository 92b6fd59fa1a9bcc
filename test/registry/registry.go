// Package registry is a real OCI registry for pull tests and the demo (go-containerregistry's,
// in process, on 127.0.0.1) that throttles every blob download to a fixed bandwidth and counts,
// per image, the requests it serves: how many images it served at once, how often each blob was
// fetched, in which order images were first asked for. It also keeps a request log, each
// request with when it started and ended, for checks made after the fact. It can refuse
// requests as a rate-limited registry does (Refuse: 429 Too Many Requests, or 503).
package registry

import (
	"cmp"
	"fmt"
	"io"
	"log"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	ggcr "github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
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
	srv       *http.Server
	// auth, when set, makes some repositories private (WithBasicAuth).
	auth         *basicAuth
	unauthorized atomic.Int64

	mu    sync.Mutex
	stats Stats
	log   []Request
	// held, while not nil, holds blob downloads until it is closed (Hold, Release).
	held chan struct{}
	// paused, while not nil, stops blob downloads under way after their current chunk until
	// it is closed (Pause, Resume).
	paused chan struct{}
	// trickle holds the blobs served at a rate of their own, by digest (Trickle).
	trickle map[string]int
	// refusing, while not nil, refuses every counted request (Refuse, Allow).
	refusing *refusal
}

// Request is one entry of the request log: a GET or HEAD of a manifest or a blob.
type Request struct {
	// Start and End are when the registry began and finished serving it.
	Start, End time.Time
	// Method is GET or HEAD.
	Method string
	// Repo is the repository (prefix/imgN).
	Repo string
	// Kind is "manifests" or "blobs".
	Kind string
	// Ref is the tag or digest asked for.
	Ref string
	// Bytes is the number of blob bytes sent.
	Bytes int64
	// Range is the request's Range header ("bytes=1024-"), "" when it asked for the whole
	// blob: a puller resuming a download it had begun asks for the rest only.
	Range string
	// Refused is the HTTP status the registry refused the request with (Refuse), 0 when it
	// served it.
	Refused int
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

// Option configures a Registry.
type Option func(*Registry)

// WithBasicAuth makes the repositories whose names start with prefix ("private/") private:
// their manifests and blobs are served only to requests with HTTP basic credentials user and
// password, others get 401 with a Basic challenge (counted: Unauthorized), as a registry with
// a password does. Pushes of this package are let through. Without it every repository is
// public.
func WithBasicAuth(prefix, user, password string) Option {
	return func(r *Registry) { r.auth = &basicAuth{prefix: prefix, user: user, password: password} }
}

// basicAuth is the credentials of the private repositories.
type basicAuth struct{ prefix, user, password string }

// New returns a registry whose blob downloads each get bandwidth bytes per second.
func New(bandwidth int, opts ...Option) *Registry {
	r := &Registry{handler: ggcr.New(ggcr.Logger(log.New(io.Discard, "", 0))), bandwidth: bandwidth}
	for _, o := range opts {
		o(r)
	}
	r.Reset()
	return r
}

// Unauthorized is the number of requests for a private repository refused for want of the
// right credentials (WithBasicAuth), counted or not.
func (r *Registry) Unauthorized() int64 { return r.unauthorized.Load() }

// authorized tells whether req may read repo, answering 401 when not.
func (r *Registry) authorized(w http.ResponseWriter, req *http.Request, repo string) bool {
	a := r.auth
	if a == nil || !strings.HasPrefix(repo, a.prefix) || req.Header.Get(pushHeader) != "" {
		return true
	}
	if u, p, ok := req.BasicAuth(); ok && u == a.user && p == a.password {
		return true
	}
	r.unauthorized.Add(1)
	w.Header().Set("WWW-Authenticate", `Basic realm="podgate-test"`)
	http.Error(w, "unauthorized", http.StatusUnauthorized)
	return false
}

// Serve serves the registry on 127.0.0.1 until the test ends and returns its host:port.
func (r *Registry) Serve(tb testing.TB) string {
	tb.Helper()
	host, err := r.Listen()
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = r.Close() })
	return host
}

// Listen serves the registry on a free port of 127.0.0.1 until Close, and returns its
// host:port (also in Host).
func (r *Registry) Listen() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("registry: %w", err)
	}
	r.srv = &http.Server{Handler: r, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = r.srv.Serve(l) }() // ErrServerClosed after Close
	r.Host = l.Addr().String()
	return r.Host, nil
}

// Close stops serving: open downloads are cut.
func (r *Registry) Close() error {
	if r.srv == nil {
		return nil
	}
	return r.srv.Close()
}

// Push pushes n random one-layer images of layerSize bytes as <Host>/<prefix>/imgI:v1 and
// returns their references. Pushing is not counted.
func (r *Registry) Push(tb testing.TB, prefix string, n, layerSize int) []string {
	tb.Helper()
	refs, err := r.PushRandom(prefix, n, layerSize)
	if err != nil {
		tb.Fatal(err)
	}
	return refs
}

// PushRandom is Push for programs: it returns the error instead of failing a test.
func (r *Registry) PushRandom(prefix string, n, layerSize int) ([]string, error) {
	var refs []string
	for i := range n {
		img, err := random.Image(int64(layerSize), 1)
		if err != nil {
			return nil, err
		}
		ref, err := r.PushImage(fmt.Sprintf("%s/img%d:v1", prefix, i), img)
		if err != nil {
			return nil, err
		}
		refs = append(refs, ref)
	}
	return refs, nil
}

// pushHeader marks the requests of this package's own pushes, which the registry neither counts
// nor logs, even while counting: a push may happen while pulls are being counted.
const pushHeader = "X-Podgate-Test-Push"

// pushTransport adds pushHeader to every request.
type pushTransport struct{ base http.RoundTripper }

func (t pushTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	req = req.Clone(req.Context())
	req.Header.Set(pushHeader, "1")
	return t.base.RoundTrip(req)
}

// PushImage pushes img as <Host>/<repoTag> and returns that reference. Pushing is not counted.
func (r *Registry) PushImage(repoTag string, img v1.Image) (string, error) {
	ref, err := name.ParseReference(r.Host + "/" + repoTag)
	if err != nil {
		return "", err
	}
	if err := remote.Write(ref, img, remote.WithTransport(pushTransport{http.DefaultTransport})); err != nil {
		return "", fmt.Errorf("push %s: %w", ref, err)
	}
	return ref.String(), nil
}

// Count turns counting on or off.
func (r *Registry) Count(on bool) { r.counting.Store(on) }

// Reset forgets what was counted, request log included.
func (r *Registry) Reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stats = Stats{Active: map[string]int{}, BlobGets: map[string]int{}}
	r.log = nil
}

// Requests returns the request log: every GET and HEAD of a manifest or blob served while
// counting, in the order they ended.
func (r *Registry) Requests() []Request {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.log)
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
	if m != nil && !r.authorized(w, req, m[1]) {
		return
	}
	if m == nil || !r.counting.Load() || req.Header.Get(pushHeader) != "" || (req.Method != http.MethodGet && req.Method != http.MethodHead) {
		r.handler.ServeHTTP(w, req)
		return
	}
	repo, blobGet := m[1], m[2] == "blobs" && req.Method == http.MethodGet
	entry := Request{Start: time.Now(), Method: req.Method, Repo: repo, Kind: m[2], Ref: m[3], Range: req.Header.Get("Range")}
	if r.refuseIfRefusing(w, req, entry) {
		return
	}
	r.begin(repo, blobGet, m[3])
	var pw *pacedWriter
	defer func() {
		r.end(repo, entry)
		if pw != nil {
			pw.finish() // the blob's last byte, once its request is in the log
		}
	}()
	if !blobGet {
		r.handler.ServeHTTP(w, req)
		return
	}
	digest := m[3]
	if err := r.closeRange(req); err != nil {
		http.Error(w, err.Error(), http.StatusRequestedRangeNotSatisfiable)
		return
	}
	pw = &pacedWriter{ResponseWriter: w, rate: func() int { return r.rateOf(digest) }, due: time.Now(), hold: r.holding(), pause: r.pausing, done: req.Context().Done()}
	r.handler.ServeHTTP(pw, req)
	entry.Bytes = pw.written
	r.mu.Lock()
	r.stats.Bytes += pw.written
	r.mu.Unlock()
}

// openRange is a Range header without an end, what a puller resuming a download sends
// (containerd's fetcher asks "bytes=<offset>-").
var openRange = regexp.MustCompile(`^bytes=(\d+)-$`)

// closeRange gives an open-ended Range header of req its end, the blob's last byte: the
// registry underneath (go-containerregistry's) understands only "bytes=start-end", which real
// registries do not require.
func (r *Registry) closeRange(req *http.Request) error {
	m := openRange.FindStringSubmatch(req.Header.Get("Range"))
	if m == nil {
		return nil
	}
	head := httptest.NewRecorder()
	r.handler.ServeHTTP(head, httptest.NewRequestWithContext(req.Context(), http.MethodHead, req.URL.Path, nil))
	size, err := strconv.ParseInt(head.Header().Get("Content-Length"), 10, 64)
	if err != nil || head.Code != http.StatusOK {
		return fmt.Errorf("range %s: size of %s unknown (%d)", m[0], req.URL.Path, head.Code)
	}
	req.Header.Set("Range", fmt.Sprintf("bytes=%s-%d", m[1], size-1))
	return nil
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

func (r *Registry) end(repo string, entry Request) {
	entry.End = time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stats.Active[repo]--
	r.log = append(r.log, entry)
}

// MaxAtOnce is the largest number of distinct groups (as group names them, e.g. by repository)
// with a request in flight at one moment of the log. Of a request that ends when another starts,
// the end counts first.
func MaxAtOnce(log []Request, group func(Request) string) int {
	type edge struct {
		at    time.Time
		delta int
		key   string
	}
	var edges []edge
	for _, q := range log {
		edges = append(edges, edge{q.Start, 1, group(q)}, edge{q.End, -1, group(q)})
	}
	slices.SortFunc(edges, func(a, b edge) int {
		return cmp.Or(a.at.Compare(b.at), cmp.Compare(a.delta, b.delta))
	})
	active, most := map[string]int{}, 0
	for _, e := range edges {
		active[e.key] += e.delta
		if active[e.key] == 0 {
			delete(active, e.key)
		}
		most = max(most, len(active))
	}
	return most
}

// ByRepo groups requests by repository, for MaxAtOnce.
func ByRepo(q Request) string { return q.Repo }

// FirstRequests returns the repositories of the log in the order of their first request.
func FirstRequests(log []Request) []string {
	sorted := slices.Clone(log)
	slices.SortStableFunc(sorted, func(a, b Request) int { return a.Start.Compare(b.Start) })
	var out []string
	for _, q := range sorted {
		if !slices.Contains(out, q.Repo) {
			out = append(out, q.Repo)
		}
	}
	return out
}
