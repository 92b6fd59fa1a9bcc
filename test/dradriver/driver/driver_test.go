package driver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2/ktesting"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/podgate/podgate/test/testnet"
)

const (
	testNode   = "node-1"
	testPrefix = "pgt" // not the default "pgnic", so the host check below means something
)

// env is one driver under test: its directories, its fake API server and a gRPC client on its
// DRA socket.
type env struct {
	ctx    context.Context
	cfg    Config
	client *fake.Clientset
	driver *Driver
	dra    drapb.DRAPluginClient
}

// startEnv starts a driver with cfg completed by fresh directories and a fake clientset holding
// the node and objs. Directories are under /tmp, because t.TempDir() paths can exceed the 108
// bytes of a unix socket path.
func startEnv(ctx context.Context, t *testing.T, cfg Config, objs ...*resourceapi.ResourceClaim) *env {
	t.Helper()
	// A bound on every call of the test, so that a hung driver fails the test instead of
	// running into go test's global timeout.
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	t.Cleanup(cancel)
	dir := shortTempDir(t)
	if cfg.RegistryDir == "" {
		cfg.RegistryDir = filepath.Join(dir, "reg")
	}
	if cfg.PluginDir == "" {
		cfg.PluginDir = filepath.Join(dir, "plugin")
	}
	if cfg.CDIDir == "" {
		cfg.CDIDir = filepath.Join(dir, "cdi")
	}
	if cfg.EventsFile == "" {
		cfg.EventsFile = filepath.Join(dir, "events.jsonl")
	}
	cfg.NodeName = testNode
	if cfg.Devices == 0 {
		cfg.Devices = 4
	}
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: testNode, UID: "node-uid"}})
	for _, obj := range objs {
		if _, err := client.ResourceV1().ResourceClaims(obj.Namespace).Create(ctx, obj, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	e := &env{ctx: ctx, client: client}
	e.restart(t, cfg)
	return e
}

// restart starts a (new) driver with cfg, after stopping the running one, if any.
func (e *env) restart(t *testing.T, cfg Config) {
	t.Helper()
	if e.driver != nil {
		e.driver.Stop()
	}
	cfg.KubeClient = e.client
	cfg.OnFatal = func(err error) { t.Errorf("fatal driver error: %v", err) }
	d, err := Start(e.ctx, cfg)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(d.Stop)
	e.cfg, e.driver = d.cfg, d
	conn, err := grpc.NewClient("unix://"+filepath.Join(cfg.PluginDir, "dra.sock"),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	e.dra = drapb.NewDRAPluginClient(conn)
}

func (e *env) prepare(t *testing.T, claims ...*resourceapi.ResourceClaim) (*drapb.NodePrepareResourcesResponse, error) {
	t.Helper()
	req := &drapb.NodePrepareResourcesRequest{}
	for _, c := range claims {
		req.Claims = append(req.Claims, &drapb.Claim{Namespace: c.Namespace, Name: c.Name, Uid: string(c.UID)})
	}
	return e.dra.NodePrepareResources(e.ctx, req)
}

// mustPrepare prepares one claim and returns its devices, failing on any error.
func (e *env) mustPrepare(t *testing.T, claim *resourceapi.ResourceClaim) []*drapb.Device {
	t.Helper()
	resp, err := e.prepare(t, claim)
	if err != nil {
		t.Fatalf("NodePrepareResources: %v", err)
	}
	res := resp.Claims[string(claim.UID)]
	if res == nil || res.Error != "" {
		t.Fatalf("NodePrepareResources for %s: %+v", claim.Name, res)
	}
	return res.Devices
}

func (e *env) mustUnprepare(t *testing.T, claim *resourceapi.ResourceClaim) {
	t.Helper()
	resp, err := e.dra.NodeUnprepareResources(e.ctx, &drapb.NodeUnprepareResourcesRequest{
		Claims: []*drapb.Claim{{Namespace: claim.Namespace, Name: claim.Name, Uid: string(claim.UID)}},
	})
	if err != nil {
		t.Fatalf("NodeUnprepareResources: %v", err)
	}
	if res := resp.Claims[string(claim.UID)]; res == nil || res.Error != "" {
		t.Fatalf("NodeUnprepareResources for %s: %+v", claim.Name, res)
	}
}

// allocatedClaim is a claim allocated, as the scheduler would, to devices of the test driver.
func allocatedClaim(name string, uid types.UID, pool string, devices ...string) *resourceapi.ResourceClaim {
	claim := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns1", Name: name, UID: uid},
		Status:     resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{}},
	}
	for _, dev := range devices {
		claim.Status.Allocation.Devices.Results = append(claim.Status.Allocation.Devices.Results,
			resourceapi.DeviceRequestAllocationResult{Request: "nics", Driver: DefaultDriverName, Pool: pool, Device: dev})
	}
	return claim
}

