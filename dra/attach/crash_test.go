package attach_test

// Attach and give back through the sandbox pipeline, crashes at every step of an attach, and
// start-up settling what they left.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vishvananda/netlink"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/utils/ptr"

	"github.com/podgate/podgate/cri/pipeline"
	"github.com/podgate/podgate/cri/registry"
	"github.com/podgate/podgate/dra"
	"github.com/podgate/podgate/dra/attach"
	"github.com/podgate/podgate/dra/dratest/rig"
	"github.com/podgate/podgate/dra/manager"
	"github.com/podgate/podgate/test/kubefake"
	"github.com/podgate/podgate/test/testnet"
)

// attachCrash is where TestDRAAttachCrashAtEveryStepConverges crashes podgate in a device's
// attach.
type attachCrash string

const (
	crashAfterIntent  attachCrash = "intent written"   // the intent is on disk, the device not moved
	crashAfterMove    attachCrash = "device moved"     // the device is in the pod, not recorded as attached
	crashAfterRecord  attachCrash = "attached written" // the sandbox's record holds the device
	crashAfterFailure attachCrash = "attach failed"    // the attach failed, nothing moved; the intent's drop not on disk
)

// Where the sandbox is when podgate starts again.
const (
	sandboxRuns       = "sandbox runs"
	sandboxStopsFirst = "sandbox runs, stopped before the start-up settles" // the intent is the stop's to give back
	sandboxGone       = "sandbox gone, netns kept"                          // removed, its namespace still pinned
	sandboxNoNets     = "sandbox and netns gone"                            // the veth end went with the namespace
)

// TestDRAAttachCrashAtEveryStepConverges: podgate crashes in a DRA network device's attach
// after the intent's write, after the move, after the sandbox's record with the device is
// written, and after a failed attach whose intent's drop did not reach the disk; it starts
// again from the checkpoint the crash left, with the sandbox still running, removed with its
// network namespace still there, or removed with it; or the kubelet stops and removes the
// sandbox before the start-up has settled what the crash left. Once settled, nothing is left as
// an intent; the device is either recorded as attached to the running sandbox (in the pod,
// configured) or back on the host as it was; the sandbox's stop (twice) and remove give it back
// exactly once in all.
func TestDRAAttachCrashAtEveryStepConverges(t *testing.T) {
	testnet.RequireNetAdmin(t)
	for _, crash := range []attachCrash{crashAfterIntent, crashAfterMove, crashAfterRecord, crashAfterFailure} {
		for _, where := range []string{sandboxRuns, sandboxStopsFirst, sandboxGone, sandboxNoNets} {
			if crash == crashAfterFailure && (where == sandboxRuns || where == sandboxStopsFirst) {
				continue // the failed start removed the sandbox
			}
			t.Run(string(crash)+"/"+where, func(t *testing.T) {
				testAttachCrash(t, crash, where)
			})
		}
	}
}

