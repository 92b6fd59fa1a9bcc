package dra

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
)

// DefaultInterfaceNameAttribute is the device attribute, in a driver's ResourceSlice, that
// names a device's network interface on the host, when podgate's configuration names none.
// dranet's is "dra.net/ifName".
const DefaultInterfaceNameAttribute = "interfaceName"

// sliceSyncTimeout bounds how long a lookup waits for the first LIST of the node's
// ResourceSlices, made when the first pod with claims starts. The sandbox's start waits on it;
// the answer is the node's few slices, so a healthy API server gives it in milliseconds and a
// busy one in seconds: after 10 s it is down or overloaded.
const sliceSyncTimeout = 10 * time.Second

// poolDevice names a device of a driver.
type poolDevice struct{ pool, device string }

// newestDevices returns the devices of driver's slices among slices (the node's), of the
// newest generation of each pool.
func newestDevices(slices []*resourceapi.ResourceSlice, nodeName, driver string) map[poolDevice]resourceapi.Device {
	newest := map[string]int64{}
	ours := slices[:0:0]
	for _, s := range slices {
		// The API server filters by node; the filter is repeated here for fakes.
		if s.Spec.Driver == driver && s.Spec.NodeName != nil && *s.Spec.NodeName == nodeName {
			ours = append(ours, s)
			newest[s.Spec.Pool.Name] = max(newest[s.Spec.Pool.Name], s.Spec.Pool.Generation)
		}
	}
	devices := map[poolDevice]resourceapi.Device{}
	for _, s := range ours {
		if s.Spec.Pool.Generation != newest[s.Spec.Pool.Name] {
			continue
		}
		for _, d := range s.Spec.Devices {
			devices[poolDevice{s.Spec.Pool.Name, d.Name}] = d
		}
	}
	return devices
}

// interfaceAttribute returns the string attribute of a device among devices.
func interfaceAttribute(devices map[poolDevice]resourceapi.Device, driver, pool, device, attribute string) (string, error) {
	where := fmt.Sprintf("DRA driver %s pool %s device %s", driver, pool, device)
	d, ok := devices[poolDevice{pool, device}]
	if !ok {
		return "", errdefs.ErrFailedPrecondition.WithMessage(where + ": not in the node's ResourceSlices")
	}
	value, ok := lookupAttribute(d.Attributes, driver, attribute)
	switch {
	case !ok:
		return "", errdefs.ErrFailedPrecondition.WithMessage(fmt.Sprintf("%s: no attribute %s", where, attribute))
	case value.StringValue == nil || *value.StringValue == "":
		return "", errdefs.ErrFailedPrecondition.WithMessage(fmt.Sprintf("%s: attribute %s is not a non-empty string", where, attribute))
	}
	return *value.StringValue, nil
}

// lookupAttribute finds name among attrs, where a name without a domain is in the driver's.
func lookupAttribute(attrs map[resourceapi.QualifiedName]resourceapi.DeviceAttribute, driver, name string) (resourceapi.DeviceAttribute, bool) {
	if a, ok := attrs[resourceapi.QualifiedName(name)]; ok {
		return a, true
	}
	if domain, id, ok := strings.Cut(name, "/"); ok {
		if domain != driver {
			return resourceapi.DeviceAttribute{}, false
		}
		name = id
	} else {
		name = driver + "/" + name
	}
	a, ok := attrs[resourceapi.QualifiedName(name)]
	return a, ok
}

// HostInterfaces looks up the host network interface of a node's device: the string value of
// the device's attribute (an unqualified name is in the driver's domain, so "interfaceName" and
// "<driver>/interfaceName" are the same attribute) in the driver's ResourceSlices of the node.
// Only the newest generation of the device's pool counts.
//
// It reads the slices from an informer of the node's ResourceSlices (field selector
// spec.nodeName, so its size is the node's, not the cluster's), started by the first lookup:
// one LIST then, and a watch renewed every few minutes, instead of a LIST per pod start. A node
// that never starts a pod with claims never watches. The scheduler allocated the device from
// the same slices, so they are in the API server before any pod that uses it starts.
//
// It is safe for concurrent use. Run must run for lookups to be answered.
type HostInterfaces struct {
	nodeName    string
	attribute   string
	informer    cache.SharedIndexInformer
	syncTimeout time.Duration

	want    sync.Once
	wanted  chan struct{} // closed by the first lookup: Run starts the informer
	mu      sync.Mutex
	lastErr error // the informer's last list or watch error, for lookups that time out
}

