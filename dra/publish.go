package dra

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/containerd/errdefs"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
)

// claimStatusCallTimeout bounds each GET and status update of a claim when podgate publishes
// network data. A healthy API server answers in milliseconds and a busy one in seconds; the
// sandbox's start or stop waits on it, so no answer after 10 s means the API server is down or
// overloaded, and podgate reports that rather than holding the kubelet.
const claimStatusCallTimeout = 10 * time.Second

// DeviceNetwork is the network data of one allocated device, as podgate publishes it in the
// status of the device's claim (KEP-4817, status.devices[].networkData).
type DeviceNetwork struct {
	// Driver, Pool and Device name the allocated device.
	Driver string
	Pool   string
	Device string
	// ShareID is the allocation's share of the device (DRAConsumableCapacity); empty when
	// the device is not shared.
	ShareID string
	// InterfaceName is the device's interface name in the pod.
	InterfaceName string
	// IPs are the interface's addresses in CIDR notation ("192.0.2.10/24").
	IPs []string
	// HardwareAddress is the interface's MAC address.
	HardwareAddress string
}

// PublishNetworkData writes the network data of devices, allocated in the claim with UID
// claimUID, into the claim's status.devices: it adds an entry for a device that has none and
// replaces the networkData of an entry that exists, keeping what the driver wrote there
// (conditions, data). It reads the claim and updates its status subresource, again on a
// conflict.
//
// The API server accepts entries of allocated devices only; podgate checks that first. With
// the DRAResourceClaimGranularStatusAuthorization feature, podgate's identity also needs the
// verb "associated-node:update" on resourceclaims/driver for each device's driver.
//
// Errors are classified: the claim missing, replaced (another UID) or not allocated with the
// devices is errdefs.ErrFailedPrecondition; an API server that does not answer or refuses is
// errdefs.ErrUnavailable.
func PublishNetworkData(ctx context.Context, client ResourceClaimStatusClient, claim types.NamespacedName, claimUID types.UID, devices []DeviceNetwork) error {
	err := updateDeviceStatus(ctx, client, claim, claimUID, "publish network data", errdefs.ErrFailedPrecondition, func(c *resourceapi.ResourceClaim) (bool, error) {
		return setNetworkData(c, devices)
	})
	if err == nil {
		klog.FromContext(ctx).V(2).Info("Published network data", "claim", klog.KRef(claim.Namespace, claim.Name), "devices", len(devices))
	}
	return err
}

// ClearNetworkData removes the network data of devices from the status of the claim with UID
// claimUID: the networkData of their entries, and the entries that then hold nothing else.
// Only the driver, pool, device and share of each DeviceNetwork matter. A claim that is gone
// or was replaced has nothing to clear: that is success. Errors are classified as for
// [PublishNetworkData].
func ClearNetworkData(ctx context.Context, client ResourceClaimStatusClient, claim types.NamespacedName, claimUID types.UID, devices []DeviceNetwork) error {
	err := updateDeviceStatus(ctx, client, claim, claimUID, "clear network data", errdefs.ErrNotFound, func(c *resourceapi.ResourceClaim) (bool, error) {
		return clearNetworkData(c, devices), nil
	})
	if errdefs.IsNotFound(err) {
		klog.FromContext(ctx).V(2).Info("Claim gone, no network data to clear", "claim", klog.KRef(claim.Namespace, claim.Name), "uid", claimUID)
		return nil
	}
	return err
}

// updateDeviceStatus reads the claim, lets change modify it and, when it did, updates the
// claim's status; on a conflict it starts again from a fresh read. A claim that is missing or
// has another UID is an error of class gone: each caller says what that means to it.
func updateDeviceStatus(ctx context.Context, client ResourceClaimStatusClient, key types.NamespacedName, uid types.UID, op string,
	gone interface{ WithMessage(string) error }, change func(*resourceapi.ResourceClaim) (bool, error),
) error {
	where := fmt.Sprintf("%s of claim %s/%s", op, key.Namespace, key.Name)
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		getCtx, cancel := context.WithTimeout(ctx, claimStatusCallTimeout)
		defer cancel()
		claim, err := client.GetResourceClaim(getCtx, key.Namespace, key.Name)
		switch {
		case apierrors.IsNotFound(err):
			return gone.WithMessage(where + ": claim not found")
		case err != nil:
			return claimStatusAPIError(ctx, where, err)
		case claim.UID != uid:
			return gone.WithMessage(fmt.Sprintf("%s: claim has UID %s, not %s", where, claim.UID, uid))
		}
		changed, err := change(claim)
		if err != nil || !changed {
			return err
		}
		updCtx, cancel := context.WithTimeout(ctx, claimStatusCallTimeout)
		defer cancel()
		_, err = client.UpdateResourceClaimStatus(updCtx, claim)
		if err != nil && !apierrors.IsConflict(err) {
			return claimStatusAPIError(ctx, where, err)
		}
		return err // a conflict, as it is, for RetryOnConflict
	})
	if apierrors.IsConflict(err) {
		return fmt.Errorf("%s: %w: still conflicting after %d attempts: %w", where, errdefs.ErrUnavailable, retry.DefaultRetry.Steps, err)
	}
	return err
}