func TestPrepareUnprepare(t *testing.T) {
	requireRoot(t)
	_, ctx := ktesting.NewTestContext(t)
	nsPath, nsLinks := newNetns(t)
	claim := allocatedClaim("two-nics", "uid-a", testNode, "nic0", "nic2")
	other := allocatedClaim("wants-nic0", "uid-b", testNode, "nic0")
	e := startEnv(ctx, t, Config{NetNSPath: nsPath, InterfacePrefix: testPrefix}, claim, other)

	devices := e.mustPrepare(t, claim)
	var got []string
	for _, d := range devices {
		got = append(got, fmt.Sprintf("%s/%s %v", d.PoolName, d.DeviceName, d.CdiDeviceIds))
	}
	want := []string{
		"node-1/nic0 [net.podgate.test/nic=uid-a-nic0]",
		"node-1/nic2 [net.podgate.test/nic=uid-a-nic2]",
	}
	if !slices.Equal(got, want) {
		t.Errorf("prepared devices = %q, want %q", got, want)
	}
	for _, name := range []string{"pgt0", "pgt0p", "pgt2", "pgt2p"} {
		requireLinkUp(t, nsLinks, name)
	}
	for _, name := range []string{"pgt1", "pgt3"} {
		requireNoLink(t, nsLinks, name)
	}
	requireNoLink(t, hostLinks(t), "pgt0") // the driver works in its namespace only
	cdiSpec := filepath.Join(e.cfg.CDIDir, "net.podgate.test-uid-a.json")
	if data, err := os.ReadFile(cdiSpec); err != nil || !strings.Contains(string(data), "PODGATE_NET_NIC2=pgt2") {
		t.Errorf("CDI spec %s: %v\n%s", cdiSpec, err, data)
	}

	// The kubelet prepares again what podgate prepared: success, nothing created.
	if again := e.mustPrepare(t, claim); len(again) != 2 {
		t.Errorf("repeated prepare returned %d devices, want 2", len(again))
	}
	requireLinkUp(t, nsLinks, "pgt0")

	// A second claim on a prepared device is refused, naming the holder.
	resp, err := e.prepare(t, other)
	if err != nil {
		t.Fatal(err)
	}
	if msg := resp.Claims["uid-b"].GetError(); !strings.Contains(msg, "nic0 is prepared for claim ns1/two-nics") {
		t.Errorf("conflicting prepare: error %q, want one naming ns1/two-nics", msg)
	}

	e.mustUnprepare(t, claim)
	for _, name := range []string{"pgt0", "pgt0p", "pgt2", "pgt2p"} {
		requireNoLink(t, nsLinks, name)
	}
	if _, err := os.Stat(cdiSpec); !os.IsNotExist(err) {
		t.Errorf("CDI spec after unprepare: %v, want not-exist", err)
	}
	e.mustUnprepare(t, claim) // idempotent

	stats := e.driver.Stats()
	if stats.PrepareCalls != 3 || stats.ClaimPrepares != 2 || stats.ClaimPrepareErrors != 1 ||
		stats.UnprepareCalls != 2 || stats.ClaimUnprepares != 2 || len(stats.Prepared) != 0 {
		t.Errorf("stats = %+v", stats)
	}
	events, err := ReadEvents(e.cfg.EventsFile)
	if err != nil {
		t.Fatal(err)
	}
	var summary []string
	for _, ev := range events {
		summary = append(summary, fmt.Sprintf("%s %s %v created=%v err=%t", ev.Op, ev.Name, ev.Interfaces, ev.Created, ev.Error != ""))
		// The test process itself is the gRPC client here, as the kubelet or podgate would be.
		if ev.Caller.PID != int32(os.Getpid()) || ev.Caller.Comm != testComm(t) {
			t.Errorf("event caller = %+v, want pid %d comm %q", ev.Caller, os.Getpid(), testComm(t))
		}
	}
	if n := stats.PrepareCallsByCaller[testComm(t)]; n != 3 || len(stats.PrepareCallsByCaller) != 1 {
		t.Errorf("prepare calls by caller = %v, want %s: 3", stats.PrepareCallsByCaller, testComm(t))
	}
	wantSummary := []string{
		"prepare two-nics [pgt0 pgt2] created=[pgt0 pgt2] err=false",
		"prepare two-nics [pgt0 pgt2] created=[] err=false",
		"prepare wants-nic0 [] created=[] err=true",
		"unprepare two-nics [pgt0 pgt2] created=[] err=false",
		"unprepare two-nics [] created=[] err=false",
	}
	if !slices.Equal(summary, wantSummary) {
		t.Errorf("events:\n%s\nwant:\n%s", strings.Join(summary, "\n"), strings.Join(wantSummary, "\n"))
	}
}

