package driver

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"sync"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"
)

// DefaultDriverName is the driver's name unless configured otherwise.
const DefaultDriverName = "net.podgate.test"

// DefaultInterfacePrefix names the host interfaces: pgnic0, pgnic1, ...
const DefaultInterfacePrefix = "pgnic"

// Config configures a [Driver].
type Config struct {
	// DriverName is the DRA driver name (DefaultDriverName if empty). It is also the vendor
	// part of the CDI device IDs.
	DriverName string
	// NodeName is the node the driver runs on; it names the device pool. Empty means the driver
	// publishes no ResourceSlice and accepts allocations from any pool.
	NodeName string
	// KubeClient reads ResourceClaims (the kubeletplugin helper fetches each claim it is asked
	// to prepare) and publishes the ResourceSlice. Required.
	KubeClient kubernetes.Interface
	// RegistryDir is the kubelet's plugin registration directory, where the driver's
	// registration socket <driver name>-reg.sock goes (default
	// /var/lib/kubelet/plugins_registry). Created if missing.
	RegistryDir string
	// PluginDir holds the driver's gRPC socket (dra.sock) and its checkpoint (state.json)
	// (default /var/lib/kubelet/plugins/<driver name>). Created if missing.
	PluginDir string
	// Devices is how many devices the driver has (nic0..nicN-1). Required.
	Devices int
	// InterfacePrefix names the devices' host interfaces (DefaultInterfacePrefix if empty).
	InterfacePrefix string
	// NetNSPath is the network namespace the interfaces are made in; empty is the driver's own.
	NetNSPath string
	// CDIDir is where CDI spec files for prepared claims are written; empty writes none and
	// returns no CDI device IDs.
	CDIDir string
	// EventsFile, if set, receives one JSON line ([Event]) per claim prepared or unprepared.
	EventsFile string
	// OnFatal is called when the kubeletplugin helper reports an error it cannot recover from
	// in the background (its gRPC servers failed); main cancels its root context with it.
	OnFatal func(error)
}

// Driver is a DRA network driver whose devices are veth pairs. It implements
// kubeletplugin.DRAPlugin; the helper calls it serialised (the default), but Stats and
// ServeHTTP may run concurrently with it, hence the mutex.
type Driver struct {
	cfg     Config
	devices map[string]Device // by device name
	links   *links
	events  *eventLog
	helper  *kubeletplugin.Helper
	stop    sync.Once

	mu       sync.Mutex
	prepared map[types.UID]PreparedClaim // mirrors the checkpoint
	stats    Stats                       // Prepared is filled in by Stats
}

var _ kubeletplugin.DRAPlugin = (*Driver)(nil)

// Start loads the driver's checkpoint, starts the kubeletplugin helper (registration socket in
// RegistryDir, DRA socket in PluginDir) and, with a NodeName, publishes the ResourceSlice.
// With a NodeName it returns only once the helper's ResourceSlice informer has synced, i.e. once
// the API server answered (the sockets serve already while it waits). The driver runs until ctx
// is cancelled or Stop is called.
func Start(ctx context.Context, cfg Config) (*Driver, error) {
	if cfg.DriverName == "" {
		cfg.DriverName = DefaultDriverName
	}
	if cfg.InterfacePrefix == "" {
		cfg.InterfacePrefix = DefaultInterfacePrefix
	}
	if cfg.RegistryDir == "" {
		cfg.RegistryDir = kubeletplugin.KubeletRegistryDir
	}
	if cfg.PluginDir == "" {
		cfg.PluginDir = filepath.Join(kubeletplugin.KubeletPluginsDir, cfg.DriverName)
	}
	if cfg.KubeClient == nil {
		return nil, errors.New("no Kubernetes client")
	}
	inventory, err := Inventory(cfg.Devices, cfg.InterfacePrefix)
	if err != nil {
		return nil, err
	}
	// The helper requires both directories to exist.
	for _, dir := range []string{cfg.RegistryDir, cfg.PluginDir} {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return nil, err
		}
	}
	prepared, err := loadState(cfg.PluginDir)
	if err != nil {
		return nil, fmt.Errorf("load state: %w", err)
	}
	d := &Driver{cfg: cfg, devices: map[string]Device{}, prepared: prepared,
		stats: Stats{PrepareCallsByCaller: map[string]int64{}}}
	for _, dev := range inventory {
		d.devices[dev.Name] = dev
	}
	if d.links, err = openLinks(cfg.NetNSPath); err != nil {
		return nil, err
	}
	if d.events, err = openEventLog(cfg.EventsFile); err != nil {
		d.links.close()
		return nil, err
	}
	if err := d.startHelper(ctx, inventory); err != nil {
		d.Stop()
		return nil, err
	}
	return d, nil
}

