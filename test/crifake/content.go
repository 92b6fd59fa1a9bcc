package crifake

import (
	"context"
	"fmt"

	contentapi "github.com/containerd/containerd/api/services/content/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// The image whose pull the content store shows in progress: a 1 KiB config, committed, and one
// 4 MiB layer, 1 MiB of it written.
const (
	configDigest   = "sha256:cccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccc"
	layerDigest    = "sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
	manifestDigest = "sha256:1111111111111111111111111111111111111111111111111111111111111111"
)

// ContentStore is containerd's content service as it is while containerd pulls an image of
// repository app from example.com (example.com/app:v1): what ListStatuses, List, Read and Info
// show of its manifest, its 1 KiB config (committed) and its 4 MiB layer (1 MiB written).
type ContentStore struct {
	contentapi.UnimplementedContentServer
	manifest []byte
	// Listed, when set before the store serves, is told (without blocking) of each
	// ListStatuses: a progress tracker's poll.
	Listed chan<- struct{}
}

// NewContentStore returns the content store of the pull in progress.
func NewContentStore() *ContentStore {
	return &ContentStore{manifest: fmt.Appendf(nil,
		`{"schemaVersion":2,"config":{"digest":%q,"size":1024},"layers":[{"digest":%q,"size":%d}]}`, configDigest, layerDigest, 4<<20)}
}

// Register registers the store on s as containerd's content service.
func (f *ContentStore) Register(s *grpc.Server) { contentapi.RegisterContentServer(s, f) }

// RegisterContentStore registers a new ContentStore on s.
func RegisterContentStore(s *grpc.Server) { NewContentStore().Register(s) }

// ListStatuses implements contentapi.ContentServer.
func (f *ContentStore) ListStatuses(context.Context, *contentapi.ListStatusesRequest) (*contentapi.ListStatusesResponse, error) {
	if f.Listed != nil {
		select {
		case f.Listed <- struct{}{}:
		default:
		}
	}
	return &contentapi.ListStatusesResponse{Statuses: []*contentapi.Status{
		{Ref: "layer-" + layerDigest, Offset: 1 << 20, Total: 4 << 20, Expected: layerDigest},
	}}, nil
}

// List implements contentapi.ContentServer.
func (f *ContentStore) List(_ *contentapi.ListContentRequest, s contentapi.Content_ListServer) error {
	return s.Send(&contentapi.ListContentResponse{Info: []*contentapi.Info{{
		Digest: manifestDigest, Size: int64(len(f.manifest)), UpdatedAt: timestamppb.Now(),
		Labels: map[string]string{"containerd.io/distribution.source.example.com": "app", "containerd.io/gc.ref.content.config": configDigest},
	}}})
}

// Read implements contentapi.ContentServer.
func (f *ContentStore) Read(_ *contentapi.ReadContentRequest, s contentapi.Content_ReadServer) error {
	return s.Send(&contentapi.ReadContentResponse{Data: f.manifest})
}

// Info implements contentapi.ContentServer.
func (f *ContentStore) Info(_ context.Context, req *contentapi.InfoRequest) (*contentapi.InfoResponse, error) {
	if req.GetDigest() == configDigest {
		return &contentapi.InfoResponse{Info: &contentapi.Info{Digest: configDigest, Size: 1024}}, nil
	}
	return nil, status.Error(codes.NotFound, "not found")
}
