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
	"k8s.io/klog/v2"
)

// DefaultInterfaceNameAttribute is the device attribute, in a driver's ResourceSlice, that
// names a device's network interface on the host, when podgate's configuration names none.
// dranet's is "dra.net/ifName".
const DefaultInterfaceNameAttribute = "interfaceName"

// sliceListTimeout bounds the LIST of a driver's ResourceSlices of the node. The sandbox's
// start waits on it; the answer is a few small objects, so a healthy API server gives it in
// milliseconds and a busy one in seconds: after 10 s it is down or overloaded.
const sliceListTimeout = 10 * time.Second

// hostInterfaceCacheTTL is how long [HostInterfaces] trusts one LIST of a driver's
// ResourceSlices. A pod's claims often hold several devices of one driver, and a scaled-up
// workload starts several pods at once: one LIST serves them. A driver republishes a device
// under another interface name rarely (a rename on the host); a name podgate then cannot find
// fails the attach, the caller forgets it, and the next lookup lists again.
const hostInterfaceCacheTTL = 30 * time.Second

// HostInterfaceName returns the host network interface of a device of the node: the string
// value of the device's attribute named attribute (an unqualified name is in the driver's
// domain, so "interfaceName" and "<driver>/interfaceName" are the same attribute) in the
// driver's ResourceSlices of nodeName. Only the newest generation of the device's pool counts.
// It lists those slices once, with a timeout; [HostInterfaces] remembers the answer.
//
// A device that is not in the slices, or lacks a string attribute, is an error of class
// errdefs.ErrFailedPrecondition naming driver, pool, device and attribute; an API server that
// does not answer or refuses is errdefs.ErrUnavailable.
func HostInterfaceName(ctx context.Context, client ResourceSliceLister, nodeName, driver, pool, device, attribute string) (string, error) {
	if attribute == "" {
		attribute = DefaultInterfaceNameAttribute
	}
	devices, err := listSliceDevices(ctx, client, nodeName, driver)
	if err != nil {
		return "", err
	}
	return interfaceAttribute(devices, driver, pool, device, attribute)
}

// poolDevice names a device of a driver.
type poolDevice struct{ pool, device string }

