package attach

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/podgate/podgate/cri/pipeline"
	"github.com/podgate/podgate/cri/registry"
	"github.com/podgate/podgate/dra"
	"github.com/podgate/podgate/dra/manager"
)

// Attacher moves the prepared network devices of the drivers named in dra.attach into the
// pod once CNI has run, and gives them back to the host when the sandbox stops, before its
// network namespace goes (a veth end in a deleted namespace is destroyed with it). With
// dra.attach empty it attaches nothing but still gives back what its records hold as
// attached, or as left attach intents: a device recorded while it was set is given back.
type Attacher struct {
	registry *registry.Registry
	// intents are the attach intents (their checkpoint section).
	intents *Intents
	// links moves the devices (package dra). settling is held to settle a left attach
	// intent, and shared by an attach's mark and move and by a stop's give back: settling
	// gives back what carries the mark, and reads the record a stop gives back from.
	links    Netdevs
	settling sync.RWMutex

	// drivers are those whose devices are attached (dra.attach; none: nothing is attached);
	// hostIfs and claims are set with them.
	drivers []string
	hostIfs *dra.HostInterfaces
	claims  *dra.ClaimResolver
	// publisher writes the devices' network data into their claims' status; nil: off.
	publisher dra.ResourceClaimStatusClient

	results *prometheus.CounterVec
}

// Option configures an Attacher.
type Option func(*Attacher)

// WithDevices attaches the network devices of drivers (dra.attach): their host interface found
// by hostIfs, their configuration in their claim, read by claims.
func WithDevices(drivers []string, hostIfs *dra.HostInterfaces, claims *dra.ClaimResolver) Option {
	return func(a *Attacher) {
		a.drivers, a.hostIfs, a.claims = slices.Clone(drivers), hostIfs, claims
	}
}

// WithPublisher writes an attached device's network data into its claim's status
// (dra.publishNetworkData), and clears it when the device is given back.
func WithPublisher(client dra.ResourceClaimStatusClient) Option {
	return func(a *Attacher) { a.publisher = client }
}

// WithNetdevs moves the devices with links in place of package dra's functions (tests crash
// between the steps).
func WithNetdevs(links Netdevs) Option { return func(a *Attacher) { a.links = links } }

// New returns the attacher of DRA network devices, recording in intents what it moves and in
// reg's sandbox records what it moved; its metrics are registered with r.
func New(reg *registry.Registry, intents *Intents, r prometheus.Registerer, opts ...Option) *Attacher {
	a := &Attacher{registry: reg, intents: intents, links: DRANetdevs{},
		results: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "podgate", Subsystem: "dra", Name: "attach_operations_total",
			Help: "DRA network devices moved into pods (attach) and given back to the host (detach), and their network data published, by result.",
		}, []string{"operation", "result"}),
	}
	for _, o := range opts {
		o(a)
	}
	r.MustRegister(a.results)
	return a
}

// Stage ("dra-attach") runs after the sysctl verification, before the record.
func (d *Attacher) Stage() pipeline.Stage {
	return pipeline.Stage{Name: "dra-attach", Run: d.attach, Undo: d.attachUndo, Stop: d.detach,
		Holds: "moving the pod's DRA network devices into its network namespace", RefusedReason: "FailedDRAAttach"}
}

