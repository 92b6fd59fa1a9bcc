package progress

import (
	"context"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	contentapi "github.com/containerd/containerd/api/services/content/v1"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/podgate/podgate/test/testfs"
)

// fakeContent is containerd's content service as the tracker uses it: committed blobs with
// their labels and data, and the ingests in progress. Every call must name namespace k8s.io.
type fakeContent struct {
	contentapi.UnimplementedContentServer
	mu       sync.Mutex
	infos    map[string]*contentapi.Info
	data     map[string][]byte
	statuses []*contentapi.Status
	filters  []string
	badNS    int
}

func (f *fakeContent) checkNS(ctx context.Context) {
	md, _ := metadata.FromIncomingContext(ctx)
	if v := md.Get("containerd-namespace"); len(v) != 1 || v[0] != "k8s.io" {
		f.badNS++
	}
}

func (f *fakeContent) Info(ctx context.Context, req *contentapi.InfoRequest) (*contentapi.InfoResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.checkNS(ctx)
	info, ok := f.infos[req.GetDigest()]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "content digest %s: not found", req.GetDigest())
	}
	return &contentapi.InfoResponse{Info: info}, nil
}

// List applies the tracker's filter as containerd would for it: every label named must be
// present.
func (f *fakeContent) List(req *contentapi.ListContentRequest, stream contentapi.Content_ListServer) error {
	f.mu.Lock()
	f.checkNS(stream.Context())
	f.filters = append(f.filters, req.GetFilters()...)
	var want []string
	for _, flt := range req.GetFilters() {
		for _, part := range strings.Split(flt, ",") {
			want = append(want, strings.Trim(strings.TrimPrefix(part, "labels."), `"`))
		}
	}
	var out []*contentapi.Info
	for _, info := range f.infos {
		ok := true
		for _, k := range want {
			if _, has := info.GetLabels()[k]; !has {
				ok = false
			}
		}
		if ok {
			out = append(out, info)
		}
	}
	f.mu.Unlock()
	return stream.Send(&contentapi.ListContentResponse{Info: out})
}

func (f *fakeContent) Read(req *contentapi.ReadContentRequest, stream contentapi.Content_ReadServer) error {
	f.mu.Lock()
	f.checkNS(stream.Context())
	data, ok := f.data[req.GetDigest()]
	f.mu.Unlock()
	if !ok {
		return status.Errorf(codes.NotFound, "content digest %s: not found", req.GetDigest())
	}
	// Two chunks, as containerd sends large blobs in pieces.
	half := len(data) / 2
	if err := stream.Send(&contentapi.ReadContentResponse{Data: data[:half]}); err != nil {
		return err
	}
	return stream.Send(&contentapi.ReadContentResponse{Offset: int64(half), Data: data[half:]})
}

func (f *fakeContent) ListStatuses(ctx context.Context, _ *contentapi.ListStatusesRequest) (*contentapi.ListStatusesResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.checkNS(ctx)
	return &contentapi.ListStatusesResponse{Statuses: f.statuses}, nil
}

func (f *fakeContent) commit(digest string, size int64, labels map[string]string, at time.Time, data []byte) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.infos[digest] = &contentapi.Info{Digest: digest, Size: size, Labels: labels,
		CreatedAt: timestamppb.New(at), UpdatedAt: timestamppb.New(at)}
	if data != nil {
		f.data[digest] = data
	}
	var left []*contentapi.Status
	for _, s := range f.statuses {
		if s.GetExpected() != digest {
			left = append(left, s)
		}
	}
	f.statuses = left
}

func (f *fakeContent) ingest(digest string, offset, total int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, s := range f.statuses {
		if s.GetExpected() == digest {
			s.Offset = offset
			return
		}
	}
	f.statuses = append(f.statuses, &contentapi.Status{Ref: "layer-" + digest, Offset: offset, Total: total, Expected: digest})
}

