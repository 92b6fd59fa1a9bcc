package agent

import (
	"context"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	v1 "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// kubeletGetTimeout bounds the question to the kubelet: it answers from memory, and
// RunPodSandbox waits for it.
const kubeletGetTimeout = 2 * time.Second

// kubeletPodsClient asks the kubelet's PodResources socket whether it manages a pod (Get: a
// pod the kubelet does not have is NotFound).
type kubeletPodsClient struct {
	socket string

	once   sync.Once
	client v1.PodResourcesListerClient
	err    error
}

var _ kubeletPods = (*kubeletPodsClient)(nil)

func newKubeletPods(socket string) *kubeletPodsClient { return &kubeletPodsClient{socket: socket} }

// KnowsPod implements kubeletPods.
func (k *kubeletPodsClient) KnowsPod(ctx context.Context, namespace, name string) (bool, error) {
	k.once.Do(func() {
		conn, err := grpc.NewClient("unix://"+k.socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
		k.client, k.err = v1.NewPodResourcesListerClient(conn), err
	})
	if k.err != nil {
		return false, fmt.Errorf("kubelet PodResources %s: %w", k.socket, k.err)
	}
	ctx, cancel := context.WithTimeout(ctx, kubeletGetTimeout)
	defer cancel()
	_, err := k.client.Get(ctx, &v1.GetPodResourcesRequest{PodNamespace: namespace, PodName: name})
	switch status.Code(err) {
	case codes.OK:
		return true, nil
	case codes.NotFound:
		return false, nil
	}
	return false, fmt.Errorf("kubelet PodResources Get %s/%s: %w", namespace, name, err)
}
