package imagepull

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"
)

// testTimeout bounds every wait of a test for an event that must come; reaching it is a failure.
const testTimeout = 30 * time.Second

// backendCall is one call that reached the fake backend; it blocks until released.
type backendCall struct {
	image   string
	ctx     context.Context
	release chan error
}

// fakeBackend records the pulls that reach it, in order, and holds each until the test
// releases it (or its context ends, as a real backend would).
type fakeBackend struct {
	calls chan *backendCall
}

func newFakeBackend() *fakeBackend { return &fakeBackend{calls: make(chan *backendCall, 1000)} }

func (b *fakeBackend) pull(image string) PullFunc {
	return func(ctx context.Context) (*runtimeapi.PullImageResponse, error) {
		c := &backendCall{image: image, ctx: ctx, release: make(chan error, 1)}
		b.calls <- c
		select {
		case err := <-c.release:
			if err != nil {
				return nil, err
			}
			return &runtimeapi.PullImageResponse{ImageRef: "sha256:" + image}, nil
		case <-ctx.Done():
			return nil, status.FromContextError(context.Cause(ctx)).Err()
		}
	}
}

// next returns the next call that reaches the backend.
func (b *fakeBackend) next(t *testing.T) *backendCall {
	t.Helper()
	select {
	case c := <-b.calls:
		return c
	case <-time.After(testTimeout):
		t.Fatal("no pull reached the backend")
		return nil
	}
}

// idle fails the test if a call is pending at the backend.
func (b *fakeBackend) idle(t *testing.T) {
	t.Helper()
	select {
	case c := <-b.calls:
		t.Fatalf("unexpected backend pull of %s", c.image)
	default:
	}
}

// tracer turns the governor's trace events into a channel the test can wait on.
type tracer struct{ events chan string }

func trace(g *Governor) *tracer {
	tr := &tracer{events: make(chan string, 10000)}
	g.trace = func(event, image string) { tr.events <- event + " " + image }
	return tr
}

// await waits for the event "<event> <image>", skipping others; event "" waits for the caller
// to be queued or joined.
func (tr *tracer) await(t *testing.T, event, image string) {
	t.Helper()
	want := event + " " + image
	timeout := time.After(testTimeout)
	for {
		select {
		case e := <-tr.events:
			if e == want || event == "" && (e == "queued "+image || e == "joined "+image) {
				return
			}
		case <-timeout:
			t.Fatalf("no trace event %q", want)
		}
	}
}

type pullOpt func(*runtimeapi.PullImageRequest)

func withPod(ns, name, uid string) pullOpt {
	return func(r *runtimeapi.PullImageRequest) {
		r.SandboxConfig = &runtimeapi.PodSandboxConfig{Metadata: &runtimeapi.PodSandboxMetadata{Namespace: ns, Name: name, Uid: uid}}
	}
}

func withAuth(user, pass string) pullOpt {
	return func(r *runtimeapi.PullImageRequest) {
		r.Auth = &runtimeapi.AuthConfig{Username: user, Password: pass}
	}
}

func withHandler(h string) pullOpt {
	return func(r *runtimeapi.PullImageRequest) { r.Image.RuntimeHandler = h }
}

func request(image string, opts ...pullOpt) *runtimeapi.PullImageRequest {
	r := &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: image}}
	for _, o := range opts {
		o(r)
	}
	return r
}

func newPull(t *testing.T, image string, prio Priority, opts ...pullOpt) Pull {
	t.Helper()
	p, err := NewPull(request(image, opts...))
	if err != nil {
		t.Fatal(err)
	}
	p.Priority = prio
	return p
}

// result is what one Do call returned.
type result struct {
	resp *runtimeapi.PullImageResponse
	err  error
}

// goDo runs Do in a goroutine; its result arrives on the returned channel.
func goDo(ctx context.Context, g *Governor, p Pull, fn PullFunc) <-chan result {
	ch := make(chan result, 1)
	go func() {
		resp, err := g.Do(ctx, p, fn)
		ch <- result{resp, err}
	}()
	return ch
}

func wait(t *testing.T, ch <-chan result) result {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(testTimeout):
		t.Fatal("Do did not return")
		return result{}
	}
}