// TestAttachedDevice covers a device whose interface was moved into a pod's namespace (what
// podgate's attach does): a repeated prepare is success and unprepare still removes the pair.
func TestAttachedDevice(t *testing.T) {
	requireRoot(t)
	_, ctx := ktesting.NewTestContext(t)
	nsPath, nsLinks := newNetns(t)
	podPath, podLinks := newNetns(t)
	claim := allocatedClaim("attached", "uid-c", testNode, "nic1")
	e := startEnv(ctx, t, Config{NetNSPath: nsPath, InterfacePrefix: testPrefix}, claim)

	e.mustPrepare(t, claim)
	moveLink(t, nsLinks, "pgt1", podPath, podLinks)
	requireNoLink(t, nsLinks, "pgt1")
	e.mustPrepare(t, claim)
	requireNoLink(t, nsLinks, "pgt1") // not created again beside the attached one
	requireLinkUp(t, podLinks, "pgt1")

	e.mustUnprepare(t, claim)
	requireNoLink(t, nsLinks, "pgt1p")
	requireNoLink(t, podLinks, "pgt1")
}

// TestRestartUnprepares checks that the checkpoint lets a new driver process unprepare what the
// previous one prepared.
func TestRestartUnprepares(t *testing.T) {
	requireRoot(t)
	_, ctx := ktesting.NewTestContext(t)
	nsPath, nsLinks := newNetns(t)
	claim := allocatedClaim("survivor", "uid-d", testNode, "nic3")
	e := startEnv(ctx, t, Config{NetNSPath: nsPath, InterfacePrefix: testPrefix}, claim)
	e.mustPrepare(t, claim)

	e.restart(t, e.cfg)
	if got := e.driver.Stats().Prepared["uid-d"]; got.Name != "survivor" || len(got.Devices) != 1 {
		t.Fatalf("restarted driver's prepared claim = %+v", got)
	}
	requireLinkUp(t, nsLinks, "pgt3")
	e.mustUnprepare(t, claim)
	requireNoLink(t, nsLinks, "pgt3")
	requireNoLink(t, nsLinks, "pgt3p")
}