func testAttachCrash(t *testing.T, crash attachCrash, where string) {
	ctx := t.Context()
	podNetns := podNetns(t)
	hostIf, wantHost := attachTestHostLink(t)
	pod := rig.Pod("a", "net")
	claim := rig.Claim("net", pod)
	claim.Status.Allocation.Devices.Config = []resourceapi.DeviceAllocationConfiguration{{
		Source: resourceapi.AllocationConfigSourceClaim,
		DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
			Driver: rig.Driver, Parameters: k8sruntime.RawExtension{Raw: []byte(`{"interface":{"name":"net1","mtu":1300,"addresses":["192.0.2.10/24"]}}`)},
		}},
	}}
	slice := &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: "net-slice"}, Spec: resourceapi.ResourceSliceSpec{
		Driver: rig.Driver, NodeName: ptr.To("node-a"), Pool: resourceapi.ResourcePool{Name: "pool", Generation: 1, ResourceSliceCount: 1},
		Devices: []resourceapi.Device{{Name: "dev-net", Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
			dra.DefaultInterfaceNameAttribute: {StringValue: ptr.To(hostIf)},
		}}},
	}}
	links := &crashingLinks{at: crash, crashed: make(chan struct{})}
	dr := newRig(t, attachOptions(podNetns, links), pod, claim, slice)
	dr.Registry.SetWriteDelay(time.Hour) // the checkpoint holds only what must be written at once
	cpPath := filepath.Join(dr.StateDir, registry.CheckpointFile)
	links.cpPath = cpPath
	hostIfs := dr.HostIfs
	hostIfsDone := make(chan struct{})
	go func() {
		defer close(hostIfsDone)
		hostIfs.Run(ctx)
	}()
	t.Cleanup(func() { <-hostIfsDone })

	// The first podgate, until the crash.
	var startErr error
	started := make(chan struct{})
	go func() {
		defer close(started)
		_, startErr = dr.RunPod(t, pod)
	}()
	// Held at the crash (the attach waits for the test's end), or ended.
	t.Cleanup(func() { <-started; dr.Registry.Flush() })
	switch crash {
	case crashAfterIntent, crashAfterMove:
		select {
		case <-links.crashed:
		case <-started:
			t.Fatalf("sandbox started without reaching the crash: %v", startErr)
		}
	case crashAfterRecord:
		<-started
		if startErr != nil {
			t.Fatal(startErr)
		}
		links.crash()
	case crashAfterFailure:
		<-started
		if startErr == nil {
			t.Fatal("sandbox started although its attach failed")
		}
		links.crash()
	}
	if links.err != nil {
		t.Fatal(links.err)
	}
	crashed := registry.CheckpointData{}
	if err := readCheckpointBytes(links.snapshot, &crashed); err != nil {
		t.Fatal(err)
	}
	crashedIntents := onDiskIntents(t, crashed)
	var id string
	switch {
	case len(crashedIntents) == 1:
		id = crashedIntents[0].SandboxID
	case len(crashed.Sandboxes) == 1:
		id = crashed.Sandboxes[0].ID
	default:
		t.Fatalf("checkpoint at the crash: %+v; want the attach's intent or the sandbox's record", crashed)
	}
	if want := crash != crashAfterRecord; (len(crashedIntents) == 1) != want {
		t.Fatalf("checkpoint at the crash holds intents %+v; want one: %t", crashedIntents, want)
	}

	// While podgate is down.
	switch where {
	case sandboxGone, sandboxNoNets:
		if crash != crashAfterFailure {
			if err := dr.Runtime.RuntimeService.StopPodSandbox(ctx, id); err != nil {
				t.Fatal(err)
			}
			if err := dr.Runtime.RuntimeService.RemovePodSandbox(ctx, id); err != nil {
				t.Fatal(err)
			}
		}
		if where == sandboxNoNets {
			testnet.IP(t, "netns", "del", filepath.Base(podNetns))
		}
	}

	// The restart: a new registry from the checkpoint the crash left, new DRA stages, the
	// rebuild from the runtime, and what follows it: the left intents settled.
	dr.Registry.Flush()
	if err := os.WriteFile(cpPath, links.snapshot, 0o600); err != nil {
		t.Fatal(err)
	}
	d, at, restarted, intents, counted := restartDRA(t, dr, hostIfs, hostIf, podNetns)
	if _, _, _, err := restarted.Rebuild(ctx, dr.RuntimeClient); err != nil {
		t.Fatal(err)
	}
	// The kubelet stops the sandbox (twice: Stop is idempotent) and removes it.
	stopAndRemove := func() {
		t.Helper()
		p := pipeline.NewRunner(rig.Stages(pipeline.NewCore(restarted, dr.RuntimeClient, nil), d, at), restarted, prometheus.NewRegistry())
		// containerd's stop tears the pod's network namespace down, and a veth end in it.
		stop := func(ctx context.Context, req *runtimeapi.StopPodSandboxRequest) (*runtimeapi.StopPodSandboxResponse, error) {
			resp, err := dr.RuntimeClient.StopPodSandbox(ctx, req)
			if _, serr := os.Stat(podNetns); err == nil && serr == nil {
				testnet.IP(t, "netns", "del", filepath.Base(podNetns))
			}
			return resp, err
		}
		remove := func(ctx context.Context, req *runtimeapi.RemovePodSandboxRequest) (*runtimeapi.RemovePodSandboxResponse, error) {
			return dr.RuntimeClient.RemovePodSandbox(ctx, req)
		}
		for range 2 {
			if _, err := p.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: id}, stop); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := p.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: id}, remove); err != nil {
			t.Fatal(err)
		}
	}
	if where == sandboxStopsFirst {
		stopAndRemove()
	}
	at.Settle(ctx)

	if left := intents.LeftAttaches(); len(left) != 0 {
		t.Errorf("left after settling: %+v", left)
	}
	rec, running := restarted.Sandbox(id)
	attached := intents.Attached(id)
	moved := crash == crashAfterMove || crash == crashAfterRecord
	switch {
	case where == sandboxRuns && moved:
		if !running || len(attached) != 1 || attached[0].Interface.HostName != hostIf || attached[0].Interface.PodName != "net1" {
			t.Fatalf("record after settling: %+v (%t), attached %+v; want the sandbox with %s attached as net1", rec, running, attached, hostIf)
		}
		h := testnet.HandleAt(t, podNetns)
		link, err := h.LinkByName("net1")
		if err != nil {
			t.Fatalf("device not in the pod: %v", err)
		}
		if link.Attrs().MTU != 1300 || link.Attrs().Flags&net.FlagUp == 0 {
			t.Errorf("device in the pod: MTU %d, flags %v; want 1300, up", link.Attrs().MTU, link.Attrs().Flags)
		}
	case where == sandboxNoNets && moved:
		if _, ok := hostLinkState(t, hostIf); ok {
			t.Errorf("%s on the host, want it gone with the pod's namespace", hostIf)
		}
	default:
		if got, ok := hostLinkState(t, hostIf); !ok || got != wantHost {
			t.Errorf("on the host after settling: %+v (found %t), want %+v", got, ok, wantHost)
		}
		if running && len(attached) != 0 {
			t.Errorf("record after settling: %+v, want no attached device", attached)
		}
	}

	if where == sandboxRuns {
		stopAndRemove()
		at.Settle(ctx) // the next reconcile
		if got, ok := hostLinkState(t, hostIf); !ok || got != wantHost {
			t.Errorf("on the host after the stop: %+v (found %t), want %+v", got, ok, wantHost)
		}
	}
	wantGivenBack := 0
	if moved && where != sandboxNoNets {
		wantGivenBack = 1
	}
	if n := counted.givenBack.Load(); n != int32(wantGivenBack) {
		t.Errorf("give backs that found the device away: %d, want %d", n, wantGivenBack)
	}
	restarted.Flush()
	final, err := registry.NewCheckpoint(dr.StateDir).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	if len(onDiskIntents(t, final)) != 0 || len(intents.LeftAttaches()) != 0 {
		t.Errorf("intents left recorded: on disk %+v, in the registry %+v", onDiskIntents(t, final), intents.LeftAttaches())
	}
	for id, f := range final.SandboxFields {
		if a, ok := f["attached"]; ok {
			t.Errorf("sandbox %s still holds attached devices: %s", id, a)
		}
	}
}