func TestPriorityOrder(t *testing.T) {
	ctx := t.Context()
	g := New(Limits{MaxParallel: 1})
	tr := trace(g)
	b := newFakeBackend()

	blocker := goDo(ctx, g, newPull(t, "example.com/blocker", PriorityNormal), b.pull("blocker"))
	running := b.next(t)
	// Queue in this order; each must be queued before the next arrives.
	arrivals := []struct {
		image string
		prio  Priority
	}{
		{"example.com/n1", PriorityNormal},
		{"example.com/n2", PriorityNormal},
		{"example.com/c1", PriorityClusterCritical},
		{"example.com/n3", PriorityNormal},
		{"example.com/k1", PriorityNodeCritical},
		{"example.com/c2", PriorityClusterCritical},
		{"example.com/k2", PriorityNodeCritical},
	}
	var results []<-chan result
	for _, a := range arrivals {
		p := newPull(t, a.image, a.prio)
		results = append(results, goDo(ctx, g, p, b.pull(a.image)))
		tr.await(t, "queued", p.Image)
	}
	want := []string{"k1", "k2", "c1", "c2", "n1", "n2", "n3"}
	running.release <- nil
	var got []string
	for range want {
		c := b.next(t)
		got = append(got, strings.TrimPrefix(c.image, "example.com/"))
		b.idle(t) // serial: nothing else may start while c runs
		c.release <- nil
	}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("backend order %v, want %v", got, want)
	}
	for _, ch := range append(results, blocker) {
		if r := wait(t, ch); r.err != nil {
			t.Error(r.err)
		}
	}
}

// TestCriticalJoinRaisesSharedPull: a critical pod asking for an image an ordinary pod's pull
// already queued lifts that pull to the critical pod's priority.
func TestCriticalJoinRaisesSharedPull(t *testing.T) {
	ctx := t.Context()
	g := New(Limits{MaxParallel: 1})
	tr := trace(g)
	b := newFakeBackend()
	blocker := goDo(ctx, g, newPull(t, "example.com/blocker", PriorityNormal), b.pull("blocker"))
	running := b.next(t)
	n1 := newPull(t, "example.com/n1", PriorityNormal)
	shared := newPull(t, "example.com/shared", PriorityNormal)
	r1 := goDo(ctx, g, n1, b.pull(n1.Image))
	tr.await(t, "queued", n1.Image)
	r2 := goDo(ctx, g, shared, b.pull(shared.Image))
	tr.await(t, "queued", shared.Image)
	critical := newPull(t, "example.com/shared", PriorityNodeCritical, withPod("kube-system", "cni", "u-cni"))
	r3 := goDo(ctx, g, critical, b.pull(shared.Image))
	tr.await(t, "joined", shared.Image)

	running.release <- nil
	if c := b.next(t); c.image != shared.Image {
		t.Errorf("first to start after the blocker: %s, want the raised %s", c.image, shared.Image)
		c.release <- nil
	} else {
		c.release <- nil
	}
	b.next(t).release <- nil
	for _, ch := range []<-chan result{blocker, r1, r2, r3} {
		if r := wait(t, ch); r.err != nil {
			t.Error(r.err)
		}
	}
}

