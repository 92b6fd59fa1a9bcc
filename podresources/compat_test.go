package podresources

import (
	"context"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	v1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	pb "github.com/podgate/podgate/podresources/api/v1alpha1"
	"github.com/podgate/podgate/test/testfs"
)

// multusList asks for the pod resources exactly as multus's kubelet client does: the
// upstream v1 client, a 16 MiB receive limit, a 10 s timeout, List.
func multusList(ctx context.Context, socket string) (*v1.ListPodResourcesResponse, error) {
	conn, err := grpc.NewClient("unix://"+socket,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(16*1024*1024)),
	)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return v1.NewPodResourcesListerClient(conn).List(ctx, &v1.ListPodResourcesRequest{})
}

// claimDevice is what a meta-CNI plugin takes from a DRA claim's entry.
type claimDevice struct {
	driver, pool, device string
	cdi                  []string
}

// claimDevices walks a pod's containers as multus does and returns, per container, the
// devices of the claim named claimName.
func claimDevices(resp *v1.ListPodResourcesResponse, namespace, name, claimName string) map[string][]claimDevice {
	out := map[string][]claimDevice{}
	for _, pr := range resp.GetPodResources() {
		if pr.GetNamespace() != namespace || pr.GetName() != name {
			continue
		}
		for _, c := range pr.GetContainers() {
			for _, dr := range c.GetDynamicResources() {
				if dr.GetClaimName() != claimName {
					continue
				}
				for _, cr := range dr.GetClaimResources() {
					d := claimDevice{driver: cr.GetDriverName(), pool: cr.GetPoolName(), device: cr.GetDeviceName()}
					for _, cdi := range cr.GetCdiDevices() {
						d.cdi = append(d.cdi, cdi.GetName())
					}
					out[c.GetName()] = append(out[c.GetName()], d)
				}
			}
		}
	}
	return out
}

// TestMultusFindsPodLevelClaim: a pod-level network claim, which the kubelet's own answer leaves
// out, is found by multus's client once in the pod, under its first container, with its CDI
// device ids, driver, pool and device; whether the kubelet lists the pod already or not. Once:
// multus v4.3.0 collects a claim's device ids from every container that lists it, so a claim
// under two containers gave a second network on it the first one's device again.
func TestMultusFindsPodLevelClaim(t *testing.T) {
	net := &pb.Claim{
		Namespace: "shop", Name: "web-net", Uid: "uid-web-net", PodClaimName: "net", Prepared: true,
		Devices: []*pb.Device{{
			Driver: "net.example.com", Pool: "node-a", Device: "eth1", Requests: []string{"nic"},
			CdiDeviceIds: []string{"net.example.com/nic=eth1", "net.example.com/vfio=12"},
			Network:      &pb.NetworkData{HostInterface: "eth1", InterfaceName: "net1", Ips: []string{"192.0.2.10/24"}},
		}},
	}
	want := claimDevice{driver: "net.example.com", pool: "node-a", device: "eth1", cdi: []string{"net.example.com/nic=eth1", "net.example.com/vfio=12"}}
	tests := []struct {
		name    string
		sandbox *pb.Sandbox
		kubelet []*v1.PodResources
	}{
		{
			name: "kubelet lists the pod without the pod-level claim", sandbox: sandbox(t0),
			kubelet: []*v1.PodResources{{Name: "web", Namespace: "shop", Containers: []*v1.ContainerResources{
				{Name: "sidecar"},
				{Name: "app", Devices: []*v1.ContainerDevices{{ResourceName: "example.com/sriov", DeviceIds: []string{"0000:3b:00.2"}}}},
			}}},
		},
		{name: "kubelet does not know the pod yet (RunPodSandbox in flight)", sandbox: nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src := &fakeSource{specs: map[string][]Container{"uid-web": {{Name: "sidecar"}, {Name: "app"}}}}
			src.set(1, pod("shop", "web", "uid-web", tt.sandbox, net))
			dir := testfs.ShortDir(t)
			serveKubelet(t, dir+"/kubelet.sock", &fakeKubelet{pods: tt.kubelet}, false)
			r := newRigIn(t, dir, Options{Source: src, KubeletSocket: dir + "/kubelet.sock"})

			resp, err := multusList(testContext(t), r.path)
			if err != nil {
				t.Fatal(err)
			}
			got := claimDevices(resp, "shop", "web", "web-net")
			devs := got["sidecar"]
			if len(devs) != 1 || devs[0].driver != want.driver || devs[0].pool != want.pool || devs[0].device != want.device || !slices.Equal(devs[0].cdi, want.cdi) {
				t.Errorf("container sidecar (the first): claim web-net devices %+v, want exactly %+v", devs, want)
			}
			if len(got) != 1 {
				t.Errorf("claim web-net found under %d containers, want 1 (sidecar, the first): %v", len(got), got)
			}
		})
	}
}
