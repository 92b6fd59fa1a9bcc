package kube

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/klog/v2"
	podsv1alpha1 "k8s.io/kubelet/pkg/apis/pods/v1alpha1"
)

// DefaultKubeletPodsAPISocket is where the kubelet (1.37, PodsAPI feature gate) serves its Pods
// API: <root dir>/pods-api/pods-api.sock under the default root dir, /var/lib/kubelet.
const DefaultKubeletPodsAPISocket = "/var/lib/kubelet/pods-api/pods-api.sock"

const (
	// podsAPICallTimeout bounds a unary call to the kubelet's Pods API and the wait for a
	// watch's first event: the kubelet answers from memory, on a local socket.
	podsAPICallTimeout = 10 * time.Second
	// podsAPIMaxMessage is the largest answer podgate takes: ListPods carries every pod of the
	// node in one message, more than gRPC's default 4 MiB on a node full of large pods.
	podsAPIMaxMessage = 64 << 20
)

// kubeletPods is a client of the kubelet's Pods API (k8s.io/kubelet/pkg/apis/pods/v1alpha1)
// on its local socket: the kubelet's own view of its pods, which needs no API server.
type kubeletPods struct {
	socket string
	conn   *grpc.ClientConn
	client podsv1alpha1.PodsClient
}

// newKubeletPods creates the client; it connects on its first call.
func newKubeletPods(socket string) (*kubeletPods, error) {
	conn, err := grpc.NewClient("unix://"+socket,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(podsAPIMaxMessage)),
		// A restarted kubelet serves again within seconds; grpc's default backoff (up to two
		// minutes) would keep podgate from seeing it for that long.
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.Config{
			BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 2 * time.Second,
		}, MinConnectTimeout: time.Second}),
	)
	if err != nil {
		return nil, fmt.Errorf("kubelet Pods API %s: %w", socket, err)
	}
	return &kubeletPods{socket: socket, conn: conn, client: podsv1alpha1.NewPodsClient(conn)}, nil
}

// close closes the connection.
func (k *kubeletPods) close() error { return k.conn.Close() }

// list returns the kubelet's pods.
func (k *kubeletPods) list(ctx context.Context) ([]*corev1.Pod, error) {
	ctx, cancel := context.WithTimeout(ctx, podsAPICallTimeout)
	defer cancel()
	resp, err := k.client.ListPods(ctx, &podsv1alpha1.ListPodsRequest{})
	if err != nil {
		return nil, fmt.Errorf("kubelet Pods API ListPods: %w", err)
	}
	pods := make([]*corev1.Pod, 0, len(resp.GetPods()))
	for _, b := range resp.GetPods() {
		pod := &corev1.Pod{}
		if err := pod.Unmarshal(b); err != nil {
			return nil, fmt.Errorf("kubelet Pods API ListPods: a pod: %w", err)
		}
		pods = append(pods, pod)
	}
	return pods, nil
}

// get returns the kubelet's pod with this UID.
func (k *kubeletPods) get(ctx context.Context, uid types.UID) (*corev1.Pod, error) {
	ctx, cancel := context.WithTimeout(ctx, podsAPICallTimeout)
	defer cancel()
	resp, err := k.client.GetPod(ctx, &podsv1alpha1.GetPodRequest{PodUID: string(uid)})
	if err != nil {
		return nil, fmt.Errorf("kubelet Pods API GetPod: %w", err)
	}
	pod := &corev1.Pod{}
	if err := pod.Unmarshal(resp.GetPod()); err != nil {
		return nil, fmt.Errorf("kubelet Pods API GetPod: %w", err)
	}
	return pod, nil
}

// watchMode says how a watch ends the kubelet's initial ADDED events (INITIAL_SYNC_COMPLETE).
type watchMode struct {
	// bookmark is the resourceVersion of a Bookmark event with the initial-events-end
	// annotation: the reflector's streaming list (SendInitialEvents), which then replaces its
	// store with the events received.
	bookmark string
	// listed are the pods of the list the watch follows (the reflector's list, then watch):
	// those the initial events leave out went between the two, and the watch deletes them.
	listed []*corev1.Pod
}

// watch opens WatchPods and waits for its first event, so that a kubelet that refuses the
// call (Unimplemented, FailedPrecondition while it initialises) is an error here.
func (k *kubeletPods) watch(ctx context.Context, mode watchMode) (watch.Interface, error) {
	ctx, cancel := context.WithCancel(ctx)
	stream, err := k.client.WatchPods(ctx, &podsv1alpha1.WatchPodsRequest{})
	if err != nil {
		cancel()
		return nil, fmt.Errorf("kubelet Pods API WatchPods: %w", err)
	}
	first, err := recvFirst(stream, cancel)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("kubelet Pods API WatchPods: %w", err)
	}
	w := &podsWatch{cancel: cancel, result: make(chan watch.Event), done: make(chan struct{}), mode: mode,
		seen: make(map[types.UID]bool)}
	go w.run(klog.FromContext(ctx), stream, first)
	return w, nil
}