func (d *Attacher) attach(ctx context.Context, sb *pipeline.Sandbox) error {
	pod, ok := d.registry.Pod(sb.Rec.Pod.UID)
	if !ok {
		return nil
	}
	pc, ok := manager.InPod(&pod)
	if !ok {
		return nil
	}
	var todo []attachTarget
	for _, c := range pc.Claims {
		for _, dev := range c.Devices {
			if slices.Contains(d.drivers, dev.Driver) {
				todo = append(todo, attachTarget{claim: c, device: dev})
			}
		}
	}
	if len(todo) == 0 {
		return nil
	}
	if err := sb.FromRuntime(); err != nil {
		// The devices were asked for and cannot be moved without the pod's namespace.
		return fmt.Errorf("attach DRA devices to sandbox %s: %w", sb.Rec.ID, err)
	}
	logger := klog.FromContext(ctx).WithValues("podSandboxID", sb.Rec.ID)
	if sb.Rec.HostNetwork || sb.Rec.NetNS == "" {
		logger.Info("DRA network devices not attached: the pod has no network namespace of its own", "devices", len(todo), "status", sb.Rec.Status)
		return nil
	}
	// Each move is an obligation to give the device back, on disk before the move (an attach
	// intent, attachOne) and taken up by the device's record as attached to the sandbox, which
	// the record stage writes before the sandbox counts (registry.Add writes a sandbox with
	// attached devices at once, and their intents go from the same write). An intent that is still there when the call ends
	// (a give back failed), or that a crash left, is settled later (Settle): the
	// device stays recorded when it is in the pod of a sandbox that still runs, and is given
	// back otherwise, found by podgate's mark (dra.Attach).
	id := sb.Rec.ID
	sb.OnEnd(func() { d.intents.LeaveAttaches(id) })
	var done []Device
	for _, t := range todo {
		dev, err := d.attachOne(ctx, sb.Rec, t)
		if err != nil {
			d.count("attach", "error")
			err = fmt.Errorf("pod %s/%s claim %s/%s device %s/%s/%s: %w", sb.Rec.Pod.Namespace, sb.Rec.Pod.Name,
				t.claim.Namespace, t.claim.Name, t.device.Driver, t.device.Pool, t.device.Device, err)
			// A stage that fails leaves nothing behind: the devices moved before go back too.
			if undo := d.giveBack(ctx, sb.Rec, done); undo != nil {
				err = errors.Join(err, fmt.Errorf("give back: %w", undo))
			}
			return err
		}
		d.count("attach", "success")
		logger.Info("Attached DRA network device", "claim", klog.KRef(t.claim.Namespace, t.claim.Name), "device", t.device.Driver+"/"+t.device.Pool+"/"+t.device.Device,
			"hostInterface", dev.Interface.HostName, "podInterface", dev.Interface.PodName, "addresses", dev.Interface.Addresses)
		if d.publisher != nil {
			d.publishOne(ctx, &dev)
		}
		done = append(done, dev)
	}
	d.intents.setAttached(id, done)
	return nil
}

// attachTarget is one prepared device to move into the pod.
type attachTarget struct {
	claim  manager.ClaimRecord
	device manager.DeviceRecord
}

// attachOne moves one device into the sandbox's network namespace, its attach intent on disk
// before the move. When the move fails, the device is given back and the intent dropped; an
// intent whose give back failed stays, to be settled once the call ends.
func (d *Attacher) attachOne(ctx context.Context, rec registry.SandboxRecord, t attachTarget) (Device, error) {
	claim, err := d.claims.Claim(ctx, t.claim.Namespace, t.claim.Name)
	if err != nil {
		return Device{}, err
	}
	result, ok := dra.AllocationResult(claim, t.device.Driver, t.device.Pool, t.device.Device)
	if !ok {
		return Device{}, errors.New("not in the claim's allocation")
	}
	cfg, _, err := dra.InterfaceConfigFor(claim, result)
	if err != nil {
		return Device{}, err
	}
	host, err := d.hostIfs.Name(ctx, t.device.Driver, t.device.Pool, t.device.Device)
	if err != nil {
		return Device{}, err
	}
	in := Intent{
		SandboxID: rec.ID, Pod: rec.Pod, NetNS: rec.NetNS,
		ClaimNamespace: t.claim.Namespace, ClaimName: t.claim.Name, ClaimUID: t.claim.UID,
		Driver: t.device.Driver, Pool: t.device.Pool, Device: t.device.Device,
		HostInterface: host, Config: cfg,
	}
	// Settling a left intent gives back what carries the host interface's mark: not while
	// this attach marks and moves it.
	d.settling.RLock()
	defer d.settling.RUnlock()
	if err := d.intents.BeginAttach(in); err != nil {
		return Device{}, err
	}
	att, err := d.links.Attach(ctx, host, rec.NetNS, cfg)
	if err != nil {
		// Attach gives the interface back when a step fails; Reclaim makes sure, from the
		// mark, before the intent goes.
		if undo := d.links.Reclaim(ctx, host, rec.NetNS); undo != nil {
			return Device{}, errors.Join(err, fmt.Errorf("give back: %w", undo))
		}
		d.intents.EndAttach(rec.ID, host)
		return Device{}, err
	}
	return in.Attached(att), nil
}

// publishOne writes an attached device's network data into its claim's status. A failure is
// reported, not fatal: the device works in the pod either way.
func (d *Attacher) publishOne(ctx context.Context, dev *Device) {
	err := dra.PublishNetworkData(ctx, d.publisher, types.NamespacedName{Namespace: dev.ClaimNamespace, Name: dev.ClaimName}, dev.ClaimUID, []dra.DeviceNetwork{network(*dev)})
	if err != nil {
		d.count("publish", "error")
		klog.FromContext(ctx).Error(err, "Publish network data", "claim", klog.KRef(dev.ClaimNamespace, dev.ClaimName))
		return
	}
	d.count("publish", "success")
	dev.Published = true
}

