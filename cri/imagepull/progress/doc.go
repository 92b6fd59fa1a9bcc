// Package progress reads how far the runtime has got with an image pull, from containerd's
// content store, over containerd's own socket and its published API
// (github.com/containerd/containerd/api, the content service in the CRI's namespace k8s.io).
//
// The CRI says nothing of a pull until it ends. containerd, however, writes each blob it
// fetches through its content store, and the content service shows every write in progress:
// ListStatuses lists the ingests, "layer-sha256:<digest>" and the like, each with the bytes
// written so far (offset) and the blob's size (total); what `ctr -n k8s.io content active`
// prints. Which pull an ingest belongs to, containerd does not say. The image's manifest does:
// containerd stores it first, labels it with the repository it came from
// (containerd.io/distribution.source.<host>) and with its config
// (containerd.io/gc.ref.content.config), and only then fetches the config and the layers. So a
// [Tracker] finds, for each running pull, the manifest of the pull's repository that containerd
// stored or touched since the pull started, reads it from the content store, and adds up its
// blobs: an ingest counts its offset, a committed blob its size, a blob not yet started
// nothing. Until the manifest is there (the registry has not answered yet) the pull's bytes
// are unknown.
//
// containerd writes a blob it fetches in pieces of 1 MiB (or at the blob's end), so the bytes
// move in steps: a pull's Progress says how much may be held unwritten (Unseen), and the stall
// rule ([WithStall]) counts it as received, so that a pull keeping the minimum rate is never
// found stalled. [Tracker.Keep] holds a stalled pull's blobs and ingests in a lease for the
// retry: containerd's CRI deletes its own lease of a failed pull, and its garbage collector
// then removes them.
//
// Two pulls of one repository running at once under different tags are told apart by time
// only: each takes the newest manifest touched since it started.
package progress
