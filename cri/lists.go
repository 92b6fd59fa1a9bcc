package cri

import (
	"context"
	"errors"
	"io"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/klog/v2"
)

// listMode is what podgate knows of a runtime's list streaming (KEP-5825) for one list.
type listMode int32

const (
	listUntried listMode = iota // not asked yet: the next list tries the stream
	listStream                  // the runtime streams the list
	listUnary                   // the runtime answered Unimplemented: the unary List is used
)

// listingClient is a runtime client whose ListPodSandbox and ListContainers take the answer
// from the runtime's StreamPodSandboxes and StreamContainers, page by page, where it serves
// them. A unary List answers in one message, which the connection takes only up to
// MaxMessageSize (16 MiB): a node with tens of thousands of containers has a larger answer, and
// podgate could never list it. A runtime older than list streaming answers Unimplemented; then
// the unary List is used, and for the client's life (one per runtime connection) the stream is
// not asked again.
type listingClient struct {
	runtimeapi.RuntimeServiceClient
	sandboxes, containers atomic.Int32 // listMode each
}

var _ runtimeapi.RuntimeServiceClient = (*listingClient)(nil)

// StreamingLists returns rt with its ListPodSandbox and ListContainers answered from the
// runtime's StreamPodSandboxes and StreamContainers where it serves them, falling back to the
// unary calls where it answers Unimplemented (remembered, and logged once at -v 2). Every other
// call is rt's. The answers are the unary calls' (all the items, in the order the runtime sent
// them; a failed stream's status as the error), so callers of a RuntimeServiceClient share it
// unchanged. Make one per runtime connection: what the runtime serves is remembered in it.
func StreamingLists(rt runtimeapi.RuntimeServiceClient) runtimeapi.RuntimeServiceClient {
	return &listingClient{RuntimeServiceClient: rt}
}

// ListPodSandbox lists the runtime's sandboxes with StreamPodSandboxes, or ListPodSandbox.
func (c *listingClient) ListPodSandbox(ctx context.Context, req *runtimeapi.ListPodSandboxRequest, opts ...grpc.CallOption) (*runtimeapi.ListPodSandboxResponse, error) {
	items, err := collect(ctx, &c.sandboxes, "StreamPodSandboxes",
		func(ctx context.Context) (grpc.ServerStreamingClient[runtimeapi.StreamPodSandboxesResponse], error) {
			return c.StreamPodSandboxes(ctx, &runtimeapi.StreamPodSandboxesRequest{Filter: req.GetFilter()}, opts...)
		},
		(*runtimeapi.StreamPodSandboxesResponse).GetPodSandboxes,
		func() ([]*runtimeapi.PodSandbox, error) {
			resp, err := c.RuntimeServiceClient.ListPodSandbox(ctx, req, opts...)
			return resp.GetItems(), err
		})
	if err != nil {
		return nil, err
	}
	return &runtimeapi.ListPodSandboxResponse{Items: items}, nil
}

// ListContainers lists the runtime's containers with StreamContainers, or ListContainers.
func (c *listingClient) ListContainers(ctx context.Context, req *runtimeapi.ListContainersRequest, opts ...grpc.CallOption) (*runtimeapi.ListContainersResponse, error) {
	items, err := collect(ctx, &c.containers, "StreamContainers",
		func(ctx context.Context) (grpc.ServerStreamingClient[runtimeapi.StreamContainersResponse], error) {
			return c.StreamContainers(ctx, &runtimeapi.StreamContainersRequest{Filter: req.GetFilter()}, opts...)
		},
		(*runtimeapi.StreamContainersResponse).GetContainers,
		func() ([]*runtimeapi.Container, error) {
			resp, err := c.RuntimeServiceClient.ListContainers(ctx, req, opts...)
			return resp.GetContainers(), err
		})
	if err != nil {
		return nil, err
	}
	return &runtimeapi.ListContainersResponse{Containers: items}, nil
}

// collect lists with the stream method unless mode says the runtime does not serve it: all the
// pages' items, in order. A stream answered Unimplemented before its first page sets mode and
// lists with unary; one that fails later fails the list (the runtime serves the stream).
func collect[T, P any](ctx context.Context, mode *atomic.Int32, method string,
	open func(context.Context) (grpc.ServerStreamingClient[P], error), items func(*P) []T,
	unary func() ([]T, error)) ([]T, error) {
	if listMode(mode.Load()) == listUnary {
		return unary()
	}
	out, pages, err := recvAll(ctx, open, items)
	if status.Code(err) == codes.Unimplemented && pages == 0 {
		if listMode(mode.Swap(int32(listUnary))) != listUnary {
			klog.FromContext(ctx).V(2).Info("Runtime does not stream lists; podgate lists with unary calls", "method", method, "err", err)
		}
		return unary()
	}
	if err != nil {
		return nil, err
	}
	if mode.CompareAndSwap(int32(listUntried), int32(listStream)) {
		klog.FromContext(ctx).V(2).Info("Runtime streams lists; podgate lists with streams", "method", method)
	}
	return out, nil
}

// recvAll opens a stream and receives it to its end: the items of every page, and how many
// pages came. The error is the stream's status.
func recvAll[T, P any](ctx context.Context, open func(context.Context) (grpc.ServerStreamingClient[P], error), items func(*P) []T) ([]T, int, error) {
	ctx, cancel := context.WithCancel(ctx) // ends the stream if it fails midway
	defer cancel()
	stream, err := open(ctx)
	if err != nil {
		return nil, 0, err
	}
	var out []T
	for pages := 0; ; pages++ {
		page, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return out, pages, nil
		}
		if err != nil {
			return nil, pages, err
		}
		out = append(out, items(page)...)
	}
}