func serveContent(t *testing.T, f *fakeContent) string {
	t.Helper()
	path := filepath.Join(testfs.ShortDir(t), "containerd.sock")
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	contentapi.RegisterContentServer(s, f)
	served := make(chan error, 1)
	go func() { served <- s.Serve(l) }()
	t.Cleanup(func() {
		s.Stop()
		if err := <-served; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return path
}

const (
	manifestDigest = "sha256:1111111111111111111111111111111111111111111111111111111111111111"
	oldManifest    = "sha256:2222222222222222222222222222222222222222222222222222222222222222"
	otherRepo      = "sha256:3333333333333333333333333333333333333333333333333333333333333333"
	configDigest   = "sha256:cccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccc"
	layer1         = "sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
	layer2         = "sha256:bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
)

func manifest(config string, layers ...string) []byte {
	s := `{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"digest":"` + config + `","size":100},"layers":[`
	sizes := []string{"1000", "500"}
	for i, l := range layers {
		if i > 0 {
			s += ","
		}
		s += `{"digest":"` + l + `","size":` + sizes[i] + `}`
	}
	return []byte(s + "]}")
}

// TestTrackerFollowsAPull: the tracker finds the pull's manifest (the one of its repository
// touched since the pull started, not an older one nor another repository's), and adds up its
// blobs as containerd writes them: committed blobs whole, ingests by their offset, blobs not
// started not at all; the rate and podgate_image_pull_bytes_total follow, and a pull that
// ends is forgotten.
func TestTrackerFollowsAPull(t *testing.T) {
	start := time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)
	f := &fakeContent{infos: map[string]*contentapi.Info{}, data: map[string][]byte{}}
	src := map[string]string{distributionSourceLabel + "127.0.0.1": "team/app", configLabel: configDigest}
	// A manifest of the same repository from an earlier pull, and one of another repository.
	f.commit(oldManifest, 300, src, start.Add(-time.Hour), manifest(configDigest, layer2))
	f.commit(otherRepo, 300, map[string]string{distributionSourceLabel + "127.0.0.1": "team/other", configLabel: configDigest},
		start.Add(time.Second), manifest(configDigest, layer2))
	path := serveContent(t, f)

	var mu sync.Mutex
	running := []Running{{Image: "127.0.0.1:5000/team/app:v1", Registry: "other", Started: start}}
	clock := start
	reg := prometheus.NewRegistry()
	pulls := pullsFunc(func() []Running {
		mu.Lock()
		defer mu.Unlock()
		return running
	})
	tr, err := New(path, WithRegisterer(reg))
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	tr.now = func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		return clock
	}
	advance := func(d time.Duration) {
		mu.Lock()
		defer mu.Unlock()
		clock = clock.Add(d)
	}
	image := running[0].Image
	check := func(step string, done, total int64, blobsDone int) Progress {
		t.Helper()
		tr.Poll(t.Context(), pulls)
		p, ok := tr.Progress(image)
		if !ok || p.Done != done || p.Total != total || p.BlobsDone != blobsDone {
			t.Fatalf("%s: progress %+v (known %v), want %d of %d bytes, %d blobs done", step, p, ok, done, total, blobsDone)
		}
		return p
	}

	// The registry has not answered: no manifest yet, the size is unknown.
	if p := check("before the manifest", 0, 0, 0); p.Known() {
		t.Errorf("progress %+v known before the manifest is", p)
	}
	// The manifest is stored, the config committed, the first layer being written.
	f.commit(manifestDigest, 400, src, start.Add(500*time.Millisecond), manifest(configDigest, layer1, layer2))
	f.commit(configDigest, 100, nil, start.Add(600*time.Millisecond), nil)
	f.ingest(layer1, 100, 1000)
	advance(time.Second)
	check("first layer started", 200, 1600, 1)
	f.ingest(layer1, 600, 1000)
	advance(time.Second)
	p := check("first layer half done", 700, 1600, 1)
	if p.Rate != 500 {
		t.Errorf("rate %v B/s, want 500 (500 bytes in 1 s)", p.Rate)
	}
	f.commit(layer1, 1000, nil, clock, nil)
	f.commit(layer2, 500, nil, clock, nil)
	advance(time.Second)
	check("all committed", 1600, 1600, 3)
	// Counted: what was written while the tracker looked, not the config committed before.
	if got := testutil.ToFloat64(tr.bytes.WithLabelValues("other")); got != 1400 {
		t.Errorf("podgate_image_pull_bytes_total = %v, want 1400", got)
	}
	if n, err := testutil.GatherAndCount(reg, "podgate_image_pull_throughput_bytes_per_second"); err != nil || n != 1 {
		t.Errorf("throughput series %d, %v; want one, for the registry of the running pull", n, err)
	}
	if f.badNS != 0 {
		t.Errorf("%d calls without containerd-namespace k8s.io", f.badNS)
	}

	mu.Lock()
	running = nil
	mu.Unlock()
	tr.Poll(t.Context(), pulls)
	if p, ok := tr.Progress(image); ok {
		t.Errorf("progress %+v of a pull that ended", p)
	}
	if n, _ := testutil.GatherAndCount(reg, "podgate_image_pull_throughput_bytes_per_second"); n != 0 {
		t.Errorf("throughput series %d after the pull ended, want none", n)
	}
}

// TestTrackerWithoutContainerd: a socket nobody serves gives no progress and no panic; the
// tracker tries again at the next poll.
func TestTrackerWithoutContainerd(t *testing.T) {
	path := filepath.Join(testfs.ShortDir(t), "none.sock")
	tr, err := New(path)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	tr.Poll(ctx, pullsFunc(func() []Running { return []Running{{Image: "example.com/a:1", Started: time.Now()}} }))
	if p, ok := tr.Progress("example.com/a:1"); ok && p.Known() {
		t.Errorf("progress %+v without containerd", p)
	}
	if tr.unavailable == "" {
		t.Error("the failed poll was not noted")
	}
}

func TestSplitImage(t *testing.T) {
	for _, tt := range []struct{ image, host, repo string }{
		{"docker.io/library/busybox:latest", "docker.io", "library/busybox"},
		{"127.0.0.1:5000/team/app:v1", "127.0.0.1", "team/app"},
		{"[::1]:5000/app@sha256:" + strings.Repeat("a", 64), "::1", "app"},
		{"registry.example.com/a/b/c:1", "registry.example.com", "a/b/c"},
	} {
		host, repo, err := splitImage(tt.image)
		if err != nil || host != tt.host || repo != tt.repo {
			t.Errorf("splitImage(%s) = %q, %q, %v; want %q, %q", tt.image, host, repo, err, tt.host, tt.repo)
		}
	}
}

// pullsFunc is the pulls a function lists, none of which stalls (no stall rule).
type pullsFunc func() []Running

func (f pullsFunc) Running() []Running { return f() }

func (pullsFunc) Stalled(context.Context, Running, Progress) {}
