package imagepull

// What the governor queues: one backend call that fetches something from a registry, of one
// of two kinds. Both kinds wait in the one queue by the one priority, hold the same slots (the
// node's and their registry's: the kubelet 1.38 shares its maxParallelImagePulls tokens between
// them too) and share a call only with callers of the same kind. The governor sees a flight's
// kind, registry host and backend call, nothing else of it: what holds a pull back before it
// starts (dispatch, registryFree, start) and what it does with a failed call (run) hold for
// both kinds alike.

import "context"

// Kind says what a pull fetches from its registry.
type Kind int

// The kinds of pulls.
const (
	// KindImage: a container image (PullImage).
	KindImage Kind = iota
	// KindSecurityProfile: a security profile, an OCI artifact holding a seccomp profile
	// (PullSecurityProfile, cri-api v0.38, KEP-6061).
	KindSecurityProfile
)

// String is the kind as metrics label it and podgate pulls shows it: "image" or
// "security_profile".
func (k Kind) String() string {
	if k == KindSecurityProfile {
		return "security_profile"
	}
	return "image"
}

// noun is the kind as Events and logs name it: "image" or "security profile".
func (k Kind) noun() string {
	if k == KindSecurityProfile {
		return "security profile"
	}
	return "image"
}

// title is noun at the start of a sentence: "Image" or "Security profile".
func (k Kind) title() string {
	if k == KindSecurityProfile {
		return "Security profile"
	}
	return "Image"
}

// kinds are the kinds, for metrics made up front.
var kinds = []Kind{KindImage, KindSecurityProfile}

// flightCall is a flight's call to the runtime, made once for every caller that shares the
// flight: PullImage's, whose answer is a *runtimeapi.PullImageResponse, or
// PullSecurityProfile's, whose answer is the runtime's bytes ([Governor.DoProfile]).
type flightCall func(ctx context.Context) (any, error)
