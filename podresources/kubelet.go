package podresources

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"
	v1 "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// Limits of a call to the kubelet's PodResources socket.
const (
	// kubeletCallTimeout bounds one call: the kubelet answers from memory in milliseconds, and
	// podgate's own caller (multus gives List 10 s) must still get podgate's answer when the
	// kubelet hangs.
	kubeletCallTimeout = 2 * time.Second
	// MaxMessageSize is the largest answer podgate sends or takes from the kubelet: multus's
	// client accepts 16 MiB.
	MaxMessageSize = 16 << 20
)

// Results of a call to the kubelet, the result label of
// podgate_podresources_kubelet_requests_total.
const (
	kubeletOK          = "ok"
	kubeletNotFound    = "not_found"   // Get: the kubelet does not know the pod
	kubeletUnavailable = "unavailable" // no socket, not answering, or over its rate limit
	kubeletError       = "error"       // any other error
)

// kubeletClient calls the kubelet's own PodResources socket, whose devices, CPUs and memory
// podgate merges into its answers. Errors are the caller's to tolerate: the kubelet may be
// down, restarting, or not yet listening.
type kubeletClient struct {
	socket  string
	metrics *metrics

	mu     sync.Mutex
	conn   *grpc.ClientConn
	client v1.PodResourcesListerClient
	// down is true after a failed call, so that the change is logged once each way.
	down bool
	// closed: Close ran; a call still in flight at shutdown does not connect again.
	closed bool
}

// newKubeletClient returns a client for the kubelet's PodResources socket at path; it
// connects on first use.
func newKubeletClient(path string, m *metrics) *kubeletClient {
	m.kubeletUp.Set(1) // until a call says otherwise, as down starts false
	return &kubeletClient{socket: path, metrics: m}
}

func (k *kubeletClient) lister() (v1.PodResourcesListerClient, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.closed {
		return nil, errKubeletClosed
	}
	if k.client != nil {
		return k.client, nil
	}
	conn, err := grpc.NewClient("unix://"+k.socket,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(MaxMessageSize)),
		// A restarted kubelet is back within seconds; grpc's default backoff (up to two
		// minutes) would keep podgate from asking it for that long.
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.Config{
			BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 2 * time.Second,
		}, MinConnectTimeout: time.Second}),
	)
	if err != nil {
		return nil, err
	}
	k.conn, k.client = conn, v1.NewPodResourcesListerClient(conn)
	return k.client, nil
}

// Close closes the connection.
func (k *kubeletClient) Close() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.closed = true
	if k.conn == nil {
		return nil
	}
	err := k.conn.Close()
	k.conn, k.client = nil, nil
	return err
}

// List returns the kubelet's List answer.
func (k *kubeletClient) List(ctx context.Context) (*v1.ListPodResourcesResponse, error) {
	return kubeletCall(ctx, k, "List", func(ctx context.Context, c v1.PodResourcesListerClient) (*v1.ListPodResourcesResponse, error) {
		return c.List(ctx, &v1.ListPodResourcesRequest{})
	})
}

// Get returns the kubelet's Get answer; found is false, with no error, when the kubelet does
// not know the pod.
func (k *kubeletClient) Get(ctx context.Context, namespace, name string) (pr *v1.PodResources, found bool, err error) {
	resp, err := kubeletCall(ctx, k, "Get", func(ctx context.Context, c v1.PodResourcesListerClient) (*v1.GetPodResourcesResponse, error) {
		return c.Get(ctx, &v1.GetPodResourcesRequest{PodName: name, PodNamespace: namespace})
	})
	if errors.Is(err, errKubeletNotFound) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	return resp.GetPodResources(), resp.GetPodResources() != nil, nil
}

// GetAllocatableResources returns the kubelet's GetAllocatableResources answer.
func (k *kubeletClient) GetAllocatableResources(ctx context.Context) (*v1.AllocatableResourcesResponse, error) {
	return kubeletCall(ctx, k, "GetAllocatableResources", func(ctx context.Context, c v1.PodResourcesListerClient) (*v1.AllocatableResourcesResponse, error) {
		return c.GetAllocatableResources(ctx, &v1.AllocatableResourcesRequest{})
	})
}

var (
	errKubeletNotFound = errors.New("the kubelet does not know the pod")
	errKubeletClosed   = errors.New("podgate is stopping")
)

// kubeletCall makes one call with its timeout, counts it, and logs when the kubelet stops or
// starts answering.
func kubeletCall[T any](ctx context.Context, k *kubeletClient, method string, call func(context.Context, v1.PodResourcesListerClient) (T, error)) (T, error) {
	var zero T
	result, err := func() (T, error) {
		if _, err := os.Stat(k.socket); err != nil {
			return zero, fmt.Errorf("kubelet PodResources socket %s: %w", k.socket, err)
		}
		c, err := k.lister()
		if err != nil {
			return zero, fmt.Errorf("kubelet PodResources socket %s: %w", k.socket, err)
		}
		ctx, cancel := context.WithTimeout(ctx, kubeletCallTimeout)
		defer cancel()
		return call(ctx, c)
	}()
	outcome := kubeletOK
	switch {
	case err == nil:
	case method == "Get" && isKubeletNotFound(err):
		outcome, err = kubeletNotFound, errKubeletNotFound
	case ctx.Err() != nil:
		// podgate's own caller gave up: says nothing of the kubelet.
		return zero, err
	case status.Code(err) == codes.Unavailable, status.Code(err) == codes.DeadlineExceeded,
		status.Code(err) == codes.ResourceExhausted, errors.Is(err, os.ErrNotExist):
		outcome = kubeletUnavailable
	default:
		outcome = kubeletError
	}
	k.metrics.kubeletRequests.WithLabelValues(method, outcome).Inc()
	k.noteHealth(ctx, outcome, err)
	return result, err
}

// isKubeletNotFound recognises the kubelet's answer to Get for a pod it does not know: an
// error without a code (codes.Unknown) saying "not found", or NotFound.
func isKubeletNotFound(err error) bool {
	st := status.Convert(err)
	return st.Code() == codes.NotFound || st.Code() == codes.Unknown && containsFold(st.Message(), "not found")
}

func (k *kubeletClient) noteHealth(ctx context.Context, outcome string, err error) {
	failed := outcome == kubeletUnavailable || outcome == kubeletError
	k.mu.Lock()
	changed := failed != k.down
	k.down = failed
	k.mu.Unlock()
	k.metrics.kubeletUp.Set(boolFloat(!failed))
	if !changed {
		return
	}
	logger := klog.FromContext(ctx)
	if failed {
		logger.Info("The kubelet's PodResources socket does not answer; serving what podgate knows, without the kubelet's devices, CPUs and memory",
			"socket", k.socket, "err", err)
	} else {
		logger.Info("The kubelet's PodResources socket answers again", "socket", k.socket)
	}
}

func boolFloat(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
