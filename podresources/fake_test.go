package podresources

import (
	"context"
	"fmt"
	"maps"
	"net"
	"path"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"golang.org/x/time/rate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
	v1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	pb "github.com/podgate/podgate/podresources/api/v1alpha1"
	"github.com/podgate/podgate/test/testfs"
)

// fakeSource is a Source over a fixed set of pods. Pods and Pod hand out copies, as the
// agent's source builds its messages afresh.
type fakeSource struct {
	mu   sync.Mutex
	pods []*pb.Pod
	rev  uint64
	// specs are the pods' containers by pod UID; a pod without an entry has no known spec.
	specs map[string][]Container
	// onPods runs inside Pods, before the pods are read: a test publishes there to put a change
	// between a watch's subscription and its snapshot.
	onPods func()
}

var _ Source = (*fakeSource)(nil)

func (f *fakeSource) Pods() ([]*pb.Pod, uint64) {
	f.mu.Lock()
	hook := f.onPods
	f.mu.Unlock()
	if hook != nil {
		hook()
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]*pb.Pod, 0, len(f.pods))
	for _, p := range f.pods {
		out = append(out, proto.CloneOf(p))
	}
	return out, f.rev
}

// Pod returns the newest pod of that name, as the agent's registry does.
func (f *fakeSource) Pod(namespace, name string) (*pb.Pod, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var found *pb.Pod
	for _, p := range f.pods {
		if p.GetNamespace() == namespace && p.GetName() == name && (found == nil || Newer(p, found)) {
			found = p
		}
	}
	if found == nil {
		return nil, false
	}
	return proto.CloneOf(found), true
}

func (f *fakeSource) Containers(p *pb.Pod) ([]Container, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	cs, ok := f.specs[p.GetUid()]
	return slices.Clone(cs), ok
}

// set replaces the pods and the revision.
func (f *fakeSource) set(rev uint64, pods ...*pb.Pod) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.pods, f.rev = pods, rev
}

// fakeKubelet is the kubelet's PodResources service answering from fixed data, with the
// kubelet's own error for a pod it does not know, and, when limiter is set, the kubelet's
// token bucket in front (pkg/kubelet/apis/grpc/ratelimit.go): a call over it is
// ResourceExhausted, "rejected by rate limit", and never reaches the service.
type fakeKubelet struct {
	v1.UnimplementedPodResourcesListerServer
	allocatable *v1.AllocatableResourcesResponse
	// fail, when set, is every call's answer.
	fail error
	// limiter, when set, is the kubelet's token bucket over every call.
	limiter *rate.Limiter
	// refuse is how many calls, from the first, are refused as over the rate limit, as when
	// other clients have emptied the kubelet's bucket.
	refuse int
	// hold, when set, makes List take its answer, then receive from hold before sending it:
	// the kubelet's state as the call found it, answered late. A value releases one List,
	// closing it releases every List.
	hold chan struct{}
	// listing, when set, receives a value when List has taken its answer.
	listing chan struct{}

	mu   sync.Mutex
	pods []*v1.PodResources
	// calls are the calls that reached the service, by method; refused those over the limit.
	calls   map[string]int
	refused int
}

var _ v1.PodResourcesListerServer = (*fakeKubelet)(nil)

// setPods replaces the pods, as the kubelet admitting or removing pods.
func (k *fakeKubelet) setPods(pods ...*v1.PodResources) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.pods = pods
}

func (k *fakeKubelet) snapshot() []*v1.PodResources {
	k.mu.Lock()
	defer k.mu.Unlock()
	return slices.Clone(k.pods)
}

// counts returns the calls that reached the service, by method, and those refused.
func (k *fakeKubelet) counts() (calls map[string]int, refused int) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return maps.Clone(k.calls), k.refused
}

