package agent

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/prometheus/client_golang/prometheus"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/podgate/podgate/agent/registry"
	"github.com/podgate/podgate/dra"
)

// draAttach moves the prepared network devices of the drivers named in dra.attach into the
// pod once CNI has run, and gives them back to the host when the sandbox stops, before its
// network namespace goes (a veth end in a deleted namespace is destroyed with it).
type draAttach struct {
	drivers  []string
	hostIfs  *dra.HostInterfaces
	claims   *dra.ClaimResolver
	registry *registry.Registry
	// publish writes the devices' network data into their claims' status; nil: off.
	publish func(ctx context.Context, claim types.NamespacedName, uid types.UID, devs []dra.DeviceNetwork) error
	clear   func(ctx context.Context, claim types.NamespacedName, uid types.UID, devs []dra.DeviceNetwork) error

	results *prometheus.CounterVec
}

func newDRAAttach(drivers []string, hostIfs *dra.HostInterfaces, claims *dra.ClaimResolver, reg *registry.Registry, r prometheus.Registerer) *draAttach {
	a := &draAttach{
		drivers: slices.Clone(drivers), hostIfs: hostIfs, claims: claims, registry: reg,
		results: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "podgate", Subsystem: "dra", Name: "attach_operations_total",
			Help: "DRA network devices moved into pods (attach) and given back to the host (detach), and their network data published, by result.",
		}, []string{"operation", "result"}),
	}
	r.MustRegister(a.results)
	return a
}

// attachStage runs after the sysctl verification, before the record.
func (d *draStages) attachStage() stage {
	return stage{name: "dra-attach", run: d.attach, undo: d.attachUndo, stop: d.detach}
}

func (d *draStages) attach(ctx context.Context, sb *sandboxRun) error {
	a := d.attacher
	if d.off != "" || a == nil {
		return nil
	}
	pc, ok := d.registry.PodClaims(sb.rec.Pod.UID)
	if !ok {
		return nil
	}
	var todo []attachTarget
	for _, c := range pc.Claims {
		for _, dev := range c.Devices {
			if slices.Contains(a.drivers, dev.Driver) {
				todo = append(todo, attachTarget{claim: c, device: dev})
			}
		}
	}
	if len(todo) == 0 {
		return nil
	}
	if err := sb.fromRuntime(); err != nil {
		// The devices were asked for and cannot be moved without the pod's namespace.
		return fmt.Errorf("attach DRA devices to sandbox %s: %w", sb.rec.ID, err)
	}
	logger := klog.FromContext(ctx).WithValues("podSandboxID", sb.rec.ID)
	if sb.rec.HostNetwork || sb.rec.NetNS == "" {
		logger.Info("DRA network devices not attached: the pod has no network namespace of its own", "devices", len(todo), "status", sb.rec.Status)
		return nil
	}
	for _, t := range todo {
		dev, err := a.attachOne(ctx, sb.rec.NetNS, t)
		if err != nil {
			a.results.WithLabelValues("attach", "error").Inc()
			return fmt.Errorf("pod %s/%s claim %s/%s device %s/%s/%s: %w", sb.rec.Pod.Namespace, sb.rec.Pod.Name,
				t.claim.Namespace, t.claim.Name, t.device.Driver, t.device.Pool, t.device.Device, err)
		}
		a.results.WithLabelValues("attach", "success").Inc()
		// An obligation to give the device back: the record stage makes it durable before
		// the sandbox counts (registry.Add writes a record with Attached at once), as
		// nothing else finds the device after a crash — the rebuild adopts the sandbox
		// without it, and detach gives back only what the record holds. A crash between
		// this move and that write still loses it: the sandbox's stop, whenever it comes,
		// finds no record, and the device goes with the pod's namespace. Its alias keeps
		// podgate's mark (dra.Attach), from which a sweep could find it.
		sb.rec.Attached = append(sb.rec.Attached, dev)
		logger.Info("Attached DRA network device", "claim", klog.KRef(t.claim.Namespace, t.claim.Name), "device", t.device.Driver+"/"+t.device.Pool+"/"+t.device.Device,
			"hostInterface", dev.Interface.HostName, "podInterface", dev.Interface.PodName, "addresses", dev.Interface.Addresses)
		if a.publish != nil {
			d.publishOne(ctx, &sb.rec.Attached[len(sb.rec.Attached)-1])
		}
	}
	return nil
}

// attachTarget is one prepared device to move into the pod.
type attachTarget struct {
	claim  registry.ClaimRecord
	device registry.DeviceRecord
}

