package dra_test

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc"
	"k8s.io/klog/v2/ktesting"
	drapbv1 "k8s.io/kubelet/pkg/apis/dra/v1"
	drapbv1beta1 "k8s.io/kubelet/pkg/apis/dra/v1beta1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/podgate/podgate/dra"
	"github.com/podgate/podgate/test/testfs"
)

// waitLimit bounds every wait of these tests: a bound on a failure, never a pause.
const waitLimit = 30 * time.Second

// node is a plugin registry and, beside it, a directory for the drivers' DRA sockets, as
// /var/lib/kubelet/plugins_registry and /var/lib/kubelet/plugins are on a node.
type node struct {
	registry string
	plugins  string
}

func newNode(t *testing.T) *node {
	t.Helper()
	base := testfs.ShortDir(t)
	n := &node{registry: filepath.Join(base, "r"), plugins: filepath.Join(base, "p")}
	for _, dir := range []string{n.registry, n.plugins} {
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return n
}

// serve serves a gRPC server on a new Unix socket at path until the test ends or stop is
// called; stopping closes the listener, which removes the socket file.
func serve(t *testing.T, path string, register func(*grpc.Server), opts ...grpc.ServerOption) (stop func()) {
	t.Helper()
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(opts...)
	register(srv)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()
	stop = sync.OnceFunc(func() {
		srv.Stop()
		if err := <-served; err != nil {
			t.Errorf("serve %s: %v", path, err)
		}
	})
	t.Cleanup(stop)
	return stop
}

// fakeRegistration is a plugin's registration server: it answers GetInfo as told.
type fakeRegistration struct {
	registerapi.UnimplementedRegistrationServer

	mu    sync.Mutex
	info  *registerapi.PluginInfo
	err   error
	calls int

	notified atomic.Int32
}

func (r *fakeRegistration) GetInfo(context.Context, *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls++
	if r.err != nil {
		return nil, r.err
	}
	return r.info, nil
}

func (r *fakeRegistration) NotifyRegistrationStatus(context.Context, *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	r.notified.Add(1)
	return &registerapi.RegistrationStatusResponse{}, nil
}

func (r *fakeRegistration) setErr(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.err = err
}

func (r *fakeRegistration) getInfoCalls() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.calls
}

// serveRegistration serves info on a registration socket at path.
func serveRegistration(t *testing.T, path string, info *registerapi.PluginInfo) (*fakeRegistration, func()) {
	t.Helper()
	r := &fakeRegistration{info: info}
	return r, serveFakeRegistration(t, path, r)
}

// serveFakeRegistration serves r on a registration socket at path.
func serveFakeRegistration(t *testing.T, path string, r *fakeRegistration) (stop func()) {
	t.Helper()
	stop = serve(t, path, func(s *grpc.Server) { registerapi.RegisterRegistrationServer(s, r) })
	t.Cleanup(func() {
		if n := r.notified.Load(); n != 0 {
			t.Errorf("podgate called NotifyRegistrationStatus %d times on %s; that is the kubelet's", n, path)
		}
	})
	return stop
}

// fakeDriver is a DRA driver's DRA service (v1; v1beta1 through the upstream wrapper). It
// prepares each claim as one device named after the claim; claims can be made to fail or be
// left out of the answer, and calls can be held until the test ends.
type fakeDriver struct {
	drapbv1.UnimplementedDRAPluginServer

	// hold, when set, holds every call until it is closed (at cleanup) or the caller leaves;
	// entered learns of each held call.
	hold    chan struct{}
	entered chan struct{}

	mu       sync.Mutex
	callErr  error
	failing  map[string]string // claim UID → the driver's error for it
	omitted  map[string]bool   // claim UIDs left out of answers
	prepared map[string]int    // claim UID → prepare calls that prepared it
	methods  []string          // full gRPC method names served
}

func newFakeDriver() *fakeDriver {
	return &fakeDriver{failing: map[string]string{}, omitted: map[string]bool{}, prepared: map[string]int{}}
}

// holdCalls makes every call wait until the test ends or its caller leaves.
func (f *fakeDriver) holdCalls(t *testing.T) {
	f.hold = make(chan struct{})
	f.entered = make(chan struct{}, 16)
	t.Cleanup(func() { close(f.hold) })
}

// failCalls makes every call fail with err.
func (f *fakeDriver) failCalls(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.callErr = err
}

