package registry

import (
	"context"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"k8s.io/apimachinery/pkg/util/wait"
)

func TestMaxAtOnceAndFirstRequests(t *testing.T) {
	t0 := time.Date(2026, 11, 25, 2, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	log := []Request{
		{Repo: "a", Start: at(0), End: at(10)},
		{Repo: "a", Start: at(5), End: at(30)}, // a second request of a, overlapping: still one image
		{Repo: "b", Start: at(20), End: at(40)},
		{Repo: "c", Start: at(30), End: at(50)}, // starts as a's last ends: a and c never overlap
		{Repo: "d", Start: at(45), End: at(60)},
	}
	if got := MaxAtOnce(log, ByRepo); got != 2 {
		t.Errorf("MaxAtOnce = %d, want 2 (a+b, b+c, c+d)", got)
	}
	if got := MaxAtOnce(nil, ByRepo); got != 0 {
		t.Errorf("MaxAtOnce of nothing = %d", got)
	}
	// The log is in the order requests ended; the first requests are by start.
	shuffled := []Request{log[4], log[2], log[0], log[3], log[1]}
	if got := FirstRequests(shuffled); !slices.Equal(got, []string{"a", "b", "c", "d"}) {
		t.Errorf("FirstRequests = %v, want [a b c d]", got)
	}
}

// TestRequestLog pulls an image from a served registry and finds the pull in the request log,
// the blob bytes counted, and nothing of the pushes, before counting started or during it.
func TestRequestLog(t *testing.T) {
	const size = 64 << 10
	reg := New(16 << 20)
	reg.Serve(t)
	reg.Push(t, "before", 1, size)
	if got := reg.Requests(); len(got) != 0 {
		t.Fatalf("requests logged while not counting: %+v", got)
	}
	reg.Count(true)
	ref := reg.Push(t, "log", 1, size)[0]
	if got := reg.Requests(); len(got) != 0 {
		t.Fatalf("a push logged while counting: %+v", got)
	}
	rc, err := firstLayer(t, ref).Compressed()
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4096)
	for {
		if _, err := rc.Read(buf); err != nil {
			break
		}
	}
	rc.Close()
	log := reg.Requests()
	var manifests, blobs int
	var bytes int64
	for _, q := range log {
		if q.Repo != "log/img0" || q.End.Before(q.Start) {
			t.Errorf("request %+v: want repository log/img0, ending after it started", q)
		}
		switch q.Kind {
		case "manifests":
			manifests++
		case "blobs":
			blobs++
			bytes += q.Bytes
		}
	}
	if manifests == 0 || blobs != 1 {
		t.Errorf("log %+v: want the manifest and the layer's blob", log)
	}
	if s := reg.Stats(); bytes != s.Bytes || bytes < size {
		t.Errorf("log counts %d blob bytes, stats %d; want the layer's (≥ %d)", bytes, s.Bytes, size)
	}
	reg.Reset()
	if got := reg.Requests(); len(got) != 0 {
		t.Errorf("requests after Reset: %+v", got)
	}
}

// TestHold: a held download is in flight and sends nothing until Release, then completes. Its
// response headers come at once, so that a puller's wait for them (containerd's 30 s) never
// runs out while the test holds it.
func TestHold(t *testing.T) {
	reg := New(64 << 20)
	host := reg.Serve(t)
	reg.Count(true)
	layer := firstLayer(t, reg.Push(t, "held", 1, 4096)[0])
	digest, err := layer.Digest()
	if err != nil {
		t.Fatal(err)
	}
	reg.Hold()
	done := make(chan error, 1)
	go func() {
		rc, err := layer.Compressed()
		if err == nil {
			_, err = io.Copy(io.Discard, rc)
			rc.Close()
		}
		done <- err
	}()
	err = wait.PollUntilContextTimeout(t.Context(), 5*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		return reg.Stats().Active["held/img0"] == 1, nil
	})
	if err != nil {
		t.Fatalf("the download never reached the registry: %v", err)
	}
	// A second download of the blob, held too, gets its headers while held.
	client := &http.Client{Transport: &http.Transport{ResponseHeaderTimeout: time.Minute}}
	resp, err := client.Get("http://" + host + "/v2/held/img0/blobs/" + digest.String())
	if err != nil {
		t.Fatalf("a held download's headers: %v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("a held download's status: %s", resp.Status)
	}
	select {
	case err := <-done:
		t.Fatalf("the download ended while held: %v", err)
	default:
	}
	if s := reg.Stats(); s.Bytes != 0 {
		t.Errorf("%d bytes served while held", s.Bytes)
	}
	reg.Release()
	if err := <-done; err != nil {
		t.Fatalf("download after Release: %v", err)
	}
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("the second download after Release: %v", err)
	}
	resp.Body.Close()
	if size, _ := layer.Size(); int64(len(body)) != size {
		t.Errorf("the second download after Release: %d bytes, want the layer's %d", len(body), size)
	}
	if s := reg.Stats(); s.Bytes < 4096 || s.Active["held/img0"] != 0 {
		t.Errorf("after Release: %d bytes served, %d requests active; want the layer, none", s.Bytes, s.Active["held/img0"])
	}
}