func (d *Driver) startHelper(ctx context.Context, inventory []Device) error {
	opts := []kubeletplugin.Option{
		kubeletplugin.DriverName(d.cfg.DriverName),
		kubeletplugin.KubeClient(d.cfg.KubeClient),
		kubeletplugin.RegistrarDirectoryPath(d.cfg.RegistryDir),
		kubeletplugin.PluginDataDirectoryPath(d.cfg.PluginDir),
		// Identifies the process behind each call, for the events and stats.
		kubeletplugin.PluginListener(listenWithCallers),
		// The driver does not report device health; without the service the kubelet does
		// not open a health stream that would only be refused.
		kubeletplugin.HealthService(false),
	}
	if d.cfg.NodeName != "" {
		opts = append(opts, kubeletplugin.NodeName(d.cfg.NodeName))
	}
	helper, err := kubeletplugin.Start(ctx, d, opts...)
	if err != nil {
		return fmt.Errorf("start kubelet plugin: %w", err)
	}
	d.helper = helper
	if d.cfg.NodeName == "" {
		return nil
	}
	if err := helper.PublishResources(ctx, driverResources(d.cfg.NodeName, inventory)); err != nil {
		return fmt.Errorf("publish resources: %w", err)
	}
	return nil
}

// Stop stops the helper (sockets removed, ResourceSlice publishing stopped) and releases the
// driver's resources. The interfaces of prepared claims stay, as does the checkpoint, so that a
// restarted driver can unprepare them. Calling Stop again does nothing.
func (d *Driver) Stop() {
	d.stop.Do(func() {
		d.helper.Stop() // nil-safe
		d.links.close()
		if err := d.events.close(); err != nil {
			klog.Background().Error(err, "Closing events file", "path", d.cfg.EventsFile)
		}
	})
}

// Stats returns a snapshot of the driver's counters and prepared claims.
func (d *Driver) Stats() Stats {
	d.mu.Lock()
	defer d.mu.Unlock()
	s := d.stats
	s.PrepareCallsByCaller = maps.Clone(d.stats.PrepareCallsByCaller)
	s.Prepared = maps.Clone(d.prepared)
	return s
}

// PrepareResourceClaims creates the host interfaces of every claim's devices of this driver.
func (d *Driver) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.stats.PrepareCalls++
	d.stats.PrepareCallsByCaller[callerKey(callerFrom(ctx))]++
	result := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	for _, claim := range claims {
		result[claim.UID] = d.prepareClaim(ctx, claim)
	}
	return result, nil
}

