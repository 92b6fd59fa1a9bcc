package dra_test

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	drapbv1 "k8s.io/kubelet/pkg/apis/dra/v1"
	drapbv1beta1 "k8s.io/kubelet/pkg/apis/dra/v1beta1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/podgate/podgate/dra"
	"github.com/podgate/podgate/dra/dratest"
)

func TestDriverAppearsAndGoes(t *testing.T) {
	n := newNode(t)
	d := startDiscovery(t, n)
	td := startDriver(t, n, "net.example.com")

	drv := d.waitFor(t, "net.example.com")
	if drv.Name() != "net.example.com" || drv.Endpoint() != td.Endpoint || drv.RegistrationSocket() != td.RegistrationSocket {
		t.Errorf("driver = %s at %s from %s, want net.example.com at %s from %s", drv.Name(), drv.Endpoint(), drv.RegistrationSocket(), td.Endpoint, td.RegistrationSocket)
	}
	wantVersions := []string{drapbv1.DRAPluginService, drapbv1beta1.DRAPluginService}
	if got := drv.Versions(); !slices.Equal(got, wantVersions) {
		t.Errorf("Versions() = %q, want %q", got, wantVersions)
	}
	if drv.Service() != drapbv1.DRAPluginService {
		t.Errorf("Service() = %q, want %q", drv.Service(), drapbv1.DRAPluginService)
	}
	if got := d.Names(); !slices.Equal(got, []string{"net.example.com"}) {
		t.Errorf("Names() = %q", got)
	}
	if v, _ := d.metric(t, "podgate_dra_drivers", map[string]string{"driver": "net.example.com"}); v != 1 {
		t.Errorf("podgate_dra_drivers{driver=net.example.com} = %v, want 1", v)
	}

	// The driver stops: its listener's close removes the registration socket.
	td.StopRegistration()
	d.waitUntil(t, "forgotten", func() bool { _, ok := d.Get("net.example.com"); return !ok })
	if got := d.Names(); len(got) != 0 {
		t.Errorf("Names() = %q after the driver left", got)
	}
	if _, ok := d.metric(t, "podgate_dra_drivers", map[string]string{"driver": "net.example.com"}); ok {
		t.Error("podgate_dra_drivers still has the driver that left")
	}
	_, err := d.Lookup("net.example.com")
	var derr *dra.Error
	if !errors.As(err, &derr) || derr.Driver != "net.example.com" || !errdefs.IsUnavailable(err) {
		t.Errorf("Lookup after the driver left = %v, want an Unavailable *dra.Error naming it", err)
	}
}

func TestInitialScan(t *testing.T) {
	n := newNode(t)
	startDriver(t, n, "a.example.com")
	startDriver(t, n, "b.example.com")
	// A stale socket (its driver died without removing it) must not hold up the first sync.
	stale := staleSocket(t, filepath.Join(n.registry, "dead.example.com-reg.sock"))

	d := startDiscovery(t, n, dra.WithGetInfoTimeout(200*time.Millisecond))
	select {
	case <-d.Synced():
	case <-time.After(waitLimit):
		t.Fatalf("not synced within %s", waitLimit)
	}
	// No waiting: what was serving at start is known once synced.
	if got := d.Names(); !slices.Equal(got, []string{"a.example.com", "b.example.com"}) {
		t.Errorf("Names() after sync = %q", got)
	}
	if d.trace.count("getinfo_failed", stale) == 0 {
		t.Errorf("the stale socket was not asked before sync")
	}
}

// TestIgnored covers registration sockets that are no DRA driver of podgate's: nothing is
// registered, and nothing is counted as an error, except for a DRA registration that cannot be
// used.
func TestIgnored(t *testing.T) {
	tests := []struct {
		name      string
		driver    string
		fake      []dratest.Option
		opts      []dra.Option
		event     string
		wantError bool // counted as invalid
	}{
		{name: "CSI plugin", driver: "csi.example.com", fake: []dratest.Option{dratest.WithPluginType(registerapi.CSIPlugin), dratest.WithVersions("1.0.0")}, event: "ignored"},
		{name: "device plugin", driver: "dp.example.com", fake: []dratest.Option{dratest.WithPluginType(registerapi.DevicePlugin), dratest.WithVersions("v1beta1")}, event: "ignored"},
		{name: "driver not in dra.drivers", driver: "other.example.com", opts: []dra.Option{dra.WithDriverNames("net.example.com")}, event: "ignored"},
		{name: "hidden socket", driver: "net.example.com", fake: []dratest.Option{dratest.WithSocketNames(".net.example.com-reg.sock", "hidden.sock")}, event: "skipped"},
		{name: "no DRA service podgate speaks", driver: "old.example.com", fake: []dratest.Option{dratest.WithVersions("v1alpha3.Node")}, event: "invalid", wantError: true},
		{name: "no versions", driver: "old.example.com", fake: []dratest.Option{dratest.WithVersions()}, event: "invalid", wantError: true},
		{name: "no driver name", driver: "", fake: []dratest.Option{dratest.WithSocketNames("anon-reg.sock", "anon.sock")}, event: "invalid", wantError: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n := newNode(t)
			d := startDiscovery(t, n, tt.opts...)
			td := startDriver(t, n, tt.driver, tt.fake...)
			d.trace.wait(t, tt.event, td.RegistrationSocket, 1)

			// A proper driver started afterwards is found: the watch goes on.
			startDriver(t, n, "net.example.com")
			d.waitFor(t, "net.example.com")
			if got := d.Names(); !slices.Equal(got, []string{"net.example.com"}) {
				t.Errorf("Names() = %q, want only net.example.com", got)
			}
			if tt.event == "skipped" && td.Registration().GetInfoCalls() != 0 {
				t.Errorf("a hidden socket was asked GetInfo %d times", td.Registration().GetInfoCalls())
			}
			invalid, _ := d.metric(t, "podgate_dra_driver_discovery_errors_total", map[string]string{"reason": "invalid"})
			if (invalid > 0) != tt.wantError {
				t.Errorf("discovery errors{reason=invalid} = %v, want counted: %v", invalid, tt.wantError)
			}
			if got, _ := d.metric(t, "podgate_dra_driver_discovery_errors_total", map[string]string{"reason": "getinfo"}); got != 0 {
				t.Errorf("discovery errors{reason=getinfo} = %v, want 0", got)
			}
		})
	}
}

