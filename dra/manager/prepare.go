package manager

// The prepare: each claim once, however many sandboxes ask at the same moment.

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"go.opentelemetry.io/otel/attribute"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/podgate/podgate/cri/pipeline"
	"github.com/podgate/podgate/dra"
)

// observed are the devices of the claims the kubelet prepared and podgate has not recorded as
// prepared yet, from their allocation, with their network data as podgate's own prepare
// records it: what the PodResources extension shows a meta-CNI plugin during CNI ADD.
func (d *Manager) observed(ctx context.Context, claims []dra.PodClaim) map[types.UID][]DeviceRecord {
	devices := allocatedDevices(claims)
	var fresh []ClaimRecord
	for _, c := range claims {
		if info, ok := d.store.Claim(c.UID); ok && info.Prepared {
			delete(devices, c.UID) // recorded already, with its network data
			continue
		}
		fresh = append(fresh, ClaimRecord{UID: c.UID, Namespace: c.Namespace, Name: c.Name, Drivers: c.Drivers(), Prepared: true, Devices: devices[c.UID]})
	}
	d.describeNetwork(ctx, fresh)
	for _, c := range fresh {
		devices[c.UID] = c.Devices
	}
	return devices
}

// allocatedDevices are the devices of each claim's allocation that its drivers serve, as the
// kubelet prepared them: what podgate shows and attaches without having called the drivers.
func allocatedDevices(claims []dra.PodClaim) map[types.UID][]DeviceRecord {
	out := make(map[types.UID][]DeviceRecord, len(claims))
	for _, c := range claims {
		var devs []DeviceRecord
		for _, r := range c.Results {
			i := slices.IndexFunc(devs, func(d DeviceRecord) bool {
				return d.Driver == r.Driver && d.Pool == r.Pool && d.Device == r.Device
			})
			if i < 0 {
				devs = append(devs, DeviceRecord{Driver: r.Driver, Pool: r.Pool, Device: r.Device})
				i = len(devs) - 1
			}
			devs[i].Requests = append(devs[i].Requests, r.Request)
		}
		out[c.UID] = devs
	}
	return out
}

// claimOp is a prepare or an unprepare of a claim in progress; done closes when it ends.
type claimOp struct {
	done chan struct{}
	// unprepare: podgate's drivers are unpreparing the claim.
	unprepare bool
}

// prepareOnce makes sure each claim is prepared, calling its drivers at most once however many
// sandboxes ask at the same moment. A claim another call is preparing or unpreparing is waited
// for first, and looked at again after: until an unprepare ends, the claim's record still says
// prepared while its drivers tear its devices down. A claim prepared already is then taken as it
// is; the rest this call prepares: by podgate, each driver's claims in one call; by the kubelet,
// it records their devices. A claim whose preparer failed is tried again by a waiter.
//
// A claim whose drivers podgate unprepared while the pod joined is prepared by podgate even when
// the kubelet prepares the pod's claims: the kubelet's prepare may have come before that
// unprepare, and the kubelet does not prepare a claim it holds prepared again.
func (d *Manager) prepareOnce(ctx context.Context, claims []dra.PodClaim, by string) error {
	undone := map[types.UID]bool{} // claims whose drivers unprepared them while this call waited
	for {
		var mine []dra.PodClaim
		waits := map[types.UID]*claimOp{}
		d.mu.Lock()
		for _, c := range claims {
			if op, busy := d.busy[c.UID]; busy {
				waits[c.UID] = op
				continue
			}
			if info, ok := d.store.Claim(c.UID); ok && info.Prepared {
				continue
			}
			d.busy[c.UID] = &claimOp{done: make(chan struct{})}
			mine = append(mine, c)
		}
		d.mu.Unlock()
		if len(mine) == 0 && len(waits) == 0 {
			return nil
		}
		if len(mine) > 0 {
			err := d.prepareMine(ctx, mine, by, undone)
			d.mu.Lock()
			for _, c := range mine {
				close(d.busy[c.UID].done)
				delete(d.busy, c.UID)
			}
			d.mu.Unlock()
			if err != nil {
				return err
			}
		}
		for uid, op := range waits {
			if d.onWait != nil {
				d.onWait(uid)
			}
			select {
			case <-op.done:
			case <-ctx.Done():
				return fmt.Errorf("wait for another call's prepare or unprepare of a shared claim: %w", context.Cause(ctx))
			}
			if op.unprepare {
				undone[uid] = true
			}
		}
	}
}