func (f *fakeDriver) wait(ctx context.Context) error {
	if f.hold == nil {
		return nil
	}
	f.entered <- struct{}{}
	select {
	case <-f.hold:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (f *fakeDriver) NodePrepareResources(ctx context.Context, req *drapbv1.NodePrepareResourcesRequest) (*drapbv1.NodePrepareResourcesResponse, error) {
	if err := f.wait(ctx); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.callErr != nil {
		return nil, f.callErr
	}
	resp := &drapbv1.NodePrepareResourcesResponse{Claims: map[string]*drapbv1.NodePrepareResourceResponse{}}
	for _, c := range req.GetClaims() {
		switch {
		case f.omitted[c.GetUid()]:
		case f.failing[c.GetUid()] != "":
			resp.Claims[c.GetUid()] = &drapbv1.NodePrepareResourceResponse{Error: f.failing[c.GetUid()]}
		default:
			f.prepared[c.GetUid()]++
			resp.Claims[c.GetUid()] = &drapbv1.NodePrepareResourceResponse{Devices: []*drapbv1.Device{{
				RequestNames: []string{"nic"},
				PoolName:     "pool-a",
				DeviceName:   "dev-" + c.GetName(),
				CdiDeviceIds: []string{"example.com/net=" + c.GetName()},
			}}}
		}
	}
	return resp, nil
}

func (f *fakeDriver) NodeUnprepareResources(ctx context.Context, req *drapbv1.NodeUnprepareResourcesRequest) (*drapbv1.NodeUnprepareResourcesResponse, error) {
	if err := f.wait(ctx); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.callErr != nil {
		return nil, f.callErr
	}
	resp := &drapbv1.NodeUnprepareResourcesResponse{Claims: map[string]*drapbv1.NodeUnprepareResourceResponse{}}
	for _, c := range req.GetClaims() {
		switch {
		case f.omitted[c.GetUid()]:
		case f.failing[c.GetUid()] != "":
			resp.Claims[c.GetUid()] = &drapbv1.NodeUnprepareResourceResponse{Error: f.failing[c.GetUid()]}
		default:
			// Not prepared is fine: unprepare is idempotent.
			delete(f.prepared, c.GetUid())
			resp.Claims[c.GetUid()] = &drapbv1.NodeUnprepareResourceResponse{}
		}
	}
	return resp, nil
}

func (f *fakeDriver) record(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	f.mu.Lock()
	f.methods = append(f.methods, info.FullMethod)
	f.mu.Unlock()
	return handler(ctx, req)
}

func (f *fakeDriver) servedMethods() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.methods)
}

func (f *fakeDriver) prepareCount(uid string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.prepared[uid]
}

// Full method names, to tell which service a call used.
const (
	v1Prepare        = "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources"
	v1Unprepare      = "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodeUnprepareResources"
	v1beta1Prepare   = "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodePrepareResources"
	v1beta1Unprepare = "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodeUnprepareResources"
)

// driverSpec says how startDriver builds a driver.
type driverSpec struct {
	name string
	// serve are the DRA services the driver serves; default both, as kubeletplugin does.
	serve []string
	// advertise are its supported versions in GetInfo; default serve.
	advertise []string
	// regFile and draFile name its sockets; defaults <name>-reg.sock and <name>.sock.
	regFile, draFile string
	// pluginType defaults to DRAPlugin.
	pluginType string
}

// testDriver is a running fake driver: a DRA service and a registration socket.
type testDriver struct {
	fake     *fakeDriver
	reg      *fakeRegistration
	regPath  string
	endpoint string
	stopDRA  func()
	stopReg  func()
}

// startDriver starts a fake driver on n: its DRA service first, then its registration
// socket, as kubeletplugin does.
func startDriver(t *testing.T, n *node, spec driverSpec) *testDriver {
	t.Helper()
	if spec.serve == nil {
		spec.serve = []string{drapbv1.DRAPluginService, drapbv1beta1.DRAPluginService}
	}
	if spec.advertise == nil {
		spec.advertise = spec.serve
	}
	if spec.regFile == "" {
		spec.regFile = spec.name + "-reg.sock"
	}
	if spec.draFile == "" {
		spec.draFile = spec.name + ".sock"
	}
	if spec.pluginType == "" {
		spec.pluginType = registerapi.DRAPlugin
	}
	td := &testDriver{fake: newFakeDriver(), regPath: filepath.Join(n.registry, spec.regFile), endpoint: filepath.Join(n.plugins, spec.draFile)}
	td.stopDRA = serve(t, td.endpoint, func(s *grpc.Server) {
		for _, svc := range spec.serve {
			switch svc {
			case drapbv1.DRAPluginService:
				drapbv1.RegisterDRAPluginServer(s, td.fake)
			case drapbv1beta1.DRAPluginService:
				drapbv1beta1.RegisterDRAPluginServer(s, drapbv1beta1.V1ServerWrapper{DRAPluginServer: td.fake})
			}
		}
	}, grpc.ChainUnaryInterceptor(td.fake.record))
	td.reg, td.stopReg = serveRegistration(t, td.regPath, &registerapi.PluginInfo{
		Type:              spec.pluginType,
		Name:              spec.name,
		Endpoint:          td.endpoint,
		SupportedVersions: spec.advertise,
	})
	return td
}