// recvFirst receives a stream's first event within podsAPICallTimeout; cancel ends the
// stream when it is late.
func recvFirst(stream grpc.ServerStreamingClient[podsv1alpha1.WatchPodsEvent], cancel func()) (*podsv1alpha1.WatchPodsEvent, error) {
	timer := time.AfterFunc(podsAPICallTimeout, cancel)
	ev, err := stream.Recv()
	if !timer.Stop() && err != nil {
		return nil, status.Errorf(codes.DeadlineExceeded, "no event within %s", podsAPICallTimeout)
	}
	return ev, err
}

// podsWatch is WatchPods as a watch.Interface, for the pod informer's reflector. It ends (its
// channel closed) when the stream does: the kubelet restarted or dropped a slow client. A
// stream cannot resume, so the reflector lists again (podSource answers its next watch with
// Expired).
type podsWatch struct {
	cancel   context.CancelFunc
	result   chan watch.Event
	done     chan struct{}
	stopOnce sync.Once
	mode     watchMode
	// seen are the pods of the initial ADDED events, until INITIAL_SYNC_COMPLETE; nil after.
	seen map[types.UID]bool
}

var _ watch.Interface = (*podsWatch)(nil)

// Stop implements watch.Interface.
func (w *podsWatch) Stop() {
	w.stopOnce.Do(func() {
		close(w.done)
		w.cancel()
	})
}

// ResultChan implements watch.Interface.
func (w *podsWatch) ResultChan() <-chan watch.Event { return w.result }

func (w *podsWatch) run(logger klog.Logger, stream grpc.ServerStreamingClient[podsv1alpha1.WatchPodsEvent], ev *podsv1alpha1.WatchPodsEvent) {
	defer close(w.result)
	defer w.cancel()
	for {
		for _, e := range w.translate(logger, ev) {
			select {
			case w.result <- e:
			case <-w.done:
				return
			}
		}
		var err error
		if ev, err = stream.Recv(); err != nil {
			select {
			case <-w.done:
			default:
				logger.V(2).Info("Kubelet Pods API watch ended; listing again", "err", err)
			}
			return
		}
	}
}

// translate turns one kubelet event into the informer's watch events.
func (w *podsWatch) translate(logger klog.Logger, ev *podsv1alpha1.WatchPodsEvent) []watch.Event {
	var typ watch.EventType
	switch ev.GetType() {
	case podsv1alpha1.EventType_INITIAL_SYNC_COMPLETE:
		return w.initialSyncComplete()
	case podsv1alpha1.EventType_ADDED:
		typ = watch.Added
	case podsv1alpha1.EventType_MODIFIED:
		typ = watch.Modified
	case podsv1alpha1.EventType_DELETED:
		typ = watch.Deleted // only name, namespace and UID are sure to be set: what the cache needs
	default:
		logger.V(2).Info("Kubelet Pods API: event of an unknown type skipped", "type", ev.GetType().String())
		return nil
	}
	pod := &corev1.Pod{}
	if err := pod.Unmarshal(ev.GetPod()); err != nil {
		logger.Error(err, "Kubelet Pods API: undecodable pod skipped", "type", ev.GetType().String())
		return nil
	}
	if w.seen != nil && typ == watch.Added {
		w.seen[pod.UID] = true
	}
	return []watch.Event{{Type: typ, Object: pod}}
}

// initialSyncComplete ends the initial events: the bookmark of a streaming list, or the
// deletion of the listed pods they left out.
func (w *podsWatch) initialSyncComplete() []watch.Event {
	seen := w.seen
	w.seen = nil
	if w.mode.bookmark != "" {
		return []watch.Event{{Type: watch.Bookmark, Object: &corev1.Pod{ObjectMeta: metav1.ObjectMeta{
			ResourceVersion: w.mode.bookmark,
			Annotations:     map[string]string{metav1.InitialEventsAnnotationKey: "true"},
		}}}}
	}
	var events []watch.Event
	for _, pod := range w.mode.listed {
		if !seen[pod.UID] {
			events = append(events, watch.Event{Type: watch.Deleted, Object: pod})
		}
	}
	w.mode.listed = nil
	return events
}

// podsAPICode is the gRPC code of a Pods API call's error, for metrics and the choice of source.
func podsAPICode(err error) codes.Code {
	if err == nil {
		return codes.OK
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return codes.DeadlineExceeded
	}
	if errors.Is(err, context.Canceled) {
		return codes.Canceled
	}
	return status.Code(err)
}

// podsAPIToken is a resourceVersion of podgate's own for the kubelet's lists and streaming
// lists: the Pods API has none, and a watch cannot resume from one.
func podsAPIToken(n uint64) string { return "kubelet-pods-api-" + strconv.FormatUint(n, 10) }
