package podresources

import (
	"cmp"
	"context"
	"slices"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/podgate/podgate/podresources/api/v1alpha1"
)

// extension serves podgate.podresources.v1alpha1.PodResources.
type extension struct {
	pb.UnimplementedPodResourcesServer
	source      Source
	broadcaster *Broadcaster
	// pulls is nil when podgate shows no pulls.
	pulls PullLister
	// sendTimeout ends a watch whose event could not be sent for that long; onStall tells
	// of it.
	sendTimeout time.Duration
	onStall     func(context.Context)
}

var _ pb.PodResourcesServer = (*extension)(nil)

// List implements pb.PodResourcesServer.
func (e *extension) List(context.Context, *pb.ListRequest) (*pb.ListResponse, error) {
	pods, _ := e.source.Pods()
	slices.SortFunc(pods, func(a, b *pb.Pod) int {
		return cmp.Or(cmp.Compare(a.GetNamespace(), b.GetNamespace()), cmp.Compare(a.GetName(), b.GetName()), cmp.Compare(a.GetUid(), b.GetUid()))
	})
	return &pb.ListResponse{Pods: pods}, nil
}

// Get implements pb.PodResourcesServer.
func (e *extension) Get(_ context.Context, req *pb.GetRequest) (*pb.GetResponse, error) {
	if err := validPodRef("pod_name", req.GetPodName(), "pod_namespace", req.GetPodNamespace()); err != nil {
		return nil, err
	}
	p, ok := e.source.Pod(req.GetPodNamespace(), req.GetPodName())
	if !ok {
		return nil, status.Errorf(codes.NotFound, "pod %s/%s: not known to podgate", req.GetPodNamespace(), req.GetPodName())
	}
	return &pb.GetResponse{Pod: p}, nil
}

// Watch implements pb.PodResourcesServer: the known pods as POD_ADDED, SYNCED, then every
// change of a later revision.
func (e *extension) Watch(_ *pb.WatchRequest, stream grpc.ServerStreamingServer[pb.WatchEvent]) error {
	// Subscribe before reading the pods: a change between the two is both in the pods read
	// and in the buffer, and skipped there by its revision.
	w, ok := e.broadcaster.subscribe()
	if !ok {
		return status.Errorf(codes.ResourceExhausted, "podgate serves %d watches at most and they are all taken (or podgate is stopping)", e.broadcaster.max)
	}
	defer e.broadcaster.unsubscribe(w)
	send := e.sender(stream)
	pods, rev := e.source.Pods()
	for _, p := range pods {
		if err := send(&pb.WatchEvent{Type: pb.WatchEvent_POD_ADDED, Pod: p, Revision: rev}); err != nil {
			return err
		}
	}
	if err := send(&pb.WatchEvent{Type: pb.WatchEvent_SYNCED, Revision: rev}); err != nil {
		return err
	}
	ctx := stream.Context()
	for {
		select {
		case ev, ok := <-w.ch:
			if !ok {
				if e.broadcaster.wasDropped(w) {
					return status.Errorf(codes.ResourceExhausted, "watch ended: the client fell %d events behind; list and watch again", e.broadcaster.buffer)
				}
				return status.Error(codes.Unavailable, "podgate is stopping")
			}
			if ev.GetRevision() <= rev {
				continue
			}
			if err := send(ev); err != nil {
				return err
			}
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		}
	}
}

// sender is stream's Send, which ends the watch when a send waits sendTimeout for a client
// that does not read: grpc-go's Send blocks once 64 KiB wait for the client's flow-control
// window, until the stream's context ends, which the tap made cancelable for that. The client
// is told Canceled (grpc-go answers so for a stream whose context ended in a send); the log
// line and the metric say why.
func (e *extension) sender(stream grpc.ServerStreamingServer[pb.WatchEvent]) func(*pb.WatchEvent) error {
	ctx := stream.Context()
	cancel := watchCancel(ctx)
	if cancel == nil || e.sendTimeout <= 0 {
		return stream.Send
	}
	return func(ev *pb.WatchEvent) error {
		var stalled atomic.Bool
		t := time.AfterFunc(e.sendTimeout, func() {
			stalled.Store(true)
			cancel()
		})
		err := stream.Send(ev)
		t.Stop()
		if stalled.Load() {
			if e.onStall != nil {
				e.onStall(ctx)
			}
			return status.Errorf(codes.ResourceExhausted, "watch ended: the client read nothing for %s", e.sendTimeout)
		}
		return err
	}
}

// PodPulls implements pb.PodResourcesServer: every pod's pulls, or the named pod's.
func (e *extension) PodPulls(_ context.Context, req *pb.PodPullsRequest) (*pb.PodPullsResponse, error) {
	ns, name := req.GetPodNamespace(), req.GetPodName()
	if ns != "" || name != "" {
		if err := validPodRef("pod_name", name, "pod_namespace", ns); err != nil {
			return nil, err
		}
	}
	if e.pulls == nil {
		return &pb.PodPullsResponse{}, nil
	}
	return &pb.PodPullsResponse{Pulls: e.pulls.Pulls(ns, name)}, nil
}