// claimStatusAPIError classifies a failed API call: the caller's own context error when the
// caller gave up, else errdefs.ErrUnavailable.
func claimStatusAPIError(ctx context.Context, where string, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("%s: %w: %w", where, ctx.Err(), err)
	}
	return fmt.Errorf("%s: %w: %w", where, errdefs.ErrUnavailable, err)
}

// setNetworkData sets the networkData of devices in claim's status, after checking that they
// are allocated in it. It reports whether anything changed.
func setNetworkData(claim *resourceapi.ResourceClaim, devices []DeviceNetwork) (bool, error) {
	changed := false
	for _, d := range devices {
		if !allocatedIn(claim, d) {
			return false, errdefs.ErrFailedPrecondition.WithMessage(fmt.Sprintf(
				"claim %s/%s: device %s is not allocated in the claim", claim.Namespace, claim.Name, d.id()))
		}
		data := &resourceapi.NetworkDeviceData{InterfaceName: d.InterfaceName, IPs: d.IPs, HardwareAddress: d.HardwareAddress}
		i := statusIndex(claim, d)
		if i < 0 {
			claim.Status.Devices = append(claim.Status.Devices, resourceapi.AllocatedDeviceStatus{
				Driver: d.Driver, Pool: d.Pool, Device: d.Device, ShareID: d.shareID(), NetworkData: data,
			})
			changed = true
			continue
		}
		if !equality.Semantic.DeepEqual(claim.Status.Devices[i].NetworkData, data) {
			claim.Status.Devices[i].NetworkData = data
			changed = true
		}
	}
	return changed, nil
}

// clearNetworkData drops the networkData of devices from claim's status, and the entries left
// empty. It reports whether anything changed.
func clearNetworkData(claim *resourceapi.ResourceClaim, devices []DeviceNetwork) bool {
	changed := false
	for _, d := range devices {
		i := statusIndex(claim, d)
		if i < 0 || claim.Status.Devices[i].NetworkData == nil {
			continue
		}
		changed = true
		st := &claim.Status.Devices[i]
		st.NetworkData = nil
		if len(st.Conditions) == 0 && st.Data == nil {
			claim.Status.Devices = slices.Delete(claim.Status.Devices, i, i+1)
		}
	}
	return changed
}

// statusIndex is the index of d's entry in claim's status.devices, -1 when it has none.
func statusIndex(claim *resourceapi.ResourceClaim, d DeviceNetwork) int {
	return slices.IndexFunc(claim.Status.Devices, func(st resourceapi.AllocatedDeviceStatus) bool {
		return st.Driver == d.Driver && st.Pool == d.Pool && st.Device == d.Device && ptr.Deref(st.ShareID, "") == d.ShareID
	})
}

// allocatedIn reports whether d is one of claim's allocated devices.
func allocatedIn(claim *resourceapi.ResourceClaim, d DeviceNetwork) bool {
	if claim.Status.Allocation == nil {
		return false
	}
	return slices.ContainsFunc(claim.Status.Allocation.Devices.Results, func(r resourceapi.DeviceRequestAllocationResult) bool {
		return r.Driver == d.Driver && r.Pool == d.Pool && r.Device == d.Device && string(ptr.Deref(r.ShareID, "")) == d.ShareID
	})
}

func (d DeviceNetwork) id() string {
	id := d.Driver + "/" + d.Pool + "/" + d.Device
	if d.ShareID != "" {
		id += " (share " + d.ShareID + ")"
	}
	return id
}

func (d DeviceNetwork) shareID() *string {
	if d.ShareID == "" {
		return nil
	}
	return &d.ShareID
}
