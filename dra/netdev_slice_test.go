package dra

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"

	"github.com/podgate/podgate/test/kubefake"
)

// netSlice is a ResourceSlice of driver on node, of pool at generation, with devices whose
// attribute attr is the value given (none when "").
func netSlice(name, driver, node, pool string, generation int64, attr string, devices map[string]string) *resourceapi.ResourceSlice {
	s := &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: resourceapi.ResourceSliceSpec{
			Driver:   driver,
			NodeName: ptr.To(node),
			Pool:     resourceapi.ResourcePool{Name: pool, Generation: generation, ResourceSliceCount: 1},
		},
	}
	for dev, value := range devices {
		d := resourceapi.Device{Name: dev}
		if value != "" {
			d.Attributes = map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{resourceapi.QualifiedName(attr): {StringValue: ptr.To(value)}}
		}
		s.Spec.Devices = append(s.Spec.Devices, d)
	}
	return s
}

func TestHostInterfaceName(t *testing.T) {
	objs := []runtime.Object{
		netSlice("a-old", netDriver, "node-a", "node-a", 1, "interfaceName", map[string]string{"nic0": "eth-stale"}),
		netSlice("a-new", netDriver, "node-a", "node-a", 2, "interfaceName", map[string]string{"nic0": "eth5", "nic1": ""}),
		netSlice("a-qualified", netDriver, "node-a", "sriov", 1, netDriver+"/interfaceName", map[string]string{"vf0": "ens1f0v0"}),
		netSlice("a-dranet", netDriver, "node-a", "dranet", 1, "dra.net/ifName", map[string]string{"eth9": "eth9"}),
		netSlice("b", netDriver, "node-b", "node-b", 1, "interfaceName", map[string]string{"nic0": "eth6"}),
		netSlice("gpu", "gpu.example.com", "node-a", "node-a", 1, "interfaceName", map[string]string{"gpu0": "eth7"}),
		func() runtime.Object {
			s := netSlice("a-int", netDriver, "node-a", "ints", 1, "", map[string]string{"nic9": ""})
			s.Spec.Devices[0].Attributes = map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{"interfaceName": {IntValue: ptr.To[int64](3)}}
			return s
		}(),
	}
	tests := []struct {
		name, driver, pool, device, attribute string
		want                                  string
		wantErr                               string // part of the message of an ErrFailedPrecondition
	}{
		{name: "newest generation", driver: netDriver, pool: "node-a", device: "nic0", want: "eth5"},
		{name: "default attribute", driver: netDriver, pool: "node-a", device: "nic0", attribute: "", want: "eth5"},
		{name: "qualified in the slice", driver: netDriver, pool: "sriov", device: "vf0", attribute: "interfaceName", want: "ens1f0v0"},
		{name: "qualified in the lookup", driver: netDriver, pool: "node-a", device: "nic0", attribute: netDriver + "/interfaceName", want: "eth5"},
		{name: "another domain", driver: netDriver, pool: "dranet", device: "eth9", attribute: "dra.net/ifName", want: "eth9"},
		{name: "another node's device", driver: netDriver, pool: "node-b", device: "nic0", wantErr: "DRA driver net.example.com pool node-b device nic0: not in the node's ResourceSlices"},
		{name: "another driver's device", driver: netDriver, pool: "node-a", device: "gpu0", wantErr: "not in the node's ResourceSlices"},
		{name: "no attribute", driver: netDriver, pool: "node-a", device: "nic1", wantErr: "device nic1: no attribute interfaceName"},
		{name: "attribute in another domain", driver: netDriver, pool: "dranet", device: "eth9", attribute: "other.example/ifName", wantErr: "no attribute other.example/ifName"},
		{name: "not a string", driver: netDriver, pool: "ints", device: "nic9", wantErr: "attribute interfaceName is not a non-empty string"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			client := fake.NewClientset(objs...)
			attribute := tc.attribute
			if attribute == "" && tc.name != "default attribute" {
				attribute = DefaultInterfaceNameAttribute
			}
			got, err := HostInterfaceName(t.Context(), kubefake.Wrap(client), "node-a", tc.driver, tc.pool, tc.device, attribute)
			if tc.wantErr != "" {
				if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("HostInterfaceName: %v; want a failed precondition containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("HostInterfaceName = %q, %v; want %q", got, err, tc.want)
			}
			list := client.Actions()[0].(k8stesting.ListAction)
			if sel := list.GetListRestrictions().Fields.String(); sel != "spec.driver="+tc.driver+",spec.nodeName=node-a" {
				t.Errorf("field selector %q", sel)
			}
		})
	}
}