// prepareMine prepares the claims this call holds: it records the devices of those the kubelet
// prepared (by kubelet), and calls the drivers of the others.
func (d *Manager) prepareMine(ctx context.Context, claims []dra.PodClaim, by string, undone map[types.UID]bool) error {
	if by != PreparedByKubelet {
		return d.callAndRecord(ctx, claims)
	}
	var observe, call []dra.PodClaim
	for _, c := range claims {
		if undone[c.UID] {
			klog.FromContext(ctx).Info("Claim unprepared by podgate while the pod joined it: podgate prepares it again", "claim", klog.KRef(c.Namespace, c.Name))
			call = append(call, c)
			continue
		}
		observe = append(observe, c)
	}
	var errs []error
	if len(observe) > 0 {
		errs = append(errs, d.store.SetObserved(d.observed(ctx, observe)))
	}
	if len(call) > 0 {
		errs = append(errs, d.callAndRecord(ctx, call))
	}
	return errors.Join(errs...)
}

// callAndRecord calls the drivers of claims this call prepares and records what they returned.
func (d *Manager) callAndRecord(ctx context.Context, claims []dra.PodClaim) error {
	results, err := d.callDrivers(ctx, claims)
	if len(results) > 0 {
		var fresh []ClaimRecord
		for _, c := range claims {
			if devs, ok := results[c.UID]; ok {
				fresh = append(fresh, ClaimRecord{UID: c.UID, Namespace: c.Namespace, Name: c.Name, Drivers: c.Drivers(), Prepared: true, Devices: devs})
				klog.FromContext(ctx).Info("Prepared claim", "claim", klog.KRef(c.Namespace, c.Name), "drivers", c.Drivers(), "devices", deviceNames(devs))
			}
		}
		d.describeNetwork(ctx, fresh)
		devices := make(map[types.UID][]DeviceRecord, len(fresh))
		for _, c := range fresh {
			devices[c.UID] = c.Devices
		}
		if werr := d.store.SetPrepared(devices); werr != nil {
			// The drivers prepared; the record says not yet: the next sandbox prepares again,
			// which drivers accept, and the claim stays an obligation to unprepare.
			err = errors.Join(err, werr)
		}
	}
	return err
}

// callDrivers prepares claims, each driver's in one call, the drivers in parallel. It returns
// the devices of every claim all of whose drivers prepared it.
func (d *Manager) callDrivers(ctx context.Context, claims []dra.PodClaim) (map[types.UID][]DeviceRecord, error) {
	byDriver := map[string][]dra.Claim{}
	for _, c := range claims {
		for _, name := range c.Drivers() {
			byDriver[name] = append(byDriver[name], dra.Claim{Namespace: c.Namespace, Name: c.Name, UID: c.UID})
		}
	}
	type answer struct {
		driver  string
		results map[types.UID]dra.PrepareResult
		err     error
	}
	answers := make(chan answer, len(byDriver))
	for name, cls := range byDriver {
		go func() {
			drv, err := d.drivers.Lookup(name)
			if err != nil {
				answers <- answer{driver: name, err: err}
				return
			}
			// A span per driver: the pod start's trace shows which driver took how long.
			sctx, span := pipeline.StartSpan(ctx, "dra prepare", attribute.String("driver", name), attribute.Int("claims", len(cls)))
			res, err := drv.Prepare(sctx, cls)
			pipeline.EndSpan(span, err)
			answers <- answer{driver: name, results: res, err: err}
		}()
	}
	devices := map[types.UID][]DeviceRecord{}
	failed := map[types.UID]bool{}
	var errs []error
	for range byDriver {
		a := <-answers
		if a.err != nil {
			errs = append(errs, a.err)
		}
		for _, c := range byDriver[a.driver] {
			res, ok := a.results[c.UID]
			if !ok || res.Err != nil {
				failed[c.UID] = true
				continue
			}
			for _, dev := range res.Devices {
				devices[c.UID] = append(devices[c.UID], DeviceRecord{Driver: a.driver, Pool: dev.Pool, Device: dev.Name, Requests: dev.Requests, CDIDeviceIDs: dev.CDIDeviceIDs})
			}
			if _, ok := devices[c.UID]; !ok {
				devices[c.UID] = nil // prepared, with no device to show
			}
		}
	}
	for uid := range failed {
		delete(devices, uid)
	}
	return devices, errors.Join(errs...)
}

func deviceNames(devs []DeviceRecord) []string {
	out := make([]string, len(devs))
	for i, d := range devs {
		out[i] = d.Driver + "/" + d.Pool + "/" + d.Device
	}
	return out
}

func (d *Manager) begin(uid types.UID) {
	d.mu.Lock()
	d.preparing[uid]++
	d.mu.Unlock()
}

// done ends one in-flight RunPodSandbox of the pod.
func (d *Manager) done(uid types.UID) {
	d.mu.Lock()
	if d.preparing[uid]--; d.preparing[uid] <= 0 {
		delete(d.preparing, uid)
	}
	d.mu.Unlock()
}

func (d *Manager) inFlight(uid types.UID) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.preparing[uid] > 0
}