// restartDRA is podgate started again on dr's state directory: a registry from the checkpoint
// there, a DRA manager and an attacher attaching with package dra, counting the give backs
// that find the device away from the host.
func restartDRA(t *testing.T, dr *rig.Rig, hostIfs *dra.HostInterfaces, hostIf, podNetns string) (*manager.Manager, *attach.Attacher, *registry.Registry, *attach.Intents, *countingLinks) {
	t.Helper()
	restarted, store, intents := rig.ReadState(t, dr.StateDir)
	restarted.SetWriteDelay(0)
	t.Cleanup(restarted.Flush)
	counted := &countingLinks{t: t, hostIf: hostIf, podNetns: podNetns}
	at := attach.New(restarted, intents, prometheus.NewRegistry(), attach.WithDevices([]string{rig.Driver}, hostIfs, dr.Claims), attach.WithNetdevs(counted))
	d := manager.New(dr.Pods, dr.Drivers, dr.Claims, store, restarted, dr.RuntimeClient, prometheus.NewRegistry(),
		manager.WithHostInterfaces(hostIfs), manager.WithSettle(nil, at))
	return d, at, restarted, intents, counted
}

// attachOptions are the DRA rig's with dra.attach of rig.Driver, its devices moved by links,
// the pod's network namespace podNetns.
func attachOptions(podNetns string, links attach.Netdevs) rig.Options {
	return rig.Options{
		CallTimeout: 5 * time.Second,
		NetNS:       podNetns,
		Manager: func(dr *rig.Rig) []manager.Option {
			return []manager.Option{manager.WithHostInterfaces(dr.HostIfs)}
		},
		Attach: func(dr *rig.Rig) []attach.Option {
			dr.HostIfs = dra.NewHostInterfaces(kubefake.Wrap(dr.Kube), rig.Node, "")
			return []attach.Option{attach.WithDevices([]string{rig.Driver}, dr.HostIfs, dr.Claims), attach.WithNetdevs(links)}
		},
	}
}