func TestCancelWaiting(t *testing.T) {
	tests := []struct {
		name    string
		cancel  func(g *Governor, cancelCtx context.CancelFunc)
		want    error // the error's class
		wantMsg string
		reason  string
	}{
		{"caller context", func(_ *Governor, cancel context.CancelFunc) { cancel() }, context.Canceled,
			"pull of example.com/victim:latest: cancelled by the caller: context canceled", reasonCaller},
		{"pod deleted", func(g *Governor, _ context.CancelFunc) { g.PodDeleted("uid-gone") }, errdefs.ErrAborted,
			"pull of example.com/victim:latest abandoned: pod default/web was deleted", reasonPodDeleted},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			g := New(Limits{MaxParallel: 1}, WithRegisterer(reg))
			tr := trace(g)
			b := newFakeBackend()
			blocker := goDo(t.Context(), g, newPull(t, "example.com/blocker", PriorityNormal), b.pull("blocker"))
			running := b.next(t)

			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			victim := newPull(t, "example.com/victim", PriorityNormal, withPod("default", "web", "uid-gone"))
			res := goDo(ctx, g, victim, b.pull(victim.Image))
			tr.await(t, "queued", victim.Image)

			tt.cancel(g, cancel)
			// It leaves while the blocker still holds the only slot: immediately, not at its turn.
			r := wait(t, res)
			if !errors.Is(errdefs.Resolve(r.err), tt.want) || r.err.Error() != tt.wantMsg {
				t.Errorf("Do = %q (class %v), want %q of class %v", r.err, errdefs.Resolve(r.err), tt.wantMsg, tt.want)
			}
			if s := g.Stats(); s.Queued != 0 {
				t.Errorf("queue holds %d flights after the only waiter left, want 0", s.Queued)
			}
			// The victim never reaches the backend: the next pull after the blocker is "after".
			after := newPull(t, "example.com/after", PriorityNormal)
			resAfter := goDo(t.Context(), g, after, b.pull(after.Image))
			tr.await(t, "queued", after.Image)
			running.release <- nil
			if c := b.next(t); c.image != after.Image {
				t.Errorf("backend got %s after the blocker, want %s (the cancelled pull must not run)", c.image, after.Image)
			} else {
				c.release <- nil
			}
			wait(t, blocker)
			wait(t, resAfter)
			if got := testutil.ToFloat64(g.metrics.cancelled[KindImage].WithLabelValues(tt.reason)); got != 1 {
				t.Errorf("podgate_image_pull_cancelled_total{reason=%q} = %v, want 1", tt.reason, got)
			}
		})
	}
}

// TestCancelRunning: a running pull is cancelled at the backend when its only waiter goes, and
// goes on when another waiter shares it.
func TestCancelRunning(t *testing.T) {
	tests := []struct {
		name        string
		othersWait  bool
		wantBackend bool // the backend call's context is cancelled
	}{
		{"sole waiter: backend cancelled", false, true},
		{"shared: backend goes on", true, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := t.Context()
			g := New(Limits{MaxParallel: 2})
			tr := trace(g)
			b := newFakeBackend()
			p := newPull(t, "example.com/app:1", PriorityNormal, withPod("default", "a", "uid-a"))
			resA := goDo(ctx, g, p, b.pull(p.Image))
			c := b.next(t)
			var resB <-chan result
			if tt.othersWait {
				pb := newPull(t, "example.com/app:1", PriorityNormal, withPod("default", "b", "uid-b"))
				resB = goDo(ctx, g, pb, b.pull(pb.Image))
				tr.await(t, "joined", pb.Image)
			}
			g.PodDeleted("uid-a")
			if r := wait(t, resA); !errdefs.IsAborted(r.err) {
				t.Errorf("deleted pod's pull = %v, want errdefs.ErrAborted", r.err)
			}
			tr.await(t, "left", p.Image)
			if got := c.ctx.Err() != nil; got != tt.wantBackend {
				t.Errorf("backend call cancelled = %v, want %v", got, tt.wantBackend)
			}
			if tt.othersWait {
				c.release <- nil
				r := wait(t, resB)
				if r.err != nil || r.resp.GetImageRef() != "sha256:"+p.Image {
					t.Errorf("other waiter got %v, %v; want the shared pull's result", r.resp, r.err)
				}
			} else if cause := context.Cause(c.ctx); !errors.Is(cause, ErrPodDeleted) {
				t.Errorf("backend context cause = %v, want %v", cause, ErrPodDeleted)
			}
		})
	}
}

// TestFirstCallerCancelsSharedPull: the caller whose request makes the backend call gives up;
// the pull continues for the other caller, which gets its result.
func TestFirstCallerCancelsSharedPull(t *testing.T) {
	g := New(Limits{})
	tr := trace(g)
	b := newFakeBackend()
	firstCtx, cancelFirst := context.WithCancel(t.Context())
	p := newPull(t, "example.com/app:1", PriorityNormal)
	first := goDo(firstCtx, g, p, b.pull(p.Image))
	c := b.next(t)
	second := goDo(t.Context(), g, p, b.pull("must-not-be-called"))
	tr.await(t, "joined", p.Image)
	cancelFirst()
	if r := wait(t, first); !errors.Is(r.err, context.Canceled) {
		t.Errorf("first caller = %v, want context.Canceled", r.err)
	}
	tr.await(t, "left", p.Image)
	if c.ctx.Err() != nil {
		t.Fatal("backend call cancelled although a caller still waits")
	}
	c.release <- nil
	if r := wait(t, second); r.err != nil || r.resp.GetImageRef() != "sha256:"+p.Image {
		t.Errorf("second caller = %v, %v; want the shared result", r.resp, r.err)
	}
	b.idle(t)
}