func (a *draAttach) attachOne(ctx context.Context, netns string, t attachTarget) (registry.AttachedDevice, error) {
	claim, err := a.claims.Claim(ctx, t.claim.Namespace, t.claim.Name)
	if err != nil {
		return registry.AttachedDevice{}, err
	}
	result, ok := allocationResult(claim, t.device)
	if !ok {
		return registry.AttachedDevice{}, errors.New("not in the claim's allocation")
	}
	cfg, _, err := dra.InterfaceConfigFor(claim, result)
	if err != nil {
		return registry.AttachedDevice{}, err
	}
	host, err := a.hostIfs.Name(ctx, t.device.Driver, t.device.Pool, t.device.Device)
	if err != nil {
		return registry.AttachedDevice{}, err
	}
	att, err := dra.Attach(ctx, host, netns, cfg)
	if err != nil {
		return registry.AttachedDevice{}, err
	}
	return registry.AttachedDevice{
		ClaimNamespace: t.claim.Namespace, ClaimName: t.claim.Name, ClaimUID: t.claim.UID,
		Driver: t.device.Driver, Pool: t.device.Pool, Device: t.device.Device, Interface: att,
	}, nil
}

func allocationResult(claim *resourceapi.ResourceClaim, dev registry.DeviceRecord) (resourceapi.DeviceRequestAllocationResult, bool) {
	if claim.Status.Allocation == nil {
		return resourceapi.DeviceRequestAllocationResult{}, false
	}
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver == dev.Driver && r.Pool == dev.Pool && r.Device == dev.Device {
			return r, true
		}
	}
	return resourceapi.DeviceRequestAllocationResult{}, false
}

// publishOne writes an attached device's network data into its claim's status. A failure is
// reported, not fatal: the device works in the pod either way.
func (d *draStages) publishOne(ctx context.Context, dev *registry.AttachedDevice) {
	a := d.attacher
	err := a.publish(ctx, types.NamespacedName{Namespace: dev.ClaimNamespace, Name: dev.ClaimName}, dev.ClaimUID, []dra.DeviceNetwork{dev.Network()})
	if err != nil {
		a.results.WithLabelValues("publish", "error").Inc()
		klog.FromContext(ctx).Error(err, "Publish network data", "claim", klog.KRef(dev.ClaimNamespace, dev.ClaimName))
		return
	}
	a.results.WithLabelValues("publish", "success").Inc()
	dev.Published = true
}

// attachUndo gives back what the stage attached when a later stage fails.
func (d *draStages) attachUndo(ctx context.Context, sb *sandboxRun) error {
	return d.giveBack(ctx, sb.rec)
}

// detach gives the sandbox's devices back before StopPodSandbox is forwarded. A device that
// cannot be given back is logged and counted, and the stop goes on: a pod's stop is never held
// by podgate.
func (d *draStages) detach(ctx context.Context, rec registry.SandboxRecord) error {
	if len(rec.Attached) == 0 {
		return nil
	}
	if err := d.giveBack(ctx, rec); err != nil {
		klog.FromContext(ctx).Error(err, "Give DRA network devices back to the host", "podSandboxID", rec.ID)
	}
	// The background write will do: a crash that loses this leaves the devices recorded as
	// attached, and giving them back again finds nothing to move and succeeds (dra.Detach).
	d.registry.Update(rec.ID, func(r *registry.SandboxRecord) { r.Attached = nil })
	return nil
}

func (d *draStages) giveBack(ctx context.Context, rec registry.SandboxRecord) error {
	a := d.attacher
	var errs []error
	for i := len(rec.Attached) - 1; i >= 0; i-- {
		dev := rec.Attached[i]
		if err := dra.Detach(ctx, dev.Interface, rec.NetNS); err != nil {
			a.results.WithLabelValues("detach", "error").Inc()
			errs = append(errs, fmt.Errorf("device %s/%s/%s: %w", dev.Driver, dev.Pool, dev.Device, err))
			continue
		}
		a.results.WithLabelValues("detach", "success").Inc()
		klog.FromContext(ctx).Info("Gave DRA network device back to the host", "podSandboxID", rec.ID, "hostInterface", dev.Interface.HostName)
		if dev.Published && a.clear != nil {
			if err := a.clear(ctx, types.NamespacedName{Namespace: dev.ClaimNamespace, Name: dev.ClaimName}, dev.ClaimUID, []dra.DeviceNetwork{dev.Network()}); err != nil {
				klog.FromContext(ctx).Error(err, "Clear published network data", "claim", klog.KRef(dev.ClaimNamespace, dev.ClaimName))
			}
		}
	}
	return errors.Join(errs...)
}