// tracer records the events Drivers reports on registry paths.
type tracer struct {
	mu     sync.Mutex
	counts map[[2]string]int
	wake   chan struct{}
}

func newTracer() *tracer {
	return &tracer{counts: map[[2]string]int{}, wake: make(chan struct{})}
}

func (tr *tracer) record(event, path string) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.counts[[2]string{event, path}]++
	close(tr.wake)
	tr.wake = make(chan struct{})
}

func (tr *tracer) count(event, path string) int {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return tr.counts[[2]string{event, path}]
}

// wait waits until event has been reported on path at least n times.
func (tr *tracer) wait(t *testing.T, event, path string, n int) {
	t.Helper()
	limit := time.NewTimer(waitLimit)
	defer limit.Stop()
	for {
		tr.mu.Lock()
		got, wake := tr.counts[[2]string{event, path}], tr.wake
		tr.mu.Unlock()
		if got >= n {
			return
		}
		select {
		case <-wake:
		case <-limit.C:
			t.Fatalf("no %d× %q on %s within %s (got %d)", n, event, path, waitLimit, got)
		}
	}
}

// discovery is a running Drivers with its metrics registry and event trace.
type discovery struct {
	*dra.Drivers
	metrics *prometheus.Registry
	trace   *tracer
}

// startDiscovery runs Drivers on n's registry until the test ends, and checks that Run then
// returns nil. Retries are quick so that tests wait little.
func startDiscovery(t *testing.T, n *node, opts ...dra.Option) *discovery {
	t.Helper()
	reg := prometheus.NewRegistry()
	opts = append([]dra.Option{
		dra.WithPluginRegistryDir(n.registry),
		dra.WithRegisterer(reg),
		dra.WithRetryBackoff(5*time.Millisecond, 20*time.Millisecond),
	}, opts...)
	d := &discovery{Drivers: dra.NewDrivers(opts...), metrics: reg, trace: newTracer()}
	dra.SetTrace(d.Drivers, d.trace.record)
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- d.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-ran; err != nil {
			t.Errorf("Run: %v", err)
		}
		if err := d.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return d
}

// waitFor waits until the driver is known, with the test's bound.
func (d *discovery) waitFor(t *testing.T, name string) *dra.Driver {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	drv, err := d.WaitFor(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	return drv
}

// waitUntil waits until cond holds of the set, re-checking at each change.
func (d *discovery) waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	limit := time.NewTimer(waitLimit)
	defer limit.Stop()
	for {
		changed := d.Changed()
		if cond() {
			return
		}
		select {
		case <-changed:
		case <-limit.C:
			t.Fatalf("not %s within %s; drivers: %v", what, waitLimit, d.Names())
		}
	}
}

// metric returns the value of the counter or gauge name with labels, and whether it exists.
func (d *discovery) metric(t *testing.T, name string, labels map[string]string) (float64, bool) {
	t.Helper()
	families, err := d.metrics.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			if !hasLabels(m, labels) {
				continue
			}
			switch {
			case m.GetCounter() != nil:
				return m.GetCounter().GetValue(), true
			case m.GetGauge() != nil:
				return m.GetGauge().GetValue(), true
			case m.GetHistogram() != nil:
				return float64(m.GetHistogram().GetSampleCount()), true
			}
		}
	}
	return 0, false
}

func hasLabels(m *dto.Metric, labels map[string]string) bool {
	n := 0
	for _, lp := range m.GetLabel() {
		v, ok := labels[lp.GetName()]
		if !ok {
			continue
		}
		if v != lp.GetValue() {
			return false
		}
		n++
	}
	return n == len(labels)
}

// mustRemove removes a file the test made.
func mustRemove(t *testing.T, path string) {
	t.Helper()
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
}