// firstLayer reads the manifest of the image ref and returns its first layer, not yet fetched.
func firstLayer(t *testing.T, ref string) v1.Layer {
	t.Helper()
	r, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	img, err := remote.Image(r)
	if err != nil {
		t.Fatal(err)
	}
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	return layers[0]
}

// TestPause: a paused download stops part-way, in flight, and completes after Resume.
func TestPause(t *testing.T) {
	const size = 512 << 10
	reg := New(64 << 20)
	reg.Serve(t)
	reg.Count(true)
	layer := firstLayer(t, reg.Push(t, "paused", 1, size)[0])
	reg.Pause()
	var got atomic.Int64
	done := make(chan error, 1)
	go func() {
		rc, err := layer.Compressed()
		if err == nil {
			_, err = io.Copy(writerFunc(func(b []byte) (int, error) { got.Add(int64(len(b))); return len(b), nil }), rc)
			rc.Close()
		}
		done <- err
	}()
	err := wait.PollUntilContextTimeout(t.Context(), 5*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		return got.Load() > 0, nil
	})
	if err != nil {
		t.Fatalf("no byte of the paused download arrived: %v", err)
	}
	select {
	case err := <-done:
		t.Fatalf("the download ended while paused (%d bytes): %v", got.Load(), err)
	default:
	}
	if n := got.Load(); n >= size {
		t.Errorf("%d bytes arrived while paused, want part of %d", n, size)
	}
	reg.Resume()
	if err := <-done; err != nil {
		t.Fatalf("download after Resume: %v", err)
	}
	if n := got.Load(); n < size {
		t.Errorf("after Resume: %d bytes, want the layer's %d at least", n, size)
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(b []byte) (int, error) { return f(b) }

// TestTrickleAndRange: a trickled blob arrives at its own rate, in small flushed chunks, while
// the registry's bandwidth still serves the rest; Trickle(digest, 0) gives it back; a ranged
// request gets the rest of the blob and the log keeps its Range header.
func TestTrickleAndRange(t *testing.T) {
	const size = 64 << 10
	reg := New(64 << 20)
	reg.Serve(t)
	reg.Count(true)
	layer := firstLayer(t, reg.Push(t, "trickle", 1, size)[0])
	digest, err := layer.Digest()
	if err != nil {
		t.Fatal(err)
	}
	reg.Trickle(digest.String(), 1000)
	var got atomic.Int64
	rc, err := layer.Compressed()
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := io.Copy(writerFunc(func(b []byte) (int, error) { got.Add(int64(len(b))); return len(b), nil }), rc)
		done <- err
	}()
	// A trickle is chunks of a tenth of a second's worth: bytes arrive, and far fewer than
	// the blob for a long time.
	start := time.Now()
	err = wait.PollUntilContextTimeout(t.Context(), 5*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		return got.Load() >= 300, nil
	})
	if err != nil {
		t.Fatalf("no trickle arrived: %v", err)
	}
	if took, n := time.Since(start), got.Load(); took < 150*time.Millisecond || n > 2000 {
		t.Errorf("%d bytes in %s at 1000 B/s", n, took)
	}
	reg.Trickle(digest.String(), 0)
	if err := <-done; err != nil {
		t.Fatalf("download after the trickle ended: %v", err)
	}
	rc.Close()
	if n := got.Load(); n < size {
		t.Errorf("%d bytes, want the layer's %d", n, size)
	}

	// The rest of the blob from byte 1000, as a resuming puller asks.
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, "http://"+reg.Host+"/v2/trickle/img0/blobs/"+digest.String(), nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Range", "bytes=1000-")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusPartialContent || len(body) != int(got.Load())-1000 {
		t.Errorf("ranged GET: %s, %d bytes, %v; want 206 and %d bytes", resp.Status, len(body), err, got.Load()-1000)
	}
	// A request is logged when its handler returns, which may be just after the client has
	// read the whole body.
	var ranges []string
	err = wait.PollUntilContextTimeout(t.Context(), 5*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		ranges = nil
		for _, q := range reg.Requests() {
			if q.Kind == "blobs" {
				ranges = append(ranges, q.Range)
			}
		}
		return len(ranges) >= 2, nil
	})
	if err != nil || !slices.Equal(ranges, []string{"", "bytes=1000-"}) {
		t.Errorf("blob requests' Range headers %q, want the whole blob then bytes=1000-", ranges)
	}
}

