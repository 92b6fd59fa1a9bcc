package agent

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/podgate/podgate/cri/registry"
	"github.com/podgate/podgate/dra/manager"
	pb "github.com/podgate/podgate/podresources/api/v1alpha1"
	"github.com/podgate/podgate/test/testfs"
)

func webClaims(prepared bool) manager.PodClaims {
	pc := manager.PodClaims{
		Pod: registry.PodRef{UID: "uid-web", Name: "web", Namespace: "ns"},
		Claims: []manager.ClaimRecord{{
			UID: "claim-uid", Namespace: "ns", Name: "web-nic", PodClaimName: "nic", Drivers: []string{"net.example.com"},
		}},
		Containers: []manager.ContainerClaims{{Name: "app"}, {Name: "side"}},
	}
	if prepared {
		pc.Claims[0].Prepared = true
		pc.Claims[0].Devices = []manager.DeviceRecord{{
			Driver: "net.example.com", Pool: "node-a", Device: "nic0", Requests: []string{"nic"},
			CDIDeviceIDs: []string{"net.example.com/nic=nic0"},
			Network:      &manager.DeviceNetworkRecord{HostInterface: "eth5", InterfaceName: "net1", MTU: 1400, Addresses: []string{"192.0.2.10/24"}},
		}}
	}
	return pc
}

// TestPodResourcesThroughTheAgent: a running agent serves the PodResources socket from its
// registry: a pod whose claims are recorded is visible before it has a sandbox, pod-level
// claims under every container. (How the service answers an unknown pod or a bad request is
// package podresources' to test.)
func TestPodResourcesThroughTheAgent(t *testing.T) {
	dir := testfs.ShortDir(t)
	_, backend := startFakeRuntime(t, dir)
	cfg := testConfig(dir, backend)
	a := newAgent(t, cfg)
	stop := runAgentOf(t, a)
	defer func() {
		if err := stop(); err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	waitRebuilt(t, a)
	recordPodClaims(t, proxyOf(t, a).state.Claims, webClaims(true))

	conn, err := grpc.NewClient("unix://"+*cfg.PodResources.Socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ext := pb.NewPodResourcesClient(conn)
	got, err := waitGet(t, ext, "ns", "web")
	if err != nil {
		t.Fatalf("Get(ns/web): %v", err)
	}
	dev := got.GetPod().GetClaims()[0].GetDevices()[0]
	if dev.GetNetwork().GetHostInterface() != "eth5" || dev.GetNetwork().GetInterfaceName() != "net1" || got.GetPod().GetSandbox() != nil {
		t.Errorf("Get(ns/web) = %v; want the claim's device with host interface eth5, name net1, and no sandbox yet", got)
	}
}

// waitGet calls Get once the socket is served (Run may not have bound it yet).
func waitGet(t *testing.T, c pb.PodResourcesClient, ns, name string) (*pb.GetResponse, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	return c.Get(ctx, &pb.GetRequest{PodName: name, PodNamespace: ns}, grpc.WaitForReady(true))
}