// NewHostInterfaces creates a lookup of host interface names of nodeName's devices, read with
// client from the device attribute named attribute ("" is [DefaultInterfaceNameAttribute]).
func NewHostInterfaces(client ResourceSliceWatcher, nodeName, attribute string) *HostInterfaces {
	if attribute == "" {
		attribute = DefaultInterfaceNameAttribute
	}
	selector := fields.OneTermEqualSelector(resourceapi.ResourceSliceSelectorNodeName, nodeName).String()
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = selector
			return client.ListResourceSlices(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = selector
			return client.WatchResourceSlices(ctx, o)
		},
	}
	h := &HostInterfaces{
		nodeName: nodeName, attribute: attribute,
		informer:    cache.NewSharedIndexInformer(cache.ToListWatcherWithWatchListSemantics(lw, client), &resourceapi.ResourceSlice{}, 0, cache.Indexers{}),
		syncTimeout: sliceSyncTimeout,
		wanted:      make(chan struct{}),
	}
	// Neither fails before the informer runs.
	_ = h.informer.SetTransform(func(obj any) (any, error) {
		if s, ok := obj.(*resourceapi.ResourceSlice); ok {
			s.ManagedFields = nil
		}
		return obj, nil
	})
	_ = h.informer.SetWatchErrorHandlerWithContext(func(ctx context.Context, r *cache.Reflector, err error) {
		h.mu.Lock()
		h.lastErr = err
		h.mu.Unlock()
		cache.DefaultWatchErrorHandler(ctx, r, err)
	})
	return h
}

// Run watches the node's ResourceSlices, from the first lookup until ctx ends.
func (h *HostInterfaces) Run(ctx context.Context) {
	select {
	case <-ctx.Done():
		return
	case <-h.wanted:
	}
	klog.FromContext(ctx).Info("Watching the node's ResourceSlices, for the host interfaces of its network devices", "node", h.nodeName)
	h.informer.RunWithContext(ctx)
}

// devices returns driver's devices of the node, once the informer has listed the slices; it
// starts the informer at the first call. An informer that has not listed them within the
// sync timeout (the API server down or overloaded) is errdefs.ErrUnavailable.
func (h *HostInterfaces) devices(ctx context.Context, driver string) (map[poolDevice]resourceapi.Device, error) {
	h.want.Do(func() { close(h.wanted) })
	if !h.informer.HasSynced() {
		wait, cancel := context.WithTimeout(ctx, h.syncTimeout)
		defer cancel()
		select {
		case <-h.informer.HasSyncedChecker().Done():
		case <-wait.Done():
			h.mu.Lock()
			cause := h.lastErr
			h.mu.Unlock()
			where := fmt.Sprintf("ResourceSlices of DRA driver %s on node %s", driver, h.nodeName)
			if ctx.Err() != nil {
				return nil, fmt.Errorf("%s: not listed yet: %w", where, ctx.Err())
			}
			if cause == nil {
				cause = fmt.Errorf("no answer from the API server within %s", h.syncTimeout)
			}
			return nil, fmt.Errorf("%s: %w: not listed: %w", where, errdefs.ErrUnavailable, cause)
		}
	}
	var slices []*resourceapi.ResourceSlice
	for _, obj := range h.informer.GetStore().List() {
		if s, ok := obj.(*resourceapi.ResourceSlice); ok {
			slices = append(slices, s)
		}
	}
	return newestDevices(slices, h.nodeName, driver), nil
}

// Name returns the host interface of a device. A device that is not in the node's slices, or
// lacks a string attribute, is an error of class errdefs.ErrFailedPrecondition naming driver,
// pool, device and attribute; slices not listed (the API server down) are
// errdefs.ErrUnavailable.
func (h *HostInterfaces) Name(ctx context.Context, driver, pool, device string) (string, error) {
	devices, err := h.devices(ctx, driver)
	if err != nil {
		return "", err
	}
	return interfaceAttribute(devices, driver, pool, device, h.attribute)
}

// Describe returns the host interface of a device, for its network data; ok is false when the
// device has none (a device of a driver that is not a network driver, or one the slices do not
// show).
func (h *HostInterfaces) Describe(ctx context.Context, driver, pool, device string) (name string, ok bool, err error) {
	name, err = h.Name(ctx, driver, pool, device)
	if errdefs.IsFailedPrecondition(err) {
		return "", false, nil
	}
	return name, err == nil, err
}