func TestDeduplication(t *testing.T) {
	const image = "registry.example.com/app:1"
	tests := []struct {
		name      string
		opts      [][]pullOpt // one entry per caller
		wantCalls int
	}{
		{"same image, no credentials", [][]pullOpt{nil, nil, nil, nil}, 1},
		{"same credentials", [][]pullOpt{{withAuth("u", "p")}, {withAuth("u", "p")}, {withAuth("u", "p")}}, 1},
		{"different credentials never merge", [][]pullOpt{{withAuth("u", "p1")}, {withAuth("u", "p2")}, {withAuth("v", "p1")}}, 3},
		{"credentials vs none", [][]pullOpt{nil, {withAuth("u", "p")}}, 2},
		{"different runtime handlers", [][]pullOpt{{withHandler("runc")}, {withHandler("kata")}, {withHandler("runc")}}, 2},
		{"different pods share", [][]pullOpt{{withPod("a", "a", "ua")}, {withPod("b", "b", "ub")}}, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			g := New(Limits{}, WithRegisterer(reg))
			tr := trace(g)
			b := newFakeBackend()
			var results []<-chan result
			for _, o := range tt.opts {
				p := newPull(t, image, PriorityNormal, o...)
				results = append(results, goDo(t.Context(), g, p, b.pull(p.Image)))
				tr.await(t, "", p.Image) // queued or joined: in before the next arrives
			}
			// Release exactly wantCalls backend calls: a caller whose pull was not merged as
			// expected would wait for a call nobody releases, and fail below.
			for range tt.wantCalls {
				b.next(t).release <- nil
			}
			for _, ch := range results {
				if r := wait(t, ch); r.err != nil || r.resp.GetImageRef() != "sha256:"+image {
					t.Errorf("caller got %v, %v", r.resp, r.err)
				}
			}
			b.idle(t)
			if got, want := testutil.ToFloat64(g.metrics.deduplicated[KindImage]), float64(len(tt.opts)-tt.wantCalls); got != want {
				t.Errorf("podgate_image_pull_deduplicated_total = %v, want %v", got, want)
			}
		})
	}
}

