package progress

// What the tracker reads of containerd's content store: the writes in progress, the image's
// manifest (its blobs and their sizes), and which blobs are committed.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"slices"
	"strings"
	"time"

	contentapi "github.com/containerd/containerd/api/services/content/v1"
	"github.com/distribution/reference"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// maxManifestSize bounds the manifest read from the content store: an image manifest is a few
// KiB; anything much larger is not one.
const maxManifestSize = 4 << 20

// activeIngests lists the writes in progress, by the digest they expect (and by ref).
func (t *Tracker) activeIngests(ctx context.Context) (map[string]*contentapi.Status, error) {
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	resp, err := t.client.ListStatuses(cctx, &contentapi.ListStatusesRequest{})
	if err != nil {
		return nil, fmt.Errorf("list active ingests: %w", err)
	}
	out := map[string]*contentapi.Status{}
	for _, s := range resp.GetStatuses() {
		if d := s.GetExpected(); d != "" {
			out[d] = s
		} else if _, d, ok := strings.Cut(s.GetRef(), "-"); ok {
			out[d] = s // "layer-sha256:…": containerd's remote ref key
		}
	}
	return out, nil
}

// findManifest looks for the manifest of r's repository that containerd stored or touched
// since r started, and reads its blobs.
func (t *Tracker) findManifest(ctx context.Context, r Running, p *pullState) error {
	host, repo, err := splitImage(r.Image)
	if err != nil {
		return nil // NewPull accepted it; a reference of another form simply shows no progress
	}
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	// Presence of both labels: the value of the source label is a list of repositories.
	filter := fmt.Sprintf(`labels."%s%s",labels."%s"`, distributionSourceLabel, host, configLabel)
	stream, err := t.client.List(cctx, &contentapi.ListContentRequest{Filters: []string{filter}})
	if err != nil {
		return fmt.Errorf("list manifests of %s: %w", r.Image, err)
	}
	var candidates []*contentapi.Info
	for {
		resp, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("list manifests of %s: %w", r.Image, err)
		}
		for _, info := range resp.GetInfo() {
			if !slices.Contains(strings.Split(info.GetLabels()[distributionSourceLabel+host], ","), repo) {
				continue
			}
			// A second of slack: the store's clock and podgate's are one clock, but the
			// manifest may be touched within the same instant the pull starts.
			if info.GetUpdatedAt().AsTime().Before(r.Started.Add(-time.Second)) {
				continue
			}
			candidates = append(candidates, info)
		}
	}
	if len(candidates) == 0 {
		return nil
	}
	newest := slices.MaxFunc(candidates, func(a, b *contentapi.Info) int {
		return a.GetUpdatedAt().AsTime().Compare(b.GetUpdatedAt().AsTime())
	})
	blobs, err := t.readManifest(ctx, newest.GetDigest())
	if err != nil {
		return err
	}
	t.mu.Lock()
	p.manifest, p.blobs = newest.GetDigest(), blobs
	t.mu.Unlock()
	return nil
}

// readManifest reads a manifest from the content store: its config and layers.
func (t *Tracker) readManifest(ctx context.Context, digest string) ([]blob, error) {
	t.mu.Lock()
	blobs, ok := t.manifests[digest]
	t.mu.Unlock()
	if ok {
		return blobs, nil
	}
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	stream, err := t.client.Read(cctx, &contentapi.ReadContentRequest{Digest: digest})
	if err != nil {
		return nil, fmt.Errorf("read manifest %s: %w", digest, err)
	}
	var data []byte
	for {
		resp, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("read manifest %s: %w", digest, err)
		}
		data = append(data, resp.GetData()...)
		if len(data) > maxManifestSize {
			return nil, fmt.Errorf("read manifest %s: larger than %d bytes", digest, maxManifestSize)
		}
	}
	var m struct {
		Config descriptor   `json:"config"`
		Layers []descriptor `json:"layers"`
	}
	if err := json.Unmarshal(data, &m); err != nil {
		return nil, fmt.Errorf("manifest %s: %w", digest, err)
	}
	blobs = []blob{{digest: m.Config.Digest, size: m.Config.Size}}
	for _, l := range m.Layers {
		blobs = append(blobs, blob{digest: l.Digest, size: l.Size})
	}
	t.mu.Lock()
	t.manifests[digest] = blobs
	t.mu.Unlock()
	return blobs, nil
}

type descriptor struct {
	Digest string `json:"digest"`
	Size   int64  `json:"size"`
}

// measure adds up the blobs: an ingest its offset, a committed blob its size.
func (t *Tracker) measure(ctx context.Context, blobs []blob, active map[string]*contentapi.Status) (Progress, error) {
	var p Progress
	for _, b := range blobs {
		p.Total += b.size
		p.Blobs++
		if s, ok := active[b.digest]; ok {
			p.Done += min(s.GetOffset(), b.size)
			p.Unseen += min(copyBuffer, max(0, b.size-s.GetOffset()))
			continue
		}
		committed, err := t.committed(ctx, b.digest)
		if err != nil {
			return Progress{}, err
		}
		if committed {
			p.Done += b.size
			p.BlobsDone++
		}
	}
	return p, nil
}

func (t *Tracker) committed(ctx context.Context, digest string) (bool, error) {
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	_, err := t.client.Info(cctx, &contentapi.InfoRequest{Digest: digest})
	switch status.Code(err) {
	case codes.OK:
		return true, nil
	case codes.NotFound:
		return false, nil
	}
	return false, fmt.Errorf("info of %s: %w", digest, err)
}

// splitImage returns the registry host as containerd's distribution source label names it
// (the host of the reference's locator, without a port) and the repository path.
func splitImage(image string) (host, repo string, err error) {
	ref, err := reference.ParseNormalizedNamed(image)
	if err != nil {
		return "", "", err
	}
	u, err := url.Parse("dummy://" + reference.Domain(ref))
	if err != nil {
		return "", "", err
	}
	return u.Hostname(), reference.Path(ref), nil
}
