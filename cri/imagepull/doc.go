// Package imagepull governs the CRI PullImage calls that podgate forwards to the runtime, and
// Kubernetes 1.38's PullSecurityProfile calls (cri-api v0.38, KEP-6061: a seccomp profile pulled
// from a registry) with them.
//
// A [Governor] holds every pull until it may start: at most a node-wide number of pulls reach
// the backend at once, and at most a per-registry number for each registry that has a limit; a
// pull holds a slot in both. Waiting pulls start in priority order (system-node-critical, then
// system-cluster-critical, then the rest), first come first served within a priority, and a pull
// whose registry is full lets the next pull of another registry start instead of blocking the
// queue.
//
// What the caps count is the backend calls podgate has outstanding: a slot is taken when
// podgate starts the call and freed when the call has returned to podgate, and not before,
// whatever the callers do. That is the one count podgate can keep exactly. A pull cancelled at
// the backend (its callers all gone) keeps its slot until the cancelled call returns; gRPC
// returns it as soon as the cancellation is on its way, so the runtime may briefly still be
// winding that pull down when the next one starts.
//
// Concurrent pulls of the same image reference with the same credentials and the same runtime
// handler share one backend call (a flight) and all get its result; pulls with different
// credentials never share one, so a pod never obtains an image its own credentials would not
// allow (KEP-2535). The backend call runs on a context of its own, cancelled only when every
// caller that waits for it is gone: when the first caller gives up, the pull goes on for the
// others.
//
// A waiting caller leaves as soon as its context ends or its pod is deleted
// ([Governor.PodDeleted]); a flight nobody waits for any more leaves the queue without reaching
// the backend, and a running one is cancelled there. Credentials are only ever hashed: they
// appear in no log line and no metric label.
//
// Image references are read as containerd's CRI reads them (distribution's reference package),
// so a pull is refused, logged and keyed under the name containerd gives it.
//
// Errors are classified with containerd's errdefs rather than as gRPC statuses: a bad
// reference is errdefs.ErrInvalidArgument, a deleted pod's pull errdefs.ErrAborted, a caller
// who gave up context.Canceled or context.DeadlineExceeded. The cri package maps them to gRPC
// codes at its boundary.
//
// [Feature] is the whole image-pull feature around the governor: PullImage's hook, with each
// pull's [Priority] taken from its pod; the running pulls' bytes, read from containerd's
// content store (package progress); the pods' pull Events (PullQueued, PullProgress,
// PullShared, PullCancelled, PullStalled, PullThrottled); and the pulls as PodResources'
// extension shows them (PodPulls, each pod's image_pulls).
//
// A pull that fails because its registry pushed back (HTTP 429 Too Many Requests, or 503 with a
// Retry-After, read from containerd's error text) puts the registry in a cool-down
// ([WithCoolDown], imagePulls.coolDown): exponential with jitter, honouring a Retry-After the
// text shows, capped. Meanwhile the registry's pulls wait in the queue and other registries'
// go as before; when the cool-down ends one pull tries the registry (the probe) and the others
// wait for its answer; the pull that met the push-back goes back in the queue, behind the
// registry's other waiting pulls, and is tried again within the same call, until its hold
// (CoolDown.RetryFor) runs out: then its callers get the registry's error unchanged. A pull
// held that long without a try of its own tries once. A registry with a request budget
// (Limits.PerRegistryRate, a token bucket) starts its pulls no faster than the budget allows.
//
// A security profile's pull ([Governor.DoProfile], [Governor.ProfileInterceptor]) is a pull of
// [KindSecurityProfile]: it waits in the same queue by the same priority and holds the same
// slots as the image pulls (the kubelet counts both against its maxParallelImagePulls), and
// shares a backend call only with requests alike in reference, credentials, runtime handler,
// profile kind and the fields podgate does not know, so that a caller sharing a call whose
// answer says cached=false (the registry checked the call's credentials) has those very
// credentials. The runtime gets the request's bytes and the callers its answer's, or its
// error, as they were. podgate's cri-api (v0.37) has no types for the call's messages:
// profilewire.go reads them by cri-api v0.38's field numbers until v0.38.0 is served. No
// progress is read and no stall found for a profile's pull.
//
// A running pull whose rate in the content store stays below imagePulls.stall's minimum over
// its window is stalled ([WithStall]): what containerd fetched of it is kept in a lease of
// podgate's own, the backend call is cancelled ([Governor.Stall], the path of a pull whose
// callers all left), and every caller gets one errdefs.ErrUnavailable error naming the image,
// the registry, the rate and the minimum; the slot goes to the next pull. It calls no Kubernetes API itself: it reads the node's pods
// through [Pods] and writes Events through an [EventSink], which the agent gives it.
package imagepull