// TestUnansweredSocket covers registration sockets that do not answer GetInfo: each is a log
// line and a count, is asked again after a backoff, and is found once it answers, without
// Run failing (startDiscovery checks that Run ends with nil).
func TestUnansweredSocket(t *testing.T) {
	const name = "net.example.com"
	info := func(n *node) *registerapi.PluginInfo {
		return &registerapi.PluginInfo{Type: registerapi.DRAPlugin, Name: name, Endpoint: filepath.Join(n.plugins, name+".sock"),
			SupportedVersions: []string{drapbv1.DRAPluginService}}
	}
	tests := []struct {
		name string
		// broken makes path a registration socket that does not answer and returns the fix.
		broken func(t *testing.T, n *node, path string) (fix func())
	}{
		{
			name: "stale socket file, nobody listening",
			broken: func(t *testing.T, n *node, path string) func() {
				staleSocket(t, path)
				return func() {
					mustRemove(t, path)
					dratest.NewRegistration(info(n)).Serve(t, path)
				}
			},
		},
		{
			name: "GetInfo fails",
			broken: func(t *testing.T, n *node, path string) func() {
				r := dratest.NewRegistration(info(n))
				r.SetErr(errors.New("not ready"))
				r.Serve(t, path)
				// No file change: the backoff alone brings the retry.
				return func() { r.SetErr(nil) }
			},
		},
		{
			name: "listening, never answering",
			broken: func(t *testing.T, n *node, path string) func() {
				stop := silentSocket(t, path)
				return func() {
					stop()
					dratest.NewRegistration(info(n)).Serve(t, path)
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n := newNode(t)
			startDriver(t, n, name, dratest.WithServices(drapbv1.DRAPluginService), dratest.WithoutRegistration())
			d := startDiscovery(t, n, dra.WithGetInfoTimeout(200*time.Millisecond))
			path := filepath.Join(n.registry, name+"-reg.sock")
			fix := tt.broken(t, n, path)

			// Asked, failed, asked again after the backoff.
			d.trace.wait(t, "getinfo_failed", path, 2)
			if got, _ := d.metric(t, "podgate_dra_driver_discovery_errors_total", map[string]string{"reason": "getinfo"}); got < 2 {
				t.Errorf("discovery errors{reason=getinfo} = %v, want ≥ 2", got)
			}
			if _, ok := d.Get(name); ok {
				t.Fatal("a driver whose socket does not answer is known")
			}

			fix()
			drv := d.waitFor(t, name)
			if drv.Service() != drapbv1.DRAPluginService {
				t.Errorf("Service() = %q", drv.Service())
			}
		})
	}
}

// TestRetryOnFileChange: a socket that did not answer is asked again as soon as its file
// changes, whatever the backoff.
func TestRetryOnFileChange(t *testing.T) {
	const name = "net.example.com"
	n := newNode(t)
	drv := startDriver(t, n, name, dratest.WithServices(drapbv1.DRAPluginService), dratest.WithoutRegistration())
	d := startDiscovery(t, n, dra.WithRetryBackoff(time.Hour, time.Hour))
	path := filepath.Join(n.registry, name+"-reg.sock")
	r := dratest.NewRegistration(&registerapi.PluginInfo{Type: registerapi.DRAPlugin, Name: name,
		Endpoint: drv.Endpoint, SupportedVersions: []string{drapbv1.DRAPluginService}})
	r.SetErr(errors.New("not ready"))
	r.Serve(t, path)
	d.trace.wait(t, "getinfo_failed", path, 1)

	r.SetErr(nil)
	if err := os.Chmod(path, 0o700); err != nil {
		t.Fatal(err)
	}
	d.waitFor(t, name)
}

// TestRollingUpdate: two registration sockets for one driver, as during a rolling update of
// the driver's DaemonSet. The newer serves; when it goes, the older serves again.
func TestRollingUpdate(t *testing.T) {
	const name = "net.example.com"
	n := newNode(t)
	d := startDiscovery(t, n)
	older := startDriver(t, n, name, dratest.WithSocketNames(name+"-old-reg.sock", "old.sock"))
	if drv := d.waitFor(t, name); drv.Endpoint() != older.Endpoint {
		t.Fatalf("endpoint %s, want %s", drv.Endpoint(), older.Endpoint)
	}
	newer := startDriver(t, n, name, dratest.WithSocketNames(name+"-new-reg.sock", "new.sock"))
	d.waitUntil(t, "on the newer endpoint", func() bool { drv, ok := d.Get(name); return ok && drv.Endpoint() == newer.Endpoint })

	newer.Stop()
	d.waitUntil(t, "back on the older endpoint", func() bool { drv, ok := d.Get(name); return ok && drv.Endpoint() == older.Endpoint })
	claims := []dra.Claim{{Namespace: "default", Name: "c", UID: "uid-c"}}
	if _, err := mustGet(t, d, name).Prepare(context.Background(), claims); err != nil {
		t.Fatalf("Prepare on the older endpoint: %v", err)
	}
	if got := older.Calls(); !slices.Equal(got, []string{"prepare default/c"}) {
		t.Errorf("the older driver got %q, want the claim prepared", got)
	}

	older.StopRegistration()
	d.waitUntil(t, "forgotten", func() bool { _, ok := d.Get(name); return !ok })
}

// TestEndpointChanges: a driver that comes back with another DRA endpoint is called there,
// on a new connection.
func TestEndpointChanges(t *testing.T) {
	const name = "net.example.com"
	n := newNode(t)
	d := startDiscovery(t, n)
	first := startDriver(t, n, name, dratest.WithSocketNames(name+"-reg.sock", "first.sock"))
	claims := []dra.Claim{{Namespace: "default", Name: "c", UID: "uid-c"}}
	if _, err := d.waitFor(t, name).Prepare(context.Background(), claims); err != nil {
		t.Fatalf("Prepare on the first endpoint: %v", err)
	}
	first.Stop()
	second := startDriver(t, n, name, dratest.WithSocketNames(name+"-reg.sock", "second.sock"))
	d.waitUntil(t, "on the second endpoint", func() bool { drv, ok := d.Get(name); return ok && drv.Endpoint() == second.Endpoint })
	if _, err := mustGet(t, d, name).Prepare(context.Background(), claims); err != nil {
		t.Fatalf("Prepare on the second endpoint: %v", err)
	}
	if want := []string{"prepare default/c"}; !slices.Equal(first.Calls(), want) || !slices.Equal(second.Calls(), want) {
		t.Errorf("calls: first endpoint %q, second %q; want %q each", first.Calls(), second.Calls(), want)
	}
}

// TestSubdirectory: as the kubelet's watcher, sockets in sub-directories count; a directory
// moved away takes its sockets' registrations with it.
func TestSubdirectory(t *testing.T) {
	n := newNode(t)
	d := startDiscovery(t, n)
	sub := filepath.Join(n.registry, "sub")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	subNode := &node{registry: sub, plugins: n.plugins}
	// The directory's watch may be added after the socket appears; the scan on its creation
	// catches it either way.
	startDriver(t, subNode, "net.example.com")
	d.waitFor(t, "net.example.com")

	if err := os.Rename(sub, filepath.Join(n.plugins, "moved")); err != nil {
		t.Fatal(err)
	}
	d.waitUntil(t, "forgotten", func() bool { _, ok := d.Get("net.example.com"); return !ok })
}

func TestRunTwice(t *testing.T) {
	n := newNode(t)
	d := startDiscovery(t, n)
	<-d.Synced() // the first Run is under way
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // should the check fail, this Run ends anyway
	if err := d.Run(ctx); err == nil {
		t.Error("a second Run returned nil")
	}
}

func TestRunUnwatchableDir(t *testing.T) {
	n := newNode(t)
	file := filepath.Join(n.registry, "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	d := dra.NewDrivers(dra.WithPluginRegistryDir(filepath.Join(file, "registry")))
	if err := d.Run(context.Background()); err == nil {
		t.Error("Run on a registry under a file returned nil")
	}
}

func mustGet(t *testing.T, d *discovery, name string) *dra.Driver {
	t.Helper()
	drv, err := d.Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	return drv
}

// staleSocket leaves a socket file at path with nobody listening, as a driver that died
// leaves it.
func staleSocket(t *testing.T, path string) string {
	t.Helper()
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	l.SetUnlinkOnClose(false)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mustRemove(t, path) })
	return path
}

// silentSocket listens at path and accepts connections but never says a word on them, until
// stop (or the test's end).
func silentSocket(t *testing.T, path string) (stop func()) {
	t.Helper()
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	accepted := make(chan struct{})
	go func() {
		defer close(accepted)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	stop = sync.OnceFunc(func() {
		_ = l.Close() // removes the socket file
		<-accepted
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	})
	t.Cleanup(stop)
	return stop
}
