package dra

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/podgate/podgate/test/kubefake"
)

var netClaimKey = types.NamespacedName{Namespace: "ns", Name: "nic"}

// netClaim is a claim allocated with devices nic0 and nic1 of netDriver; the driver wrote a
// condition for nic1.
func netClaim() *resourceapi.ResourceClaim {
	ready := metav1.Condition{Type: "Ready", Status: metav1.ConditionTrue, Reason: "Prepared", LastTransitionTime: metav1.Unix(1000, 0)}
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "nic", UID: "claim-uid"},
		Status: resourceapi.ResourceClaimStatus{
			Allocation: &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{
				{Request: "nic", Driver: netDriver, Pool: "node-a", Device: "nic0"},
				{Request: "nic", Driver: netDriver, Pool: "node-a", Device: "nic1"},
			}}},
			Devices: []resourceapi.AllocatedDeviceStatus{
				{Driver: netDriver, Pool: "node-a", Device: "nic1", Conditions: []metav1.Condition{ready}},
			},
		},
	}
}

var (
	nic0Net = DeviceNetwork{Driver: netDriver, Pool: "node-a", Device: "nic0", InterfaceName: "net1",
		IPs: []string{"192.0.2.10/24"}, HardwareAddress: "02:00:00:00:00:01"}
	nic1Net = DeviceNetwork{Driver: netDriver, Pool: "node-a", Device: "nic1", InterfaceName: "net2",
		IPs: []string{"2001:db8::10/64"}, HardwareAddress: "02:00:00:00:00:02"}
)

// staleClaim is netClaim with older network data of nic1: publishing and clearing both
// update it.
func staleClaim() *resourceapi.ResourceClaim {
	c := netClaim()
	c.Status.Devices[0].NetworkData = &resourceapi.NetworkDeviceData{InterfaceName: "old1"}
	return c
}

func networkData(d DeviceNetwork) *resourceapi.NetworkDeviceData {
	return &resourceapi.NetworkDeviceData{InterfaceName: d.InterfaceName, IPs: d.IPs, HardwareAddress: d.HardwareAddress}
}

func claimStatusDevices(t *testing.T, client *fake.Clientset) []resourceapi.AllocatedDeviceStatus {
	t.Helper()
	c, err := client.ResourceV1().ResourceClaims("ns").Get(t.Context(), "nic", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return c.Status.Devices
}

// countUpdates counts the status updates of claims.
func countUpdates(client *fake.Clientset) *int {
	n := new(int)
	client.PrependReactor("update", "resourceclaims", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() == "status" {
			*n++
		}
		return false, nil, nil
	})
	return n
}

func TestPublishNetworkData(t *testing.T) {
	client := fake.NewClientset(netClaim())
	updates := countUpdates(client)
	if err := PublishNetworkData(t.Context(), kubefake.Wrap(client), netClaimKey, "claim-uid", []DeviceNetwork{nic0Net, nic1Net}); err != nil {
		t.Fatalf("PublishNetworkData: %v", err)
	}
	want := netClaim().Status.Devices
	want[0].NetworkData = networkData(nic1Net) // the driver's condition stays
	want = append(want, resourceapi.AllocatedDeviceStatus{Driver: netDriver, Pool: "node-a", Device: "nic0", NetworkData: networkData(nic0Net)})
	if got := claimStatusDevices(t, client); !reflect.DeepEqual(got, want) {
		t.Errorf("status.devices = %+v, want %+v", got, want)
	}

	// The same data again: nothing to update.
	if err := PublishNetworkData(t.Context(), kubefake.Wrap(client), netClaimKey, "claim-uid", []DeviceNetwork{nic0Net, nic1Net}); err != nil || *updates != 1 {
		t.Errorf("PublishNetworkData again: %v after %d updates, want nil after 1", err, *updates)
	}

	if err := ClearNetworkData(t.Context(), kubefake.Wrap(client), netClaimKey, "claim-uid", []DeviceNetwork{{Driver: netDriver, Pool: "node-a", Device: "nic0"}, nic1Net}); err != nil {
		t.Fatalf("ClearNetworkData: %v", err)
	}
	if got, want := claimStatusDevices(t, client), netClaim().Status.Devices; !reflect.DeepEqual(got, want) {
		t.Errorf("status.devices after ClearNetworkData = %+v, want the driver's %+v", got, want)
	}
	if err := ClearNetworkData(t.Context(), kubefake.Wrap(client), netClaimKey, "claim-uid", []DeviceNetwork{nic0Net}); err != nil || *updates != 2 {
		t.Errorf("ClearNetworkData again: %v after %d updates, want nil after 2", err, *updates)
	}
}