// TestNoCredentialsInLogsOrMetrics: credentials appear in no log line and no metric.
func TestNoCredentialsInLogsOrMetrics(t *testing.T) {
	var logs bytes.Buffer
	logger := textlogger.NewLogger(textlogger.NewConfig(textlogger.Output(&logs), textlogger.Verbosity(10)))
	ctx := klog.NewContext(t.Context(), logger)
	reg := prometheus.NewRegistry()
	g := New(Limits{MaxParallel: 1}, WithRegisterer(reg))
	tr := trace(g)
	b := newFakeBackend()
	const secret = "s3cr3t-passw0rd"
	p1 := newPull(t, "example.com/a", PriorityNormal, withAuth("alice", secret))
	r1 := goDo(ctx, g, p1, b.pull(p1.Image))
	c := b.next(t)
	p2 := newPull(t, "example.com/a", PriorityNormal, withAuth("alice", secret))
	r2 := goDo(ctx, g, p2, b.pull(p2.Image))
	tr.await(t, "joined", p2.Image)
	p3 := newPull(t, "example.com/b", PriorityNormal, withAuth("alice", secret))
	r3 := goDo(ctx, g, p3, b.pull(p3.Image))
	tr.await(t, "queued", p3.Image)
	c.release <- nil
	b.next(t).release <- nil
	for _, ch := range []<-chan result{r1, r2, r3} {
		wait(t, ch)
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	text := fmt.Sprint(families)
	for _, s := range []string{secret, "alice"} {
		if strings.Contains(logs.String(), s) {
			t.Errorf("log contains %q:\n%s", s, logs.String())
		}
		if strings.Contains(text, s) {
			t.Errorf("metrics contain %q", s)
		}
	}
	if !strings.Contains(logs.String(), "Image pull waits") || !strings.Contains(logs.String(), "Image pull started") {
		t.Errorf("log lacks the wait and start lines:\n%s", logs.String())
	}
}

// TestPerRegistryCap: a full registry holds its own pulls back but lets other registries' pulls
// start, within the node-wide cap.
func TestPerRegistryCap(t *testing.T) {
	ctx := t.Context()
	g := New(Limits{MaxParallel: 2, PerRegistry: map[string]int{"docker.io": 1}})
	tr := trace(g)
	b := newFakeBackend()
	d1 := newPull(t, "busybox:1", PriorityNormal) // docker.io, normalised
	d2 := newPull(t, "docker.io/library/busybox:2", PriorityNormal)
	q1 := newPull(t, "quay.io/org/app:1", PriorityNormal)
	q2 := newPull(t, "quay.io/org/app:2", PriorityNormal)
	if d1.Registry != "docker.io" || d2.Registry != "docker.io" {
		t.Fatalf("registries %q, %q; want docker.io", d1.Registry, d2.Registry)
	}
	r1 := goDo(ctx, g, d1, b.pull(d1.Image))
	c1 := b.next(t)
	r2 := goDo(ctx, g, d2, b.pull(d2.Image))
	tr.await(t, "queued", d2.Image)
	r3 := goDo(ctx, g, q1, b.pull(q1.Image))
	cq1 := b.next(t)
	if cq1.image != q1.Image {
		t.Fatalf("second backend pull %s, want %s (docker.io is full, quay.io is not)", cq1.image, q1.Image)
	}
	r4 := goDo(ctx, g, q2, b.pull(q2.Image))
	tr.await(t, "queued", q2.Image)
	b.idle(t) // node cap 2 reached
	c1.release <- nil
	// d1 done: d2 (docker.io, first in the queue) takes both freed slots.
	if c := b.next(t); c.image != d2.Image {
		t.Errorf("after the first docker.io pull: %s started, want %s", c.image, d2.Image)
		c.release <- nil
	} else {
		c.release <- nil
	}
	cq1.release <- nil
	b.next(t).release <- nil // q2
	for _, ch := range []<-chan result{r1, r2, r3, r4} {
		if r := wait(t, ch); r.err != nil {
			t.Error(r.err)
		}
	}
}

// TestNewPullReference: references are read as containerd's CRI reads them
// (reference.ParseDockerRef): the ones it accepts, under the name it gives them, and the ones it
// refuses.
func TestNewPullReference(t *testing.T) {
	const digest = "sha256:7cc4b5aefd1d0cadf8d97d4350462ba51c694ebca145b08d7d41b41acc8db5aa"
	tests := []struct {
		image          string
		name, registry string // "" = refused with errdefs.ErrInvalidArgument
	}{
		{"busybox", "docker.io/library/busybox:latest", "docker.io"},
		{"busybox:1.35", "docker.io/library/busybox:1.35", "docker.io"},
		{"library/busybox:1.35", "docker.io/library/busybox:1.35", "docker.io"},
		{"docker.io/library/busybox:1.35", "docker.io/library/busybox:1.35", "docker.io"},
		{"docker.io/busybox", "docker.io/library/busybox:latest", "docker.io"},
		{"index.docker.io/library/busybox:1.35", "docker.io/library/busybox:1.35", "docker.io"},
		{"registry-1.docker.io/library/busybox:1.35", "registry-1.docker.io/library/busybox:1.35", "docker.io"},
		{"team/app", "docker.io/team/app:latest", "docker.io"},
		{"registry.k8s.io/pause:3.10", "registry.k8s.io/pause:3.10", "registry.k8s.io"},
		{"127.0.0.1:5000/a/b:t", "127.0.0.1:5000/a/b:t", "127.0.0.1:5000"},
		{"localhost/app", "localhost/app:latest", "localhost"},
		{"[::1]:5000/app:v1", "[::1]:5000/app:v1", "[::1]:5000"},
		// A first component in capitals can only be a host: the registry is "UPPER".
		{"UPPER/case", "UPPER/case:latest", "upper"},
		{"Quay.IO/org/app", "Quay.IO/org/app:latest", "quay.io"},
		{"busybox@" + digest, "docker.io/library/busybox@" + digest, "docker.io"},
		// Both a tag and a digest: the digest decides, the tag is dropped.
		{"busybox:1.35@" + digest, "docker.io/library/busybox@" + digest, "docker.io"},

		{"", "", ""},
		{"Busybox", "", ""},
		{"quay.io/Org/app", "", ""},
		{"bad ref with spaces", "", ""},
		{"example.com/x:tag:tag", "", ""},
		{"example.com/x@sha256:short", "", ""},
		{"example.com/x:", "", ""},
		{"-lead/app", "", ""},
		{strings.Repeat("a", 64), "", ""}, // an image ID, not a name
		{"https://example.com/app", "", ""},
	}
	for _, tt := range tests {
		p, err := NewPull(request(tt.image))
		if tt.name == "" {
			if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "image reference") {
				t.Errorf("NewPull(%q) = %q, %v; want an errdefs.ErrInvalidArgument about the reference", tt.image, p.Image, err)
			}
			continue
		}
		if err != nil || p.Image != tt.name || p.Registry != tt.registry {
			t.Errorf("NewPull(%q) = image %q registry %q, %v; want %q %q", tt.image, p.Image, p.Registry, err, tt.name, tt.registry)
		}
	}
}