// attachUndo gives back what the stage attached when a later stage fails, and forgets the
// devices' records: the intents of those it could not give back stay, left once the call
// ends, to be settled.
func (d *Attacher) attachUndo(ctx context.Context, sb *pipeline.Sandbox) error {
	err := d.giveBack(ctx, sb.Rec, d.intents.Attached(sb.Rec.ID))
	d.intents.forgetAttached(sb.Rec.ID)
	return err
}

// detach gives the sandbox's devices back before StopPodSandbox is forwarded: those recorded as
// attached to it, and those of attach intents a crash left for it that the start-up has not
// settled yet. A device that cannot be given back is logged and counted, and the stop goes on:
// a pod's stop is never held by podgate. It stays recorded: a second stop tries again, and once
// the sandbox is removed its record becomes a left intent, given back from its mark.
func (d *Attacher) detach(ctx context.Context, rec registry.SandboxRecord) error {
	d.settling.RLock()
	defer d.settling.RUnlock()
	// Read under settling: settling a left intent may record a device.
	devs := d.intents.Attached(rec.ID)
	intents := d.intents.AttachIntents(rec.ID)
	if len(devs) == 0 && len(intents) == 0 {
		return nil
	}
	logger := klog.FromContext(ctx).WithValues("podSandboxID", rec.ID)
	kept, err := d.giveBackEach(ctx, rec, devs)
	if err != nil {
		logger.Error(err, "Give DRA network devices back to the host")
	}
	for _, in := range intents {
		if err := d.reclaim(ctx, in); err != nil {
			logger.Error(err, "Give back DRA network device of an interrupted attach", "hostInterface", in.HostInterface)
		}
	}
	d.intents.keepAttached(rec.ID, kept)
	return nil
}

// giveBack gives back devs, attached to the sandbox of rec.
func (d *Attacher) giveBack(ctx context.Context, rec registry.SandboxRecord, devs []Device) error {
	_, err := d.giveBackEach(ctx, rec, devs)
	return err
}

// giveBackEach gives back devs, attached to the sandbox of rec, last first, and returns those
// it could not give back. The intent of each device given back goes (an attach of this call
// that failed or was undone).
func (d *Attacher) giveBackEach(ctx context.Context, rec registry.SandboxRecord, devs []Device) (kept []Device, _ error) {
	var errs []error
	for i := len(devs) - 1; i >= 0; i-- {
		dev := devs[i]
		if err := d.links.Detach(ctx, dev.Interface, rec.NetNS); err != nil {
			d.count("detach", "error")
			errs = append(errs, fmt.Errorf("device %s/%s/%s: %w", dev.Driver, dev.Pool, dev.Device, err))
			kept = append(kept, dev)
			continue
		}
		d.count("detach", "success")
		d.intents.EndAttach(rec.ID, dev.Interface.HostName)
		klog.FromContext(ctx).Info("Gave DRA network device back to the host", "podSandboxID", rec.ID, "hostInterface", dev.Interface.HostName)
		if dev.Published && d.publisher != nil {
			if err := dra.ClearNetworkData(ctx, d.publisher, types.NamespacedName{Namespace: dev.ClaimNamespace, Name: dev.ClaimName}, dev.ClaimUID, []dra.DeviceNetwork{network(dev)}); err != nil {
				klog.FromContext(ctx).Error(err, "Clear published network data", "claim", klog.KRef(dev.ClaimNamespace, dev.ClaimName))
			}
		}
	}
	slices.Reverse(kept)
	return kept, errors.Join(errs...)
}

// Settle settles the attach intents that are left: a crash's, found in the checkpoint at
// start-up, and those whose call could not give their device back. The DRA manager runs it
// once the registry is rebuilt from the runtime, whose records then say which sandboxes still
// run, and again at each reconcile while any is left.
func (d *Attacher) Settle(ctx context.Context) {
	for _, in := range d.intents.LeftAttaches() {
		if ctx.Err() != nil {
			return
		}
		if err := d.settleAttach(ctx, in); err != nil {
			klog.FromContext(ctx).Error(err, "Settle DRA network device of an interrupted attach", "podSandboxID", in.SandboxID,
				"pod", klog.KRef(in.Pod.Namespace, in.Pod.Name), "hostInterface", in.HostInterface)
		}
	}
}