func (d *Driver) prepareClaim(ctx context.Context, claim *resourceapi.ResourceClaim) kubeletplugin.PrepareResult {
	logger := klog.FromContext(ctx)
	ev := Event{Op: OpPrepare, Namespace: claim.Namespace, Name: claim.Name, UID: claim.UID, Caller: callerFrom(ctx)}
	devices, err := d.claimDevices(claim)
	if err == nil {
		ev.Devices, ev.Interfaces = deviceNames(devices)
		ev.Created, err = d.prepareDevices(claim, devices)
	}
	ev.Time = time.Now()
	if err != nil {
		ev.Error = err.Error()
	}
	d.writeEvent(ctx, ev)
	if err != nil {
		d.stats.ClaimPrepareErrors++
		logger.Error(err, "Preparing claim failed", "claim", klog.KObj(claim), "devices", ev.Devices, "caller", ev.Caller)
		return kubeletplugin.PrepareResult{Err: fmt.Errorf("prepare claim %s: %w", klog.KObj(claim), err)}
	}
	d.stats.ClaimPrepares++
	logger.Info("Prepared claim", "claim", klog.KObj(claim), "uid", claim.UID,
		"devices", ev.Devices, "interfaces", ev.Interfaces, "created", ev.Created, "caller", ev.Caller)
	out := make([]kubeletplugin.Device, 0, len(devices))
	for _, dev := range devices {
		out = append(out, kubeletplugin.Device{
			Requests:     []string{dev.Request},
			PoolName:     dev.Pool,
			DeviceName:   dev.Name,
			CDIDeviceIDs: nonEmpty(dev.CDIDeviceID),
		})
	}
	return kubeletplugin.PrepareResult{Devices: out}
}

// claimDevices picks the claim's allocation results of this driver and checks them against the
// inventory and against the other prepared claims: the driver is the last line of defence
// against one device serving two claims.
func (d *Driver) claimDevices(claim *resourceapi.ResourceClaim) ([]PreparedDevice, error) {
	if claim.Status.Allocation == nil {
		return nil, errors.New("not allocated")
	}
	var devices []PreparedDevice
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver != d.cfg.DriverName {
			continue
		}
		dev, ok := d.devices[r.Device]
		if !ok {
			return nil, fmt.Errorf("unknown device %q", r.Device)
		}
		if d.cfg.NodeName != "" && r.Pool != d.cfg.NodeName {
			return nil, fmt.Errorf("device %s: pool %q is not this node's pool %q", r.Device, r.Pool, d.cfg.NodeName)
		}
		if owner, ok := d.deviceOwner(dev.Name); ok && owner != claim.UID {
			other := d.prepared[owner]
			return nil, fmt.Errorf("device %s is prepared for claim %s/%s", dev.Name, other.Namespace, other.Name)
		}
		pd := PreparedDevice{Device: dev, Request: r.Request, Pool: r.Pool}
		if d.cfg.CDIDir != "" {
			pd.CDIDeviceID = cdiDeviceID(d.cfg.DriverName, claim.UID, dev.Name)
		}
		devices = append(devices, pd)
	}
	return devices, nil
}

// prepareDevices checkpoints the claim, then creates its interfaces and CDI spec. The
// checkpoint comes first so that an interface never exists without a record of who owns it.
func (d *Driver) prepareDevices(claim *resourceapi.ResourceClaim, devices []PreparedDevice) (created []string, err error) {
	if _, known := d.prepared[claim.UID]; !known {
		d.prepared[claim.UID] = PreparedClaim{Namespace: claim.Namespace, Name: claim.Name, Devices: devices}
		if err := saveState(d.cfg.PluginDir, d.prepared); err != nil {
			delete(d.prepared, claim.UID)
			return nil, fmt.Errorf("checkpoint: %w", err)
		}
	}
	for _, dev := range devices {
		made, err := d.links.ensure(dev.Device)
		if made {
			created = append(created, dev.Interface)
		}
		if err != nil {
			return created, err
		}
	}
	if d.cfg.CDIDir != "" && len(devices) > 0 {
		if err := writeCDISpec(d.cfg.CDIDir, d.cfg.DriverName, claim.UID, devices); err != nil {
			return created, fmt.Errorf("CDI spec: %w", err)
		}
	}
	return created, nil
}

// deviceOwner returns the claim the device is prepared for, if any.
func (d *Driver) deviceOwner(device string) (types.UID, bool) {
	for uid, pc := range d.prepared {
		for _, dev := range pc.Devices {
			if dev.Name == device {
				return uid, true
			}
		}
	}
	return "", false
}