// TestRegistryHost: configuration keys normalise to the registries of the pulls they cap.
func TestRegistryHost(t *testing.T) {
	for host, want := range map[string]string{
		"docker.io":            "docker.io",
		"index.docker.io":      "docker.io",
		"registry-1.docker.io": "docker.io",
		"Docker.IO":            "docker.io",
		"Quay.IO":              "quay.io",
		"127.0.0.1:5000":       "127.0.0.1:5000",
		"localhost":            "localhost",
		"localhost:5000":       "localhost:5000",
		"[::1]:5000":           "[::1]:5000",
		"UPPER":                "upper",
	} {
		got, err := RegistryHost(host)
		if err != nil || got != want {
			t.Errorf("RegistryHost(%q) = %q, %v; want %q", host, got, err, want)
			continue
		}
		// The key is what a pull from that host is counted under.
		if p, err := NewPull(request(host + "/app:1")); err != nil || p.Registry != got {
			t.Errorf("a pull from %s counts under %q, %v; its key is %q", host, p.Registry, err, got)
		}
	}
	for _, bad := range []string{"", "a/b", "quay.io/org", "http://x", "myregistry", "bad host"} {
		if got, err := RegistryHost(bad); err == nil {
			t.Errorf("RegistryHost(%q) = %q, want an error", bad, got)
		}
	}
}

func TestSandboxPriority(t *testing.T) {
	sp := SandboxPriority{Label: "podgate.dev/priority-class", Namespaces: []string{"kube-system"}}
	cfg := func(ns string, labels, annotations map[string]string) *runtimeapi.PodSandboxConfig {
		return &runtimeapi.PodSandboxConfig{Metadata: &runtimeapi.PodSandboxMetadata{Namespace: ns}, Labels: labels, Annotations: annotations}
	}
	l := func(v string) map[string]string { return map[string]string{"podgate.dev/priority-class": v} }
	tests := []struct {
		name string
		cfg  *runtimeapi.PodSandboxConfig
		want Priority
	}{
		{"no sandbox", nil, PriorityNormal},
		{"node critical label", cfg("kube-system", l(NodeCriticalClass), nil), PriorityNodeCritical},
		{"cluster critical annotation", cfg("kube-system", nil, l(ClusterCriticalClass)), PriorityClusterCritical},
		{"other namespace may not claim", cfg("default", l(NodeCriticalClass), nil), PriorityNormal},
		{"unknown class", cfg("kube-system", l("high"), nil), PriorityNormal},
	}
	for _, tt := range tests {
		if got := sp.Of(tt.cfg); got != tt.want {
			t.Errorf("%s: %v, want %v", tt.name, got, tt.want)
		}
	}
	v := int32(nodeCriticalValue)
	if PriorityOf("custom", &v) != PriorityNodeCritical {
		t.Error("numeric node-critical priority not recognised")
	}
}