// TestPrepareRefused covers claims the driver or the kubeletplugin helper refuse before any
// interface is touched, so it runs without root in the test's own namespace.
func TestPrepareRefused(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	stored := []*resourceapi.ResourceClaim{
		allocatedClaim("replaced", "uid-new", testNode, "nic0"),
		allocatedClaim("unknown-device", "uid-u", testNode, "nic9"),
		allocatedClaim("other-pool", "uid-p", "node-2", "nic0"),
		{ObjectMeta: metav1.ObjectMeta{Namespace: "ns1", Name: "unallocated", UID: "uid-n"}},
	}
	e := startEnv(ctx, t, Config{InterfacePrefix: testPrefix}, stored...)

	for _, tc := range []struct {
		name, uid string
		rpcErr    string // the helper fails the whole call
		claimErr  string // the driver fails the claim
	}{
		// The helper GETs the claim and compares its UID with the kubelet's.
		{name: "replaced", uid: "uid-old", rpcErr: "claim ns1/replaced got replaced"},
		{name: "missing", uid: "uid-m", rpcErr: `"missing" not found`},
		{name: "unallocated", uid: "uid-n", rpcErr: "claim ns1/unallocated not allocated"},
		{name: "unknown-device", uid: "uid-u", claimErr: `unknown device "nic9"`},
		{name: "other-pool", uid: "uid-p", claimErr: `pool "node-2" is not this node's pool "node-1"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			claim := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns1", Name: tc.name, UID: types.UID(tc.uid)}}
			resp, err := e.prepare(t, claim)
			if tc.rpcErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.rpcErr) {
					t.Fatalf("NodePrepareResources error = %v, want %q", err, tc.rpcErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if msg := resp.Claims[tc.uid].GetError(); !strings.Contains(msg, tc.claimErr) {
				t.Errorf("claim error = %q, want %q", msg, tc.claimErr)
			}
		})
	}
	if s := e.driver.Stats(); s.PrepareCalls != 2 || s.ClaimPrepareErrors != 2 || len(s.Prepared) != 0 {
		t.Errorf("stats = %+v, want 2 calls reaching the driver, both claims failed", s)
	}

	// The same counters as JSON, as --status-address serves them.
	rec := httptest.NewRecorder()
	e.driver.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/stats", nil))
	var served Stats
	if err := json.Unmarshal(rec.Body.Bytes(), &served); err != nil || rec.Code != http.StatusOK {
		t.Fatalf("GET /stats: %d %v: %s", rec.Code, err, rec.Body)
	}
	if served.PrepareCalls != 2 || served.ClaimPrepareErrors != 2 {
		t.Errorf("GET /stats = %+v", served)
	}
}

// TestRegisterAndPublish checks the driver's registration socket and its ResourceSlice, as the
// kubelet and the scheduler would see them.
func TestRegisterAndPublish(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	dir := shortTempDir(t)
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: testNode, UID: "node-uid"}})
	// Watch before the driver starts, so the slice's creation cannot be missed.
	w, err := client.ResourceV1().ResourceSlices().Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	d, err := Start(ctx, Config{
		NodeName: testNode, KubeClient: client, Devices: 3,
		RegistryDir: filepath.Join(dir, "reg"), PluginDir: filepath.Join(dir, "plugin"),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Stop)

	conn, err := grpc.NewClient("unix://"+filepath.Join(dir, "reg", DefaultDriverName+"-reg.sock"),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	info, err := registerapi.NewRegistrationClient(conn).GetInfo(ctx, &registerapi.InfoRequest{})
	if err != nil {
		t.Fatalf("GetInfo: %v", err)
	}
	if info.Type != registerapi.DRAPlugin || info.Name != DefaultDriverName ||
		info.Endpoint != filepath.Join(dir, "plugin", "dra.sock") || !slices.Contains(info.SupportedVersions, drapb.DRAPluginService) {
		t.Errorf("GetInfo = %+v", info)
	}

	var slice *resourceapi.ResourceSlice
	for slice == nil {
		select {
		case ev := <-w.ResultChan():
			slice, _ = ev.Object.(*resourceapi.ResourceSlice)
		case <-ctx.Done():
			t.Fatal("no ResourceSlice published")
		}
	}
	if slice.Spec.Driver != DefaultDriverName || slice.Spec.Pool.Name != testNode || ptrValue(slice.Spec.NodeName) != testNode {
		t.Errorf("slice spec: driver %q pool %q node %q", slice.Spec.Driver, slice.Spec.Pool.Name, ptrValue(slice.Spec.NodeName))
	}
	var devices []string
	for _, dev := range slice.Spec.Devices {
		devices = append(devices, dev.Name+"="+ptrValue(dev.Attributes[InterfaceNameAttribute].StringValue))
	}
	if want := []string{"nic0=pgnic0", "nic1=pgnic1", "nic2=pgnic2"}; !slices.Equal(devices, want) {
		t.Errorf("slice devices = %q, want %q", devices, want)
	}

	// Stopping removes both sockets, so that the kubelet forgets the driver.
	d.Stop()
	for _, sock := range []string{info.Endpoint, filepath.Join(dir, "reg", DefaultDriverName+"-reg.sock")} {
		if _, err := os.Stat(sock); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s after Stop: %v, want not-exist", sock, err)
		}
	}
}

func TestInventory(t *testing.T) {
	devs, err := Inventory(2, "pgnic")
	if err != nil {
		t.Fatal(err)
	}
	want := []Device{{"nic0", "pgnic0", "pgnic0p"}, {"nic1", "pgnic1", "pgnic1p"}}
	if !slices.Equal(devs, want) {
		t.Errorf("Inventory = %+v, want %+v", devs, want)
	}
	for _, tc := range []struct {
		n      int
		prefix string
	}{{0, "pgnic"}, {1, ""}, {1, "abcdefghijklmn"}} {
		if _, err := Inventory(tc.n, tc.prefix); err == nil {
			t.Errorf("Inventory(%d, %q) succeeded, want error", tc.n, tc.prefix)
		}
	}
}

func TestStateRoundTrip(t *testing.T) {
	dir := t.TempDir()
	empty, err := loadState(dir)
	if err != nil || len(empty) != 0 {
		t.Fatalf("loadState of empty dir = %v, %v", empty, err)
	}
	in := map[types.UID]PreparedClaim{"u1": {Namespace: "ns", Name: "c", Devices: []PreparedDevice{
		{Device: Device{"nic0", "pgnic0", "pgnic0p"}, Request: "r", Pool: "p", CDIDeviceID: "x/nic=u1-nic0"},
	}}}
	if err := saveState(dir, in); err != nil {
		t.Fatal(err)
	}
	out, err := loadState(dir)
	if err != nil {
		t.Fatal(err)
	}
	a, _ := json.Marshal(in)
	b, _ := json.Marshal(out)
	if string(a) != string(b) {
		t.Errorf("round trip: %s, want %s", b, a)
	}
	if err := os.WriteFile(filepath.Join(dir, stateFileName), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := loadState(dir); err == nil {
		t.Error("loadState of a corrupt file succeeded")
	}
}

// testComm is the command name of the test process, as the driver reads it from /proc.
func testComm(t *testing.T) string {
	t.Helper()
	comm, err := os.ReadFile("/proc/self/comm")
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(comm))
}

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces and veth pairs")
	}
}

func shortTempDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("/tmp", "pgdra")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// newNetns creates a named network namespace for the test and returns its path and a netlink
// handle inside it. Both go away when the test ends.
func newNetns(t *testing.T) (string, *netlink.Handle) {
	t.Helper()
	ns := testnet.New(t, "pgdrv")
	return ns.Path, ns.Handle
}

func hostLinks(t *testing.T) *netlink.Handle {
	t.Helper()
	h, err := netlink.NewHandle()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	return h
}

func requireLinkUp(t *testing.T, h *netlink.Handle, name string) {
	t.Helper()
	link, err := h.LinkByName(name)
	if err != nil {
		t.Errorf("interface %s: %v", name, err)
		return
	}
	if link.Attrs().Flags&net.FlagUp == 0 {
		t.Errorf("interface %s is down", name)
	}
}

func requireNoLink(t *testing.T, h *netlink.Handle, name string) {
	t.Helper()
	if _, err := h.LinkByName(name); err == nil {
		t.Errorf("interface %s exists, want none", name)
	} else if !errors.As(err, new(netlink.LinkNotFoundError)) {
		t.Errorf("interface %s: %v", name, err)
	}
}

// moveLink moves the interface name into the namespace at toPath, whose handle is to, and sets it
// up there, as an attach would.
func moveLink(t *testing.T, from *netlink.Handle, name, toPath string, to *netlink.Handle) {
	t.Helper()
	link, err := from.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	ns, err := netns.GetFromPath(toPath)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	if err := from.LinkSetNsFd(link, int(ns)); err != nil {
		t.Fatalf("move %s: %v", name, err)
	}
	moved, err := to.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	if err := to.LinkSetUp(moved); err != nil {
		t.Fatal(err)
	}
}

func ptrValue[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}