// newRig is the DRA rig of o, the API server holding objs.
func newRig(t *testing.T, o rig.Options, objs ...k8sruntime.Object) *rig.Rig {
	t.Helper()
	o.Objects = objs
	return rig.New(t, o)
}

// onDiskIntents are the attach intents the checkpoint data d holds.
func onDiskIntents(t testing.TB, d registry.CheckpointData) []attach.Intent {
	t.Helper()
	var out []attach.Intent
	rig.Section(t, d, "attaching", &out)
	return out
}

func readCheckpointBytes(b []byte, d *registry.CheckpointData) error {
	var f struct {
		Data json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(b, &f); err != nil {
		return err
	}
	return json.Unmarshal(f.Data, d)
}

var errCrashed = errors.New("podgate crashed here")

// crashingLinks is package dra's netdevs for the podgate that crashes: at the crash it takes
// the checkpoint as the crash leaves it, and from then on moves no interface. An attach that
// crashes is held until the test ends, so that nothing after it (the failed call's undo) runs.
type crashingLinks struct {
	attach.DRANetdevs
	at       attachCrash
	cpPath   string
	crashed  chan struct{}
	once     sync.Once
	snapshot []byte
	err      error
}

func (c *crashingLinks) crash() {
	c.once.Do(func() {
		c.snapshot, c.err = os.ReadFile(c.cpPath)
		close(c.crashed)
	})
}

func (c *crashingLinks) down() bool {
	select {
	case <-c.crashed:
		return true
	default:
		return false
	}
}

func (c *crashingLinks) Attach(ctx context.Context, hostIf, netns string, cfg dra.InterfaceConfig) (dra.Attached, error) {
	switch c.at {
	case crashAfterIntent:
		c.crash()
	case crashAfterMove:
		if _, err := c.DRANetdevs.Attach(ctx, hostIf, netns, cfg); err != nil {
			return dra.Attached{}, err
		}
		c.crash()
	case crashAfterFailure:
		return dra.Attached{}, errors.New("attach refused by the test")
	default:
		return c.DRANetdevs.Attach(ctx, hostIf, netns, cfg)
	}
	<-ctx.Done() // the test's end
	return dra.Attached{}, errCrashed
}

func (c *crashingLinks) Detach(ctx context.Context, a dra.Attached, netns string) error {
	if c.down() {
		return errCrashed
	}
	return c.DRANetdevs.Detach(ctx, a, netns)
}

func (c *crashingLinks) Resume(ctx context.Context, hostIf, netns string, cfg dra.InterfaceConfig) (dra.Attached, bool, error) {
	if c.down() {
		return dra.Attached{}, false, errCrashed
	}
	return c.DRANetdevs.Resume(ctx, hostIf, netns, cfg)
}

func (c *crashingLinks) Reclaim(ctx context.Context, hostIf, netns string) error {
	if c.down() {
		return errCrashed
	}
	return c.DRANetdevs.Reclaim(ctx, hostIf, netns)
}

// countingLinks is package dra's netdevs, counting the give backs (Detach, Reclaim) that find
// the device away from home: in the pod, or on the host with podgate's mark.
type countingLinks struct {
	attach.DRANetdevs
	t         *testing.T
	hostIf    string
	podNetns  string
	givenBack atomic.Int32
}

func (c *countingLinks) count() {
	if c.marked(nil) || c.inPod() {
		c.givenBack.Add(1)
	}
}

// marked reports whether a link of h's namespace (nil: the test's own, the host's) carries
// podgate's mark for the host interface.
func (c *countingLinks) marked(h *netlink.Handle) bool {
	links, err := dra.ListLinks(h)
	if err != nil {
		c.t.Error(err)
		return false
	}
	return slices.ContainsFunc(links, func(l netlink.Link) bool {
		alias := l.Attrs().Alias
		return strings.HasPrefix(alias, "podgate:") && strings.Contains(alias, fmt.Sprintf(`"name":%q`, c.hostIf))
	})
}

func (c *countingLinks) inPod() bool {
	if _, err := os.Stat(c.podNetns); err != nil {
		return false
	}
	return c.marked(testnet.HandleAt(c.t, c.podNetns))
}

func (c *countingLinks) Detach(ctx context.Context, a dra.Attached, netns string) error {
	c.count()
	return c.DRANetdevs.Detach(ctx, a, netns)
}

func (c *countingLinks) Reclaim(ctx context.Context, hostIf, netns string) error {
	c.count()
	return c.DRANetdevs.Reclaim(ctx, hostIf, netns)
}

var attachTestSeq atomic.Int32

// podNetns creates a network namespace standing for a pod's, removed when the test ends
// (unless the test removed it), and returns its path.
func podNetns(t *testing.T) string {
	_, path := testnet.Named(t, "pgattach")
	return path
}

// attachTestHostLink makes a veth pair on the host (the test's own namespace: podgate moves
// interfaces from its own), the device's host interface and its peer, removed when the test
// ends, and returns the interface's name and state.
func attachTestHostLink(t *testing.T) (string, linkState) {
	t.Helper()
	name := fmt.Sprintf("pg%dv%d", os.Getpid()%100000, attachTestSeq.Add(1))
	testnet.IP(t, "link", "add", name, "mtu", "1400", "type", "veth", "peer", "name", name+"p")
	t.Cleanup(func() {
		// Removing the peer removes both ends, wherever the device is.
		if out, err := exec.Command("ip", "link", "del", name+"p").CombinedOutput(); err != nil && !strings.Contains(string(out), "Cannot find device") {
			t.Errorf("ip link del %sp: %v: %s", name, err, out)
		}
	})
	testnet.IP(t, "link", "set", name, "alias", "uplink to rack 7")
	testnet.IP(t, "link", "set", name, "up")
	return name, linkState{MTU: 1400, Up: true, Alias: "uplink to rack 7"}
}

// linkState is what the test compares of the host interface.
type linkState struct {
	MTU   int
	Up    bool
	Alias string
}

// hostLinkState returns the state of the host interface name; ok is false when there is none.
func hostLinkState(t *testing.T, name string) (linkState, bool) {
	t.Helper()
	link, err := netlink.LinkByName(name)
	var nf netlink.LinkNotFoundError
	if errors.As(err, &nf) {
		return linkState{}, false
	}
	if err != nil {
		t.Fatal(err)
	}
	a := link.Attrs()
	return linkState{MTU: a.MTU, Up: a.Flags&net.FlagUp != 0, Alias: a.Alias}, true
}

// refusingLinks is package dra's netdevs refusing to attach one host interface; its Reclaim
// fails while failReclaim is set.
type refusingLinks struct {
	attach.DRANetdevs
	refuse      string
	failReclaim atomic.Bool
}

func (r *refusingLinks) Attach(ctx context.Context, hostIf, netns string, cfg dra.InterfaceConfig) (dra.Attached, error) {
	if hostIf == r.refuse {
		return dra.Attached{}, errors.New("attach refused by the test")
	}
	return r.DRANetdevs.Attach(ctx, hostIf, netns, cfg)
}

func (r *refusingLinks) Reclaim(ctx context.Context, hostIf, netns string) error {
	if r.failReclaim.Load() {
		return errors.New("reclaim refused by the test")
	}
	return r.DRANetdevs.Reclaim(ctx, hostIf, netns)
}

// TestDRAAttachFailureGivesBackWhatItMoved: a pod with two network devices whose second attach
// fails gets neither: the first goes back to the host, and both intents go. When giving the
// failed one back fails too, its intent stays, left, and the next reconcile settles it.
func TestDRAAttachFailureGivesBackWhatItMoved(t *testing.T) {
	testnet.RequireNetAdmin(t)
	for _, reclaimFails := range []bool{false, true} {
		t.Run(fmt.Sprintf("reclaimFails=%t", reclaimFails), func(t *testing.T) {
			ctx := t.Context()
			podNetns := podNetns(t)
			first, wantFirst := attachTestHostLink(t)
			second, wantSecond := attachTestHostLink(t)
			pod := rig.Pod("a", "net", "net2")
			slice := &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: "net-slice"}, Spec: resourceapi.ResourceSliceSpec{
				Driver: rig.Driver, NodeName: ptr.To("node-a"), Pool: resourceapi.ResourcePool{Name: "pool", Generation: 1, ResourceSliceCount: 1},
				Devices: []resourceapi.Device{
					{Name: "dev-net", Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{dra.DefaultInterfaceNameAttribute: {StringValue: ptr.To(first)}}},
					{Name: "dev-net2", Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{dra.DefaultInterfaceNameAttribute: {StringValue: ptr.To(second)}}},
				},
			}}
			links := &refusingLinks{refuse: second}
			links.failReclaim.Store(reclaimFails)
			dr := newRig(t, attachOptions(podNetns, links), pod, rig.Claim("net", pod), rig.Claim("net2", pod), slice)
			hostIfsDone := make(chan struct{})
			go func() {
				defer close(hostIfsDone)
				dr.HostIfs.Run(ctx)
			}()
			t.Cleanup(func() { <-hostIfsDone })

			if _, err := dr.RunPod(t, pod); err == nil || !strings.Contains(err.Error(), "attach refused by the test") {
				t.Fatalf("RunPodSandbox: %v, want the refused attach", err)
			}
			for name, want := range map[string]linkState{first: wantFirst, second: wantSecond} {
				if got, ok := hostLinkState(t, name); !ok || got != want {
					t.Errorf("%s on the host after the failed start: %+v (found %t), want %+v", name, got, ok, want)
				}
			}
			left := dr.Intents.LeftAttaches()
			if reclaimFails != (len(left) == 1) || (reclaimFails && left[0].HostInterface != second) {
				t.Fatalf("left intents %+v; want %s's only when its give back failed", left, second)
			}
			links.failReclaim.Store(false)
			dr.Attacher.Settle(ctx)
			dr.Registry.Flush()
			onDisk, err := registry.NewCheckpoint(dr.StateDir).ReadAll()
			if err != nil {
				t.Fatal(err)
			}
			if len(onDiskIntents(t, onDisk)) != 0 || len(dr.Intents.LeftAttaches()) != 0 {
				t.Errorf("intents after settling: on disk %+v, in the registry %+v", onDiskIntents(t, onDisk), dr.Intents.LeftAttaches())
			}
		})
	}
}
