package dra_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2/ktesting"
	drapbv1 "k8s.io/kubelet/pkg/apis/dra/v1"
	drapbv1beta1 "k8s.io/kubelet/pkg/apis/dra/v1beta1"

	"github.com/podgate/podgate/dra"
)

// examplePlugin is a DRA driver's node plugin as drivers write it on the upstream helper: it
// prepares each allocated device of its own as one CDI device.
type examplePlugin struct {
	driver string

	mu         sync.Mutex
	prepared   map[types.UID]bool
	unprepared []types.UID
	errs       []error
}

func (p *examplePlugin) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	results := map[types.UID]kubeletplugin.PrepareResult{}
	for _, c := range claims {
		var r kubeletplugin.PrepareResult
		for _, a := range c.Status.Allocation.Devices.Results {
			if a.Driver != p.driver {
				continue
			}
			r.Devices = append(r.Devices, kubeletplugin.Device{
				Requests:     []string{a.Request},
				PoolName:     a.Pool,
				DeviceName:   a.Device,
				CDIDeviceIDs: []string{p.driver + "/net=" + a.Device},
			})
		}
		p.prepared[c.UID] = true
		results[c.UID] = r
	}
	return results, nil
}

func (p *examplePlugin) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	results := map[types.UID]error{}
	for _, c := range claims {
		delete(p.prepared, c.UID)
		p.unprepared = append(p.unprepared, c.UID)
		results[c.UID] = nil
	}
	return results, nil
}

func (p *examplePlugin) HandleError(ctx context.Context, err error, msg string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.errs = append(p.errs, err)
}

func (p *examplePlugin) WatchHealthStatus(ctx context.Context, reports chan<- kubeletplugin.DeviceHealthReport) error {
	return kubeletplugin.ErrHealthNotSupported
}

// TestKubeletPluginDriver: a driver built on k8s.io/dynamic-resource-allocation/kubeletplugin,
// as real DRA drivers are, registers in the registry and is found, prepared and unprepared
// through its v1 service, and forgotten when it stops. The helper reads the claims from the
// API; a fake clientset holding the allocated claim stands in for the API server.
func TestKubeletPluginDriver(t *testing.T) {
	const name = "net.example.com"
	n := newNode(t)
	claim := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "nic", UID: "uid-nic"},
		Status: resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{
			Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{
				{Request: "nic", Driver: name, Pool: "node-a", Device: "eth1"},
			}},
		}},
	}
	plugin := &examplePlugin{driver: name, prepared: map[types.UID]bool{}}
	dataDir := filepath.Join(n.plugins, name)
	if err := os.Mkdir(dataDir, 0o750); err != nil {
		t.Fatal(err)
	}
	_, ctx := ktesting.NewTestContext(t)
	helper, err := kubeletplugin.Start(ctx, plugin,
		kubeletplugin.DriverName(name),
		kubeletplugin.KubeClient(fake.NewClientset(claim)),
		kubeletplugin.NodeName("node-a"),
		kubeletplugin.RegistrarDirectoryPath(n.registry),
		kubeletplugin.PluginDataDirectoryPath(dataDir),
	)
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			helper.Stop()
		}
	})

	d := startDiscovery(t, n)
	drv := d.waitFor(t, name)
	if drv.Endpoint() != filepath.Join(dataDir, "dra.sock") {
		t.Errorf("endpoint %s, want the helper's dra.sock in %s", drv.Endpoint(), dataDir)
	}
	for _, svc := range []string{drapbv1.DRAPluginService, drapbv1beta1.DRAPluginService} {
		if !slices.Contains(drv.Versions(), svc) {
			t.Errorf("versions %q lack %s", drv.Versions(), svc)
		}
	}
	if drv.Service() != drapbv1.DRAPluginService {
		t.Errorf("Service() = %s, want %s", drv.Service(), drapbv1.DRAPluginService)
	}

	c := dra.Claim{Namespace: "default", Name: "nic", UID: "uid-nic"}
	results, err := drv.Prepare(context.Background(), []dra.Claim{c})
	if err != nil {
		t.Fatalf("Prepare: %v", err)
	}
	want := []dra.Device{{Requests: []string{"nic"}, Pool: "node-a", Name: "eth1", CDIDeviceIDs: []string{name + "/net=eth1"}}}
	if got := results[c.UID].Devices; !sameDevices(got, want) {
		t.Errorf("devices %+v, want %+v", got, want)
	}
	if _, err := drv.Unprepare(context.Background(), []dra.Claim{c}); err != nil {
		t.Fatalf("Unprepare: %v", err)
	}
	plugin.mu.Lock()
	if len(plugin.prepared) != 0 || !slices.Equal(plugin.unprepared, []types.UID{c.UID}) {
		t.Errorf("the driver holds %v and unprepared %v; want nothing held, %s unprepared", plugin.prepared, plugin.unprepared, c.UID)
	}
	plugin.mu.Unlock()

	// podgate only looked: the registration is the kubelet's to confirm.
	if st := helper.RegistrationStatus(); st != nil {
		t.Errorf("the driver got a registration status %v; only the kubelet sends one", st)
	}

	helper.Stop()
	stopped = true
	d.waitUntil(t, "forgotten", func() bool { _, ok := d.Get(name); return !ok })
	plugin.mu.Lock()
	defer plugin.mu.Unlock()
	if len(plugin.errs) != 0 {
		t.Errorf("the driver's gRPC servers failed: %v", plugin.errs)
	}
}