// listSliceDevices returns the devices of driver's ResourceSlices of nodeName, of the newest
// generation of each pool. The API server filters by node and driver (selectable fields of
// ResourceSlices since they exist; spec.pool.name only from Kubernetes 1.37, so the pool is
// filtered here); the filter is repeated here for fakes and older servers.
func listSliceDevices(ctx context.Context, client ResourceSliceLister, nodeName, driver string) (map[poolDevice]resourceapi.Device, error) {
	listCtx, cancel := context.WithTimeout(ctx, sliceListTimeout)
	defer cancel()
	selector := fields.AndSelectors(
		fields.OneTermEqualSelector(resourceapi.ResourceSliceSelectorNodeName, nodeName),
		fields.OneTermEqualSelector(resourceapi.ResourceSliceSelectorDriver, driver),
	)
	list, err := client.ListResourceSlices(listCtx, metav1.ListOptions{FieldSelector: selector.String()})
	if err != nil {
		where := fmt.Sprintf("list ResourceSlices of DRA driver %s on node %s", driver, nodeName)
		if ctx.Err() != nil {
			return nil, fmt.Errorf("%s: %w: %w", where, ctx.Err(), err)
		}
		return nil, fmt.Errorf("%s: %w: %w", where, errdefs.ErrUnavailable, err)
	}
	newest := map[string]int64{}
	for _, s := range list.Items {
		if s.Spec.Driver == driver && s.Spec.NodeName != nil && *s.Spec.NodeName == nodeName {
			newest[s.Spec.Pool.Name] = max(newest[s.Spec.Pool.Name], s.Spec.Pool.Generation)
		}
	}
	devices := map[poolDevice]resourceapi.Device{}
	for _, s := range list.Items {
		gen, ok := newest[s.Spec.Pool.Name]
		if s.Spec.Driver != driver || s.Spec.NodeName == nil || *s.Spec.NodeName != nodeName || !ok || s.Spec.Pool.Generation != gen {
			continue
		}
		for _, d := range s.Spec.Devices {
			devices[poolDevice{s.Spec.Pool.Name, d.Name}] = d
		}
	}
	return devices, nil
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

// HostInterfaces looks up host interface names of devices like [HostInterfaceName] and
// remembers each driver's ResourceSlices for 30 s: one LIST answers for all the devices of a
// pod, or of pods started together. A device the remembered slices do not have, or have
// without the attribute, is looked up again at once. It is safe for concurrent use.
type HostInterfaces struct {
	client    ResourceSliceLister
	nodeName  string
	attribute string
	ttl       time.Duration
	now       func() time.Time

	mu       sync.Mutex
	byDriver map[string]sliceDevices
}

// sliceDevices is one LIST's devices of a driver, and when podgate listed them.
type sliceDevices struct {
	devices map[poolDevice]resourceapi.Device
	listed  time.Time
}

// NewHostInterfaces creates a lookup of host interface names of nodeName's devices, read with
// client from the device attribute named attribute ("" is [DefaultInterfaceNameAttribute]).
func NewHostInterfaces(client ResourceSliceLister, nodeName, attribute string) *HostInterfaces {
	if attribute == "" {
		attribute = DefaultInterfaceNameAttribute
	}
	return &HostInterfaces{
		client: client, nodeName: nodeName, attribute: attribute,
		ttl: hostInterfaceCacheTTL, now: time.Now,
		byDriver: map[string]sliceDevices{},
	}
}

// Name returns the host interface of a device, as [HostInterfaceName] does.
func (h *HostInterfaces) Name(ctx context.Context, driver, pool, device string) (string, error) {
	h.mu.Lock()
	cached, ok := h.byDriver[driver]
	h.mu.Unlock()
	if ok && h.now().Sub(cached.listed) < h.ttl {
		if name, err := interfaceAttribute(cached.devices, driver, pool, device, h.attribute); err == nil {
			return name, nil
		}
	}
	listed := h.now()
	devices, err := listSliceDevices(ctx, h.client, h.nodeName, driver)
	if err != nil {
		return "", err
	}
	h.mu.Lock()
	if cur, ok := h.byDriver[driver]; !ok || !cur.listed.After(listed) {
		h.byDriver[driver] = sliceDevices{devices: devices, listed: listed}
	}
	h.mu.Unlock()
	klog.FromContext(ctx).V(4).Info("Listed ResourceSlices", "driver", driver, "node", h.nodeName, "devices", len(devices))
	return interfaceAttribute(devices, driver, pool, device, h.attribute)
}

// Describe returns the host interface of a device, for its network data; ok is false when the
// device has none (a device of a driver that is not a network driver). Unlike Name, it takes
// the remembered slices' word for a device they show without the attribute, so that describing
// the devices of other drivers costs one LIST per driver and cache period, not one per device.
func (h *HostInterfaces) Describe(ctx context.Context, driver, pool, device string) (name string, ok bool, err error) {
	h.mu.Lock()
	cached, cok := h.byDriver[driver]
	h.mu.Unlock()
	if cok && h.now().Sub(cached.listed) < h.ttl {
		if _, known := cached.devices[poolDevice{pool, device}]; known {
			name, err := interfaceAttribute(cached.devices, driver, pool, device, h.attribute)
			return name, err == nil, nil
		}
	}
	name, err = h.Name(ctx, driver, pool, device)
	if errdefs.IsFailedPrecondition(err) {
		return "", false, nil
	}
	return name, err == nil, err
}

// Forget drops what h remembers of driver's slices, so that the next lookup lists them: call it
// when the host interface of one of its devices was not where the slices said.
func (h *HostInterfaces) Forget(driver string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.byDriver, driver)
}
