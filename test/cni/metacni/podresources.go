package main

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	v1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	pb "github.com/podgate/podgate/podresources/api/v1alpha1"
)

// Limits of a PodResources call, multus's: its kubelet client gives a call 10 s and accepts
// answers of up to 16 MiB.
const (
	podResourcesTimeout = 10 * time.Second
	podResourcesMaxSize = 16 << 20
)

// podResources asks podgate's PodResources socket about a pod.
type podResources struct {
	conn *grpc.ClientConn
}

// dialPodResources connects to the socket as multus connects to the kubelet's (the connection
// is made on the first call).
func dialPodResources(socket string) (*podResources, error) {
	conn, err := grpc.NewClient("unix://"+socket,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(podResourcesMaxSize)))
	if err != nil {
		return nil, fmt.Errorf("podResourcesSocket %s: %w", socket, err)
	}
	return &podResources{conn: conn}, nil
}

func (p *podResources) Close() error { return p.conn.Close() }

// extensionGet calls podgate's extension Get. A pod podgate does not know is found = false, not
// an error.
func (p *podResources) extensionGet(ctx context.Context, pod podRef) (_ *pb.Pod, found bool, _ error) {
	ctx, cancel := context.WithTimeout(ctx, podResourcesTimeout)
	defer cancel()
	resp, err := pb.NewPodResourcesClient(p.conn).Get(ctx, &pb.GetRequest{PodName: pod.Name, PodNamespace: pod.Namespace})
	if status.Code(err) == codes.NotFound {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("podgate PodResources Get %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	return resp.GetPod(), true, nil
}

// v1Get calls the kubelet-compatible v1 Get, with multus's client options. A pod the service
// does not know is found = false, not an error.
func (p *podResources) v1Get(ctx context.Context, pod podRef) (_ *v1.PodResources, found bool, _ error) {
	ctx, cancel := context.WithTimeout(ctx, podResourcesTimeout)
	defer cancel()
	resp, err := v1.NewPodResourcesListerClient(p.conn).Get(ctx, &v1.GetPodResourcesRequest{PodName: pod.Name, PodNamespace: pod.Namespace})
	if status.Code(err) == codes.NotFound {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("v1 PodResources Get %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	return resp.GetPodResources(), true, nil
}

// describeExtension turns the extension's pod into its record.
func describeExtension(p *pb.Pod, found bool) *extensionAnswer {
	a := &extensionAnswer{Found: found, UID: p.GetUid(), SandboxID: p.GetSandbox().GetId()}
	for _, c := range p.GetClaims() {
		for _, d := range c.GetDevices() {
			n := d.GetNetwork()
			a.Devices = append(a.Devices, extensionDevice{
				ClaimNamespace: c.GetNamespace(), ClaimName: c.GetName(), PodClaimName: c.GetPodClaimName(),
				Driver: d.GetDriver(), Pool: d.GetPool(), Device: d.GetDevice(),
				HostInterface: n.GetHostInterface(), InterfaceName: n.GetInterfaceName(),
				IPs: n.GetIps(), MTU: n.GetMtu(), Attached: n.GetAttached(),
			})
		}
	}
	return a
}

// describeV1 turns the v1 answer into its record: the DRA claims of each container.
func describeV1(pr *v1.PodResources, found bool) *v1Answer {
	a := &v1Answer{Found: found}
	for _, c := range pr.GetContainers() {
		vc := v1Container{Name: c.GetName()}
		for _, dr := range c.GetDynamicResources() {
			r := dynamicResource{ClaimNamespace: dr.GetClaimNamespace(), ClaimName: dr.GetClaimName()}
			for _, cr := range dr.GetClaimResources() {
				r.Devices = append(r.Devices, claimDevice{Driver: cr.GetDriverName(), Pool: cr.GetPoolName(), Device: cr.GetDeviceName()})
			}
			vc.DynamicResources = append(vc.DynamicResources, r)
		}
		a.Containers = append(a.Containers, vc)
	}
	return a
}