// TestBasicAuth: a private repository is pulled with its credentials, refused (401, counted)
// without them or with others; a public one needs none.
func TestBasicAuth(t *testing.T) {
	r := New(0, WithBasicAuth("private/", "alice", "s3cret"))
	r.Serve(t)
	priv := r.Push(t, "private", 1, 1<<10)[0]
	pub := r.Push(t, "public", 1, 1<<10)[0]
	get := func(ref string, opts ...remote.Option) error {
		t.Helper()
		n, err := name.ParseReference(ref)
		if err != nil {
			t.Fatal(err)
		}
		_, err = remote.Image(n, append(opts, remote.WithContext(t.Context()))...)
		return err
	}
	if err := get(priv, remote.WithAuth(&authn.Basic{Username: "alice", Password: "s3cret"})); err != nil {
		t.Errorf("private image with its credentials: %v", err)
	}
	if err := get(priv); err == nil {
		t.Error("private image without credentials: served")
	}
	if err := get(priv, remote.WithAuth(&authn.Basic{Username: "alice", Password: "other"})); err == nil {
		t.Error("private image with other credentials: served")
	}
	if n := r.Unauthorized(); n < 2 {
		t.Errorf("Unauthorized() = %d, want the two refused pulls counted", n)
	}
	if err := get(pub); err != nil {
		t.Errorf("public image without credentials: %v", err)
	}
}

// TestRefuse: while refusing, a GET of a manifest gets 429 with the distribution spec's
// TOOMANYREQUESTS error and the Retry-After header, a HEAD the status alone; both are in the
// request log as refused; after Allow the same requests are served.
func TestRefuse(t *testing.T) {
	reg := New(16 << 20)
	host := reg.Serve(t)
	reg.Push(t, "refuse", 1, 1024)
	reg.Count(true)
	url := "http://" + host + "/v2/refuse/img0/manifests/v1"
	// do returns the answer's status, its Retry-After header and its body.
	do := func(method string) (int, string, string) {
		t.Helper()
		req, err := http.NewRequestWithContext(t.Context(), method, url, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Accept", string(types.DockerManifestSchema2))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, resp.Header.Get("Retry-After"), string(body)
	}
	reg.Refuse(http.StatusTooManyRequests, "7")
	code, retryAfter, body := do(http.MethodGet)
	if code != http.StatusTooManyRequests || retryAfter != "7" ||
		!strings.Contains(body, `"code":"TOOMANYREQUESTS"`) || !strings.Contains(body, "retry-after: 7s") {
		t.Errorf("GET while refusing: %d, Retry-After %q, body %s", code, retryAfter, body)
	}
	if code, _, body := do(http.MethodHead); code != http.StatusTooManyRequests || body != "" {
		t.Errorf("HEAD while refusing: %d, body %q", code, body)
	}
	if got := RefusedByRepo(reg.Requests()); got["refuse/img0"] != 2 {
		t.Errorf("refused requests by repository %v, want 2 of refuse/img0", got)
	}
	reg.Allow()
	if code, _, _ := do(http.MethodGet); code != http.StatusOK {
		t.Errorf("GET after Allow: %d", code)
	}
	log := reg.Requests()
	if last := log[len(log)-1]; last.Refused != 0 || last.Method != http.MethodGet {
		t.Errorf("the served GET logged as %+v", last)
	}
}