// TestPublishNetworkDataConflict has another writer update the claim between podgate's read and
// its update: podgate reads again and keeps the other writer's entry.
func TestPublishNetworkDataConflict(t *testing.T) {
	client := fake.NewClientset(netClaim())
	var gets, conflicts int
	client.PrependReactor("get", "resourceclaims", func(k8stesting.Action) (bool, runtime.Object, error) {
		gets++
		return false, nil, nil
	})
	client.PrependReactor("update", "resourceclaims", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if conflicts > 0 {
			return false, nil, nil
		}
		conflicts++
		// The driver writes its status first.
		c := netClaim()
		c.Status.Devices[0].Data = &runtime.RawExtension{Raw: []byte(`{"vf":3}`)}
		if err := client.Tracker().Update(resourceapi.SchemeGroupVersion.WithResource("resourceclaims"), c, "ns"); err != nil {
			return true, nil, err
		}
		return true, nil, apierrors.NewConflict(schema.GroupResource{Group: "resource.k8s.io", Resource: "resourceclaims"}, "nic", errors.New("the object has been modified"))
	})
	if err := PublishNetworkData(t.Context(), kubefake.Wrap(client), netClaimKey, "claim-uid", []DeviceNetwork{nic1Net}); err != nil {
		t.Fatalf("PublishNetworkData: %v", err)
	}
	got := claimStatusDevices(t, client)
	if gets != 3 || len(got) != 1 || got[0].Data == nil || !reflect.DeepEqual(got[0].NetworkData, networkData(nic1Net)) {
		t.Errorf("after %d GETs status.devices = %+v; want 2 GETs (and the test's) and the driver's data with podgate's", gets, got)
	}
}

func TestPublishNetworkDataErrors(t *testing.T) {
	apiDown := func(verb string) func(*fake.Clientset) {
		return func(c *fake.Clientset) {
			c.PrependReactor(verb, "resourceclaims", func(k8stesting.Action) (bool, runtime.Object, error) {
				return true, nil, apierrors.NewServiceUnavailable("etcd is down")
			})
		}
	}
	tests := []struct {
		name      string
		objects   []runtime.Object
		setup     func(*fake.Clientset)
		devices   []DeviceNetwork
		class     error
		clearToo  bool // ClearNetworkData fails the same way; else it succeeds
		wantInMsg string
	}{
		{name: "claim missing", class: errdefs.ErrFailedPrecondition, wantInMsg: "publish network data of claim ns/nic: claim not found"},
		{name: "claim replaced", objects: []runtime.Object{func() runtime.Object {
			c := netClaim()
			c.UID = "new-uid"
			return c
		}()}, class: errdefs.ErrFailedPrecondition, wantInMsg: "claim has UID new-uid, not claim-uid"},
		{name: "device not allocated", objects: []runtime.Object{netClaim()},
			devices: []DeviceNetwork{{Driver: netDriver, Pool: "node-a", Device: "nic7"}},
			class:   errdefs.ErrFailedPrecondition, wantInMsg: "device net.example.com/node-a/nic7 is not allocated in the claim"},
		{name: "share not allocated", objects: []runtime.Object{netClaim()},
			devices: []DeviceNetwork{{Driver: netDriver, Pool: "node-a", Device: "nic0", ShareID: "s1"}},
			class:   errdefs.ErrFailedPrecondition, wantInMsg: "nic0 (share s1) is not allocated"},
		{name: "get fails", objects: []runtime.Object{netClaim()}, setup: apiDown("get"), class: errdefs.ErrUnavailable, clearToo: true, wantInMsg: "etcd is down"},
		{name: "update fails", objects: []runtime.Object{staleClaim()}, setup: apiDown("update"), class: errdefs.ErrUnavailable, clearToo: true, wantInMsg: "etcd is down"},
		{name: "conflicts forever", objects: []runtime.Object{staleClaim()}, setup: func(c *fake.Clientset) {
			c.PrependReactor("update", "resourceclaims", func(k8stesting.Action) (bool, runtime.Object, error) {
				return true, nil, apierrors.NewConflict(schema.GroupResource{Resource: "resourceclaims"}, "nic", errors.New("modified"))
			})
		}, class: errdefs.ErrUnavailable, clearToo: true, wantInMsg: "still conflicting"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			devices := tc.devices
			if devices == nil {
				devices = []DeviceNetwork{nic1Net}
			}
			client := fake.NewClientset(tc.objects...)
			if tc.setup != nil {
				tc.setup(client)
			}
			err := PublishNetworkData(t.Context(), kubefake.Wrap(client), netClaimKey, "claim-uid", devices)
			if !errors.Is(err, tc.class) || !strings.Contains(err.Error(), tc.wantInMsg) {
				t.Errorf("PublishNetworkData: %v; want class %v and %q", err, tc.class, tc.wantInMsg)
			}
			err = ClearNetworkData(t.Context(), kubefake.Wrap(client), netClaimKey, "claim-uid", devices)
			if tc.clearToo != (err != nil) || tc.clearToo && !errors.Is(err, tc.class) {
				t.Errorf("ClearNetworkData: %v; want an error of class %v: %t", err, tc.class, tc.clearToo)
			}
		})
	}
}

func TestPublishNetworkDataCallerGaveUp(t *testing.T) {
	client := fake.NewClientset(netClaim())
	ctx, cancel := context.WithCancel(t.Context())
	client.PrependReactor("get", "resourceclaims", func(k8stesting.Action) (bool, runtime.Object, error) {
		cancel()
		return true, nil, context.Canceled
	})
	err := PublishNetworkData(ctx, kubefake.Wrap(client), netClaimKey, "claim-uid", []DeviceNetwork{nic1Net})
	if !errors.Is(err, context.Canceled) || errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("PublishNetworkData: %v; want the caller's context.Canceled, not unavailable", err)
	}
}
