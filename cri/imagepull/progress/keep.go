package progress

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	leasesapi "github.com/containerd/containerd/api/services/leases/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// gcExpireLabel makes containerd's garbage collector delete a lease once its time has passed.
const gcExpireLabel = "containerd.io/gc.expire"

// Keep holds what containerd has of image's running pull (its manifest, the blobs already
// committed and the ingests under way) in a lease of podgate's own for ttl, before the pull is
// cancelled. containerd's CRI pulls under a lease it deletes when the pull fails, after which
// its garbage collector removes the blobs no image references, finished layers and partial
// downloads alike, and the kubelet's retry fetches everything again; held, the retry finds the
// finished blobs and resumes the partial ones. The lease ends at ttl, by containerd's own
// collector (containerd.io/gc.expire), whether podgate still runs or not. Keep returns an
// error when the pull's manifest is not known or containerd refuses.
func (t *Tracker) Keep(ctx context.Context, image string, ttl time.Duration) error {
	t.mu.Lock()
	p := t.pulls[image]
	var manifest string
	var blobs []blob
	if p != nil {
		manifest, blobs = p.manifest, p.blobs
	}
	t.mu.Unlock()
	if manifest == "" {
		return fmt.Errorf("keep %s: its manifest is not known", image)
	}
	ctx = metadata.AppendToOutgoingContext(ctx, "containerd-namespace", t.namespace)
	active, err := t.activeIngests(ctx)
	if err != nil {
		return fmt.Errorf("keep %s: %w", image, err)
	}
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	id := "podgate-keep-" + strings.TrimPrefix(manifest, "sha256:")[:16]
	_, err = t.leases.Create(cctx, &leasesapi.CreateRequest{ID: id, Labels: map[string]string{
		gcExpireLabel: t.now().Add(ttl).UTC().Format(time.RFC3339),
	}})
	if err != nil && status.Code(err) != codes.AlreadyExists {
		return fmt.Errorf("keep %s: lease %s: %w", image, id, err)
	}
	resources := []*leasesapi.Resource{{ID: manifest, Type: "content"}}
	for _, b := range blobs {
		if s, ok := active[b.digest]; ok {
			resources = append(resources, &leasesapi.Resource{ID: s.GetRef(), Type: "ingests"})
			continue
		}
		resources = append(resources, &leasesapi.Resource{ID: b.digest, Type: "content"})
	}
	var errs []error
	for _, r := range resources {
		_, err := t.leases.AddResource(cctx, &leasesapi.AddResourceRequest{ID: id, Resource: r})
		// A blob not fetched yet is not there to hold: nothing to keep of it.
		if err != nil && status.Code(err) != codes.NotFound {
			errs = append(errs, fmt.Errorf("%s %s: %w", r.GetType(), r.GetID(), err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("keep %s in lease %s: %w", image, id, err)
	}
	return nil
}
