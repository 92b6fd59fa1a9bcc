package dra

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
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

// runHostInterfaces starts h until the test ends.
func runHostInterfaces(t *testing.T, h *HostInterfaces) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		h.Run(t.Context())
	}()
	t.Cleanup(func() { <-done })
}

// countLists counts the LISTs of ResourceSlices client is asked for.
func countLists(client *fake.Clientset) *atomic.Int32 {
	var lists atomic.Int32
	client.PrependReactor("list", "resourceslices", func(k8stesting.Action) (bool, runtime.Object, error) {
		lists.Add(1)
		return false, nil, nil
	})
	return &lists
}

func TestHostInterfacesName(t *testing.T) {
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
			h := NewHostInterfaces(kubefake.Wrap(client), "node-a", attribute)
			runHostInterfaces(t, h)
			got, err := h.Name(t.Context(), tc.driver, tc.pool, tc.device)
			if tc.wantErr != "" {
				if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Name: %v; want a failed precondition containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("Name = %q, %v; want %q", got, err, tc.want)
			}
			// One LIST, of the node's slices only (every driver's).
			list := client.Actions()[0].(k8stesting.ListAction)
			if sel := list.GetListRestrictions().Fields.String(); sel != "spec.nodeName=node-a" {
				t.Errorf("field selector %q", sel)
			}
		})
	}
}

// TestHostInterfacesAPIDown: slices that cannot be listed make a lookup fail, after the sync
// timeout, as unavailable with the API server's error.
func TestHostInterfacesAPIDown(t *testing.T) {
	client := fake.NewClientset()
	lists := make(chan struct{}, 10)
	client.PrependReactor("list", "resourceslices", func(k8stesting.Action) (bool, runtime.Object, error) {
		lists <- struct{}{}
		return true, nil, errors.New("connection refused")
	})
	h := NewHostInterfaces(kubefake.Wrap(client), "node-a", "")
	runHostInterfaces(t, h)
	h.want.Do(func() { close(h.wanted) })
	// The informer reports a failed LIST before it retries: after the second, the first's
	// error is known.
	<-lists
	<-lists
	h.syncTimeout = 0
	_, err := h.Name(t.Context(), netDriver, "node-a", "nic0")
	if !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "connection refused") {
		t.Errorf("Name: %v; want unavailable with the cause", err)
	}
}

// TestHostInterfacesWatch: lookups read the informer's slices: one LIST, at the first lookup,
// however many lookups follow, and a slice the driver republishes is seen without another.
func TestHostInterfacesWatch(t *testing.T) {
	client := fake.NewClientset(netSlice("a", netDriver, "node-a", "node-a", 1, "interfaceName", map[string]string{"nic0": "eth5", "nic1": "eth6"}))
	lists := countLists(client)
	h := NewHostInterfaces(kubefake.Wrap(client), "node-a", "")
	runHostInterfaces(t, h)
	lookup := func(device, want string) {
		t.Helper()
		if got, err := h.Name(t.Context(), netDriver, "node-a", device); err != nil || got != want {
			t.Fatalf("Name(%s) = %q, %v; want %q", device, got, err, want)
		}
	}
	if n := lists.Load(); n != 0 {
		t.Fatalf("%d LISTs before the first lookup; want none", n)
	}
	lookup("nic0", "eth5")
	lookup("nic1", "eth6")

	// The driver publishes a new generation: a new device, nic0 renamed.
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
	// The watch brings it.
	err = wait.PollUntilContextTimeout(t.Context(), time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		name, err := h.Name(ctx, netDriver, "node-a", "nic2")
		return err == nil && name == "eth7", nil
	})
	if err != nil {
		t.Fatalf("nic2 never seen: %v", err)
	}
	lookup("nic0", "eth50")
	if _, err := h.Name(t.Context(), netDriver, "node-a", "nic9"); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("Name(nic9) = %v; want a failed precondition", err)
	}
	if n := lists.Load(); n != 1 {
		t.Errorf("%d LISTs of ResourceSlices; want 1", n)
	}
}

// TestHostInterfacesDescribe: a device the slices show without the attribute, or do not show,
// has no network data; a network device has its host interface; all from one LIST.
func TestHostInterfacesDescribe(t *testing.T) {
	client := fake.NewClientset(netSlice("a", netDriver, "node-a", "node-a", 1, "interfaceName", map[string]string{"nic0": "eth5", "gpu0": ""}))
	lists := countLists(client)
	h := NewHostInterfaces(kubefake.Wrap(client), "node-a", "")
	runHostInterfaces(t, h)
	for i, tt := range []struct {
		device   string
		wantName string
		wantOK   bool
	}{
		{"gpu0", "", false},
		{"nic0", "eth5", true},
		{"nic9", "", false},
	} {
		name, ok, err := h.Describe(t.Context(), netDriver, "node-a", tt.device)
		if err != nil || name != tt.wantName || ok != tt.wantOK {
			t.Errorf("%d: Describe(%s) = %q, %v, %v; want %q, %v, nil", i, tt.device, name, ok, err, tt.wantName, tt.wantOK)
		}
	}
	if n := lists.Load(); n != 1 {
		t.Errorf("%d LISTs of ResourceSlices; want 1", n)
	}
}