func TestHostInterfaceNameAPIDown(t *testing.T) {
	client := fake.NewClientset()
	client.PrependReactor("list", "resourceslices", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("connection refused")
	})
	_, err := HostInterfaceName(t.Context(), kubefake.Wrap(client), "node-a", netDriver, "node-a", "nic0", "")
	if !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "connection refused") {
		t.Errorf("HostInterfaceName: %v; want unavailable with the cause", err)
	}
}

func TestHostInterfacesCache(t *testing.T) {
	client := fake.NewClientset(netSlice("a", netDriver, "node-a", "node-a", 1, "interfaceName", map[string]string{"nic0": "eth5", "nic1": "eth6"}))
	var lists int
	client.PrependReactor("list", "resourceslices", func(k8stesting.Action) (bool, runtime.Object, error) {
		lists++
		return false, nil, nil
	})
	now := time.Unix(1000, 0)
	h := NewHostInterfaces(kubefake.Wrap(client), "node-a", "")
	h.now = func() time.Time { return now }
	lookup := func(device, want string, wantLists int) {
		t.Helper()
		got, err := h.Name(t.Context(), netDriver, "node-a", device)
		if err != nil || got != want || lists != wantLists {
			t.Fatalf("Name(%s) = %q, %v after %d lists; want %q after %d", device, got, err, lists, want, wantLists)
		}
	}
	lookup("nic0", "eth5", 1)
	lookup("nic1", "eth6", 1) // the same LIST

	// A device the remembered slices lack is looked up again at once.
	slice, err := client.ResourceV1().ResourceSlices().Get(t.Context(), "a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	slice.Spec.Pool.Generation = 2
	slice.Spec.Devices = append(slice.Spec.Devices, resourceapi.Device{Name: "nic2", Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
		"interfaceName": {StringValue: ptr.To("eth7")},
	}})
	for _, d := range slice.Spec.Devices {
		if d.Name == "nic0" {
			d.Attributes["interfaceName"] = resourceapi.DeviceAttribute{StringValue: ptr.To("eth50")}
		}
	}
	if _, err := client.ResourceV1().ResourceSlices().Update(t.Context(), slice, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	lookup("nic2", "eth7", 2)
	lookup("nic0", "eth50", 2) // from the new LIST

	// Forget, and the TTL, make it list again.
	h.Forget(netDriver)
	lookup("nic0", "eth50", 3)
	now = now.Add(hostInterfaceCacheTTL)
	lookup("nic0", "eth50", 4)

	if _, err := h.Name(t.Context(), netDriver, "node-a", "nic9"); !errdefs.IsFailedPrecondition(err) || lists != 5 {
		t.Errorf("Name(nic9) = %v after %d lists; want a failed precondition after 5", err, lists)
	}
}

// TestHostInterfacesDescribe: a device the slices show without the attribute has no network
// data, without a LIST per device; a network device has its host interface; an API error is
// an error.
func TestHostInterfacesDescribe(t *testing.T) {
	client := fake.NewClientset(netSlice("a", netDriver, "node-a", "node-a", 1, "interfaceName", map[string]string{"nic0": "eth5", "gpu0": ""}))
	var lists int
	client.PrependReactor("list", "resourceslices", func(k8stesting.Action) (bool, runtime.Object, error) {
		lists++
		return false, nil, nil
	})
	h := NewHostInterfaces(kubefake.Wrap(client), "node-a", "")
	for i, tt := range []struct {
		device    string
		wantName  string
		wantOK    bool
		wantLists int
	}{
		{"gpu0", "", false, 1},
		{"gpu0", "", false, 1}, // the remembered slices answer
		{"nic0", "eth5", true, 1},
		{"nic9", "", false, 2}, // not in the slices: listed again, then not a network device
	} {
		name, ok, err := h.Describe(t.Context(), netDriver, "node-a", tt.device)
		if err != nil || name != tt.wantName || ok != tt.wantOK || lists != tt.wantLists {
			t.Errorf("%d: Describe(%s) = %q, %v, %v after %d lists; want %q, %v, nil after %d", i, tt.device, name, ok, err, lists, tt.wantName, tt.wantOK, tt.wantLists)
		}
	}
	client.PrependReactor("list", "resourceslices", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("API server down")
	})
	h.Forget(netDriver)
	if _, ok, err := h.Describe(t.Context(), netDriver, "node-a", "nic0"); err == nil || ok {
		t.Errorf("Describe with the API down = %v, %v; want an error", ok, err)
	}
}