// limit is the kubelet's rate-limiting interceptor, counting what reaches the service.
func (k *fakeKubelet) limit(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	k.mu.Lock()
	if k.refuse > 0 || k.limiter != nil && !k.limiter.Allow() {
		k.refuse = max(k.refuse-1, 0)
		k.refused++
		k.mu.Unlock()
		return nil, status.Error(codes.ResourceExhausted, "rejected by rate limit")
	}
	if k.calls == nil {
		k.calls = map[string]int{}
	}
	k.calls[path.Base(info.FullMethod)]++
	k.mu.Unlock()
	return handler(ctx, req)
}

func (k *fakeKubelet) List(ctx context.Context, _ *v1.ListPodResourcesRequest) (*v1.ListPodResourcesResponse, error) {
	if k.fail != nil {
		return nil, k.fail
	}
	resp := &v1.ListPodResourcesResponse{PodResources: k.snapshot()}
	if k.listing != nil {
		k.listing <- struct{}{}
	}
	if k.hold != nil {
		select {
		case <-k.hold:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return resp, nil
}

func (k *fakeKubelet) Get(_ context.Context, req *v1.GetPodResourcesRequest) (*v1.GetPodResourcesResponse, error) {
	if k.fail != nil {
		return nil, k.fail
	}
	for _, p := range k.snapshot() {
		if p.GetNamespace() == req.GetPodNamespace() && p.GetName() == req.GetPodName() {
			return &v1.GetPodResourcesResponse{PodResources: p}, nil
		}
	}
	// The kubelet's own answer: an error without a gRPC code.
	return nil, fmt.Errorf("pod %s in namespace %s not found", req.GetPodName(), req.GetPodNamespace())
}

func (k *fakeKubelet) GetAllocatableResources(context.Context, *v1.AllocatableResourcesRequest) (*v1.AllocatableResourcesResponse, error) {
	if k.fail != nil {
		return nil, k.fail
	}
	return k.allocatable, nil
}

// kubeletRig is a fake kubelet served on a unix socket; stop ends it.
type kubeletRig struct {
	t    testing.TB
	srv  *grpc.Server
	done chan error
}

// serveKubelet serves k on path. keepSocket leaves the socket file behind when the server stops,
// as a kubelet that was killed does.
func serveKubelet(t testing.TB, path string, k *fakeKubelet, keepSocket bool) *kubeletRig {
	t.Helper()
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(!keepSocket)
	r := &kubeletRig{t: t, srv: grpc.NewServer(grpc.UnaryInterceptor(k.limit)), done: make(chan error, 1)}
	v1.RegisterPodResourcesListerServer(r.srv, k)
	go func() { r.done <- r.srv.Serve(l) }()
	t.Cleanup(r.stop)
	return r
}

// stop ends the fake kubelet and checks that Serve returned nil; it may be called again.
func (r *kubeletRig) stop() {
	r.srv.Stop()
	if r.done == nil {
		return
	}
	if err := <-r.done; err != nil {
		r.t.Errorf("fake kubelet: Serve: %v", err)
	}
	r.done = nil
}

// rig is a podresources Server on a unix socket with a client connection to it.
type rig struct {
	path    string
	server  *Server
	conn    *grpc.ClientConn
	metrics *prometheus.Registry
	// served receives Serve's result.
	served chan error
}

// newRig serves a Server built from o on a socket in a short directory; o.Registerer is set
// to a fresh registry. The cleanup shuts the server down and checks that Serve returned nil.
func newRig(t testing.TB, o Options) *rig {
	t.Helper()
	return newRigIn(t, testfs.ShortDir(t), o)
}

func newRigIn(t testing.TB, dir string, o Options) *rig {
	t.Helper()
	r, err := openRig(dir, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		r.shutdown(t)
		r.conn.Close()
	})
	return r
}

// openRig is newRigIn without the cleanup: the caller calls shutdown and closes conn.
func openRig(dir string, o Options) (*rig, error) {
	r := &rig{path: filepath.Join(dir, "pr.sock"), metrics: prometheus.NewRegistry(), served: make(chan error, 1)}
	o.Registerer = r.metrics
	s, err := NewServer(o)
	if err != nil {
		return nil, err
	}
	r.server = s
	l, err := net.Listen("unix", r.path)
	if err != nil {
		return nil, err
	}
	go func() { r.served <- s.Serve(l) }()
	r.conn, err = grpc.NewClient("unix://"+r.path, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		s.Shutdown(context.Background())
		return nil, err
	}
	return r, nil
}

// shutdown stops the server, once, and checks Serve's result.
func (r *rig) shutdown(t testing.TB) {
	t.Helper()
	if r.served == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r.server.Shutdown(ctx)
	if err := <-r.served; err != nil {
		t.Errorf("Serve: %v", err)
	}
	r.served = nil
}

func (r *rig) v1() v1.PodResourcesListerClient { return v1.NewPodResourcesListerClient(r.conn) }

func (r *rig) ext() pb.PodResourcesClient { return pb.NewPodResourcesClient(r.conn) }

// dial connects to a unix socket; the connection closes when the test ends.
func dial(t testing.TB, path string, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+path, append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// testContext is the test's context with a logger writing to the test's log, bounded so that a
// hung call fails the test instead of the whole run.
func testContext(t testing.TB) context.Context {
	t.Helper()
	logger, _ := ktesting.NewTestContext(t)
	ctx, cancel := context.WithTimeout(klog.NewContext(t.Context(), logger), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// benchContext is the benchmark's context with a logger writing to its log; unbounded, as a
// benchmark runs as long as it needs.
func benchContext(b *testing.B) context.Context {
	b.Helper()
	logger, _ := ktesting.NewTestContext(b)
	return klog.NewContext(b.Context(), logger)
}

// eventually polls cond every 10ms until it holds, failing the test after 15s.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	err := wait.PollUntilContextTimeout(t.Context(), 10*time.Millisecond, 15*time.Second, true, func(context.Context) (bool, error) {
		return cond(), nil
	})
	if err != nil {
		t.Fatalf("%s: still not true after 15s: %v", what, err)
	}
}

// metricValue reads one sample of a collector from the registry by its labels.
func metricValue(t testing.TB, reg *prometheus.Registry, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metric:
		for _, m := range mf.GetMetric() {
			want := map[string]string{}
			for i := 0; i+1 < len(labels); i += 2 {
				want[labels[i]] = labels[i+1]
			}
			if len(m.GetLabel()) != len(want) {
				continue
			}
			for _, lp := range m.GetLabel() {
				if want[lp.GetName()] != lp.GetValue() {
					continue metric
				}
			}
			switch {
			case m.GetCounter() != nil:
				return m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				return m.GetGauge().GetValue()
			}
		}
	}
	return 0
}

// gatherCount is testutil's count of the series of a metric, for assertions that a series
// exists at all.
func gatherCount(t testing.TB, reg *prometheus.Registry, name string) int {
	t.Helper()
	n, err := testutil.GatherAndCount(reg, name)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// Builders of test pods.

func sandbox(created time.Time) *pb.Sandbox {
	return &pb.Sandbox{Id: "sb-" + created.Format("150405.000"), State: pb.Sandbox_READY, CreatedAt: timestamppb.New(created)}
}

// claim is a prepared claim with one device and its CDI ids.
func claim(namespace, name, podClaimName string, cdi ...string) *pb.Claim {
	return &pb.Claim{
		Namespace: namespace, Name: name, Uid: "uid-" + name, PodClaimName: podClaimName, Prepared: true,
		Devices: []*pb.Device{{Driver: "net.example.com", Pool: "node-a", Device: "dev-" + name, Requests: []string{"nic"}, CdiDeviceIds: cdi}},
	}
}

func pod(namespace, name, uid string, sb *pb.Sandbox, claims ...*pb.Claim) *pb.Pod {
	return &pb.Pod{Uid: uid, Name: name, Namespace: namespace, Sandbox: sb, Claims: claims}
}
