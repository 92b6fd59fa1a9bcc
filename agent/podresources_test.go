package agent

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/podgate/podgate/dra/dratest/rig"
	pb "github.com/podgate/podgate/podresources/api/v1alpha1"
	"github.com/podgate/podgate/test/testfs"
)

// TestPodResourcesThroughTheAgent: a running agent serves the PodResources socket from its
// registry: a pod whose claims are recorded is visible before it has a sandbox, pod-level
// claims under its (first) container. (How the service answers an unknown pod or a bad request is
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
	rig.RecordPodClaims(t, proxyOf(t, a).state.Claims, rig.WebClaims(true))

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