// settleAttach settles one left intent. When its sandbox still runs (the kubelet keeps a
// ready sandbox whose start it saw fail) and the device reached the pod, the attach is
// finished and the device recorded as attached, so that the sandbox's stop gives it back;
// otherwise whatever the attach left is given back, found by its mark, and the intent goes.
// An error leaves the intent, for the next reconcile.
func (d *Attacher) settleAttach(ctx context.Context, in Intent) error {
	d.settling.Lock()
	defer d.settling.Unlock()
	if !d.intents.HasAttachIntent(in.SandboxID, in.HostInterface) {
		return nil // the sandbox's stop gave it back meanwhile
	}
	logger := klog.FromContext(ctx).WithValues("podSandboxID", in.SandboxID, "pod", klog.KRef(in.Pod.Namespace, in.Pod.Name),
		"claim", klog.KRef(in.ClaimNamespace, in.ClaimName), "hostInterface", in.HostInterface)
	// A device of a driver dra.attach no longer names is given back, not set up.
	if rec, ok := d.registry.Sandbox(in.SandboxID); ok && rec.Ready && slices.Contains(d.drivers, in.Driver) {
		att, found, err := d.links.Resume(ctx, in.HostInterface, in.NetNS, in.Config)
		switch {
		case err != nil:
			d.count("resume", "error")
			logger.Error(err, "Finish interrupted attach of DRA network device: giving it back")
		case found:
			dev := in.Attached(att)
			if d.publisher != nil {
				d.publishOne(ctx, &dev)
			}
			recorded, err := d.intents.SettleAttach(in.SandboxID, dev)
			if err != nil {
				d.count("resume", "error")
				return err // the device stays in the pod, its intent on disk
			}
			if recorded {
				d.count("resume", "success")
				logger.Info("Recorded DRA network device an interrupted attach moved into the pod", "podInterface", att.PodName)
				return nil
			}
		}
	}
	if err := d.reclaim(ctx, in); err != nil {
		return err
	}
	logger.Info("Gave back DRA network device of an interrupted attach")
	return nil
}

// reclaim gives back what the attach of an intent left, from podgate's mark, and then drops
// the intent.
func (d *Attacher) reclaim(ctx context.Context, in Intent) error {
	if err := d.links.Reclaim(ctx, in.HostInterface, in.NetNS); err != nil {
		d.count("reclaim", "error")
		return err
	}
	d.count("reclaim", "success")
	d.intents.EndAttach(in.SandboxID, in.HostInterface)
	return nil
}

// network is an attached device's network data, as the claim's status shows it.
func network(dev Device) dra.DeviceNetwork {
	return dev.Interface.DeviceNetwork(resourceapi.DeviceRequestAllocationResult{Driver: dev.Driver, Pool: dev.Pool, Device: dev.Device})
}

// count counts an operation on DRA network devices.
func (d *Attacher) count(op, result string) {
	d.results.WithLabelValues(op, result).Inc()
}

// Netdevs moves network interfaces between the host and pods: package dra's functions, which
// the tests wrap to crash between the steps.
type Netdevs interface {
	Attach(ctx context.Context, hostIf, netns string, cfg dra.InterfaceConfig) (dra.Attached, error)
	Detach(ctx context.Context, a dra.Attached, netns string) error
	Resume(ctx context.Context, hostIf, netns string, cfg dra.InterfaceConfig) (dra.Attached, bool, error)
	Reclaim(ctx context.Context, hostIf, netns string) error
}

// DRANetdevs is Netdevs of package dra; a test's Netdevs embeds it to wrap its steps.
type DRANetdevs struct{}

var _ Netdevs = DRANetdevs{}

// Attach is dra.Attach.
func (DRANetdevs) Attach(ctx context.Context, hostIf, netns string, cfg dra.InterfaceConfig) (dra.Attached, error) {
	return dra.Attach(ctx, hostIf, netns, cfg)
}

// Detach is dra.Detach.
func (DRANetdevs) Detach(ctx context.Context, a dra.Attached, netns string) error {
	return dra.Detach(ctx, a, netns)
}

// Resume is dra.Resume.
func (DRANetdevs) Resume(ctx context.Context, hostIf, netns string, cfg dra.InterfaceConfig) (dra.Attached, bool, error) {
	return dra.Resume(ctx, hostIf, netns, cfg)
}

// Reclaim is dra.Reclaim.
func (DRANetdevs) Reclaim(ctx context.Context, hostIf, netns string) error {
	return dra.Reclaim(ctx, hostIf, netns)
}