// TestMetricLabelsAndWaits: registries named by pods do not grow the label set, and a caller
// that joins a running pull records no negative wait.
func TestMetricLabelsAndWaits(t *testing.T) {
	reg := prometheus.NewRegistry()
	g := New(Limits{MaxParallel: 8, PerRegistry: map[string]int{"docker.io": 2}}, WithRegisterer(reg))
	var clock atomic.Int64 // a fake clock: waits are exact
	g.now = func() time.Time { return time.Unix(0, clock.Load()) }
	tr := trace(g)
	b := newFakeBackend()
	ctx := t.Context()
	var results []<-chan result
	var calls []*backendCall
	for _, image := range []string{"docker.io/library/a:1", "r1.invalid/x:1", "r2.invalid/y:1", "r3.invalid/z:1"} {
		p := newPull(t, image, PriorityNormal)
		results = append(results, goDo(ctx, g, p, b.pull(p.Image)))
		calls = append(calls, b.next(t))
	}
	// A second caller of a running pull, arriving 10s after it started.
	clock.Add(int64(10 * time.Second))
	joiner := newPull(t, "docker.io/library/a:1", PriorityNormal)
	results = append(results, goDo(ctx, g, joiner, b.pull("must-not-be-called")))
	tr.await(t, "joined", joiner.Image)

	gauge := g.metrics.registryInFlight
	if n := testutil.CollectAndCount(gauge); n != 2 {
		t.Errorf("%d registry series, want 2 (docker.io and other)", n)
	}
	if v := testutil.ToFloat64(gauge.WithLabelValues("docker.io")); v != 1 {
		t.Errorf("docker.io in flight = %v, want 1", v)
	}
	if v := testutil.ToFloat64(gauge.WithLabelValues("other")); v != 3 {
		t.Errorf("other registries in flight = %v, want 3", v)
	}
	for _, c := range calls {
		c.release <- nil
	}
	for _, r := range results {
		if res := wait(t, r); res.err != nil {
			t.Fatal(res.err)
		}
	}
	if v := testutil.ToFloat64(gauge.WithLabelValues("other")); v != 0 {
		t.Errorf("other registries in flight after the pulls = %v, want 0", v)
	}
	var m dto.Metric
	if err := g.metrics.wait[KindImage].(prometheus.Histogram).Write(&m); err != nil {
		t.Fatal(err)
	}
	// Nobody waited: the four started at once, the joiner found its pull running.
	if m.GetHistogram().GetSampleCount() != 5 || m.GetHistogram().GetSampleSum() != 0 {
		t.Errorf("wait histogram: %d samples, sum %vs; want 5 samples, sum 0", m.GetHistogram().GetSampleCount(), m.GetHistogram().GetSampleSum())
	}
	b.idle(t)
}

// TestSlotHeldUntilBackendReturns: the caps count the backend calls podgate has outstanding. A
// running pull whose every caller has left is cancelled, but keeps its slots until its backend
// call has returned; only then does the next pull start.
func TestSlotHeldUntilBackendReturns(t *testing.T) {
	for _, limits := range []Limits{
		{MaxParallel: 1},
		{PerRegistry: map[string]int{"example.com": 1}},
	} {
		t.Run(fmt.Sprintf("%+v", limits), func(t *testing.T) {
			g := New(limits)
			tr := trace(g)
			b := newFakeBackend()
			// The first backend call notices its cancellation late: it returns only when released.
			slow := func(ctx context.Context) (*runtimeapi.PullImageResponse, error) {
				c := &backendCall{image: "slow", ctx: ctx, release: make(chan error, 1)}
				b.calls <- c
				return nil, <-c.release
			}
			ctx, cancel := context.WithCancel(t.Context())
			first := goDo(ctx, g, newPull(t, "example.com/slow", PriorityNormal), slow)
			c := b.next(t)
			cancel()
			if r := wait(t, first); !errors.Is(r.err, context.Canceled) {
				t.Fatalf("caller of the slow pull = %v, want context.Canceled", r.err)
			}
			if c.ctx.Err() == nil {
				t.Fatal("the abandoned pull was not cancelled at the backend")
			}

			next := newPull(t, "example.com/next", PriorityNormal)
			res := goDo(t.Context(), g, next, b.pull(next.Image))
			tr.await(t, "queued", next.Image)
			// join dispatches under the governor's lock: had the slot been free, next would
			// be running now.
			if s := g.Stats(); s.InFlight != 1 || s.Queued != 1 {
				t.Fatalf("governor %+v while the cancelled call is still outstanding, want it in flight and next queued", s)
			}
			b.idle(t)

			c.release <- context.Canceled
			b.next(t).release <- nil
			if r := wait(t, res); r.err != nil {
				t.Fatal(r.err)
			}
		})
	}
}