// UnprepareResourceClaims deletes the host interfaces of the claims. A claim the driver does not
// know is success: the kubelet repeats unprepare after restarts.
func (d *Driver) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.stats.UnprepareCalls++
	result := make(map[types.UID]error, len(claims))
	for _, claim := range claims {
		result[claim.UID] = d.unprepareClaim(ctx, claim)
	}
	return result, nil
}

func (d *Driver) unprepareClaim(ctx context.Context, claim kubeletplugin.NamespacedObject) error {
	logger := klog.FromContext(ctx)
	ref := klog.KRef(claim.Namespace, claim.Name)
	pc, known := d.prepared[claim.UID]
	ev := Event{Op: OpUnprepare, Namespace: claim.Namespace, Name: claim.Name, UID: claim.UID, Caller: callerFrom(ctx)}
	ev.Devices, ev.Interfaces = deviceNames(pc.Devices)
	err := d.unprepareDevices(claim.UID, pc, known)
	ev.Time = time.Now()
	if err != nil {
		ev.Error = err.Error()
	}
	d.writeEvent(ctx, ev)
	if err != nil {
		logger.Error(err, "Unpreparing claim failed", "claim", ref, "devices", ev.Devices, "caller", ev.Caller)
		return fmt.Errorf("unprepare claim %s: %w", ref, err)
	}
	d.stats.ClaimUnprepares++
	logger.Info("Unprepared claim", "claim", ref, "uid", claim.UID, "devices", ev.Devices,
		"interfaces", ev.Interfaces, "wasPrepared", known, "caller", ev.Caller)
	return nil
}

func (d *Driver) unprepareDevices(uid types.UID, pc PreparedClaim, known bool) error {
	if !known {
		return nil
	}
	for _, dev := range pc.Devices {
		if err := d.links.remove(dev.Device); err != nil {
			return err
		}
	}
	if d.cfg.CDIDir != "" {
		if err := removeCDISpec(d.cfg.CDIDir, d.cfg.DriverName, uid); err != nil {
			return fmt.Errorf("CDI spec: %w", err)
		}
	}
	delete(d.prepared, uid)
	if err := saveState(d.cfg.PluginDir, d.prepared); err != nil {
		// Keep the claim: the kubelet retries, and the interfaces are gone by then.
		d.prepared[uid] = pc
		return fmt.Errorf("checkpoint: %w", err)
	}
	return nil
}

// writeEvent appends ev to the events file. A failure is logged, not returned: the events file
// is an observation aid, and the kubelet must not see a prepare fail because of it.
func (d *Driver) writeEvent(ctx context.Context, ev Event) {
	if err := d.events.write(ev); err != nil {
		klog.FromContext(ctx).Error(err, "Writing event", "path", d.cfg.EventsFile)
	}
}

// HandleError logs background errors of the helper (ResourceSlice publishing, gRPC servers) and
// hands fatal ones to Config.OnFatal.
func (d *Driver) HandleError(ctx context.Context, err error, msg string) {
	utilruntime.HandleErrorWithContext(ctx, err, msg)
	if !errors.Is(err, kubeletplugin.ErrRecoverable) && d.cfg.OnFatal != nil {
		d.cfg.OnFatal(fmt.Errorf("%s: %w", msg, err))
	}
}

// WatchHealthStatus is not supported: the driver's devices have no health to report.
func (d *Driver) WatchHealthStatus(context.Context, chan<- kubeletplugin.DeviceHealthReport) error {
	return kubeletplugin.ErrHealthNotSupported
}

func deviceNames(devices []PreparedDevice) (names, interfaces []string) {
	for _, dev := range devices {
		names = append(names, dev.Name)
		interfaces = append(interfaces, dev.Interface)
	}
	return names, interfaces
}

// callerKey names a caller in Stats.PrepareCallsByCaller: its command name, or "unknown".
func callerKey(c Caller) string {
	if c.Comm == "" {
		return "unknown"
	}
	return c.Comm
}

func nonEmpty(s string) []string {
	if s == "" {
		return nil
	}
	return []string{s}
}
