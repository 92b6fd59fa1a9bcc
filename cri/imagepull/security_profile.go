package imagepull

// Security-profile pulls: cri-api v0.38's PullSecurityProfile (Kubernetes 1.38, KEP-6061, the
// kubelet's gate SecurityProfileOCI), with which the kubelet has the runtime fetch a seccomp
// profile from a registry, once per profile reference on each pod sync, before the pod's DRA
// claims are prepared and its sandbox made. They are registry pulls like images, and the
// kubelet counts them against its maxParallelImagePulls: podgate queues them with the image
// pulls, under the same caps and priorities.

import (
	"context"
	"crypto/sha256"

	"github.com/containerd/errdefs"
	"github.com/distribution/reference"
	"k8s.io/klog/v2"

	"github.com/podgate/podgate/cri"
)

// profileInvalid is the word that begins a permanent refusal of a PullSecurityProfile request
// (cri-api v0.38's ErrSecurityProfileInvalid): the kubelet retries every other error.
const profileInvalid = "SecurityProfileInvalid"

// NewProfilePull checks a PullSecurityProfile request and describes it as a pull of
// KindSecurityProfile. image.image must be a digest-pinned reference (the API's word for what
// the kubelet sends, "registry.example.com/profile@sha256:…"), read as NewPull reads an image's;
// one that is empty, malformed or not pinned is errdefs.ErrInvalidArgument naming the field,
// with the message prefix SecurityProfileInvalid, so that the kubelet does not retry it. The
// profile kind is the runtime's to judge. The priority is left normal: the caller sets it.
//
// The pull may share a backend call only with requests alike in every field the answer depends
// on: the reference, the credentials, the runtime handler, the profile kind and the fields
// podgate does not know. A shared call's answer says cached=false only when the registry
// checked the credentials of that call, and they are each sharer's own.
func NewProfilePull(r *ProfileRequest) (Pull, error) {
	image := r.Image.GetImage()
	if image == "" {
		return Pull{}, errorf(errdefs.ErrInvalidArgument, "%s: image.image: the security profile's reference is empty", profileInvalid)
	}
	ref, err := reference.ParseDockerRef(image)
	if err != nil {
		return Pull{}, errorf(errdefs.ErrInvalidArgument, "%s: image.image %q: %v", profileInvalid, image, err)
	}
	if _, pinned := ref.(reference.Digested); !pinned {
		return Pull{}, errorf(errdefs.ErrInvalidArgument, "%s: image.image %q: not digest-pinned: a security profile is pulled by digest (name@sha256:…)", profileInvalid, image)
	}
	md := r.SandboxConfig.GetMetadata()
	p := Pull{
		Image:    ref.String(),
		Registry: normaliseRegistry(reference.Domain(ref)),
		PodUID:   md.GetUid(),
		Pod:      klog.KRef(md.GetNamespace(), md.GetName()),
		Kind:     KindSecurityProfile,
	}
	auth, err := hashAuth(r.Auth)
	if err != nil {
		return Pull{}, errorf(errdefs.ErrInvalidArgument, "%s: auth: %v", profileInvalid, err)
	}
	p.key = flightKey{image: p.Image, handler: r.Image.GetRuntimeHandler(), auth: auth, kind: KindSecurityProfile, profile: r.Kind}
	if len(r.Unknown) > 0 {
		p.key.unknown = sha256.Sum256(r.Unknown)
	}
	return p, nil
}

// DoProfile runs fn, a PullSecurityProfile call, for p, a pull of KindSecurityProfile, as Do
// runs an image pull: under the same caps, in the same queue, shared with the callers of the
// same key, left when the caller's context ends or its pod is deleted. It returns fn's answer,
// the runtime's bytes, the same slice for every caller sharing the call; fn's error as it is.
// No pull progress is read for it and it is never stalled: the kubelet bounds it with its
// runtimeRequestTimeout.
func (g *Governor) DoProfile(ctx context.Context, p Pull, fn func(ctx context.Context) ([]byte, error)) ([]byte, error) {
	resp, leader, err := g.do(ctx, p, func(ctx context.Context) (any, error) { return fn(ctx) })
	if err != nil {
		return nil, err
	}
	b, _ := resp.([]byte) // a profile pull's flight makes only these
	if leader {
		if cached, err := DecodeProfileResponse(b); err == nil {
			klog.FromContext(ctx).V(2).Info("Security profile pulled", "image", p.Image, "pod", p.Pod, "cached", cached)
		}
	}
	return b, nil
}

// ProfileInterceptor is the governor as PullSecurityProfile's hook: it decodes the request,
// refuses a malformed one or a bad reference InvalidArgument (SecurityProfileInvalid) before
// anything is queued, takes the pull's priority from prio as an image pull's (the request's
// sandbox config names the pod), then holds the call in the governor. The runtime gets the
// request's bytes as the kubelet sent them, and the kubelet the runtime's answer or error.
func (g *Governor) ProfileInterceptor(prio Prioritizer) cri.RawInterceptor {
	return func(ctx context.Context, req []byte, next cri.RawForward) ([]byte, error) {
		r, err := DecodeProfileRequest(req)
		if err != nil {
			return nil, errorf(errdefs.ErrInvalidArgument, "%s: decode PullSecurityProfile request: %v", profileInvalid, err)
		}
		p, err := NewProfilePull(r)
		if err != nil {
			return nil, err
		}
		if prio != nil {
			p.Priority = prio(ctx, r.asPullImage())
		}
		ctx = klog.NewContext(ctx, klog.FromContext(ctx).WithValues("kind", p.Kind))
		return g.DoProfile(ctx, p, func(ctx context.Context) ([]byte, error) { return next(ctx) })
	}
}

// ProfileInterceptor is the feature's PullSecurityProfile hook: the governor, with each pull's
// priority taken as an image pull's.
func (f *Feature) ProfileInterceptor() cri.RawInterceptor {
	return f.governor.ProfileInterceptor(f.prio)
}
