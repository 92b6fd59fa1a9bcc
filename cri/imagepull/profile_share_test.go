package imagepull_test

import (
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/durationpb"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podgate/podgate/cri/imagepull"
	"github.com/podgate/podgate/test/crifake"
)

// TestProfilePullSharing: concurrent profile pulls share one runtime call only when their
// requests are alike in everything the answer depends on: reference, credentials, runtime
// handler, profile kind, and the fields podgate does not know. A different one of any of
// these, or an image pull of the same reference, makes its own call. Each caller gets its
// call's answer, or its error, as the runtime gave it.
//
// And cached: the runtime answers cached=false to the first call of a reference (it asked the
// registry, with that call's credentials) and cached=true to later ones (it made no registry
// request, and their credentials went unchecked). Every caller who gets cached=false has the
// credentials the registry checked: the one sharing the first call has the same; the one with
// other credentials makes a call of its own, answered cached=true.
func TestProfilePullSharing(t *testing.T) {
	rt := newHeldRuntime()
	g := imagepull.New(imagepull.Limits{})
	q := traceQueue(g)
	p := startProfileProxy(t, rt, g, nil)
	ctx := t.Context()
	ref := profileRef("registry.example.com", "strict")
	future := profileReq(ref, "alice", "", "default", "future")
	future.ProtoReflect().SetUnknown(protowire.AppendVarint(protowire.AppendTag(nil, 9, protowire.VarintType), 1))
	unspecified := profileReq(ref, "alice", "", "default", "unspecified")
	unspecified.Kind = 0
	callers := []struct {
		pod string
		req crifake.ProfileRequest
	}{
		{"leader", profileReq(ref, "alice", "", "default", "leader")},
		{"sharer", profileReq(ref, "alice", "", "other", "sharer")}, // another pod, alike in all that counts
		{"bob", profileReq(ref, "bob", "", "default", "bob")},
		{"kata", profileReq(ref, "alice", "kata", "default", "kata")},
		{"unspecified", unspecified},
		{"future", future},
	}
	user := map[string]string{"image": "alice"}
	// An image pull alike in all but its kind to the profile pull of the unspecified kind.
	results := map[string]<-chan result{"image": p.pullImage(ctx, ref, "alice", "default", "image")}
	q.await(t, "started", ref)
	for _, c := range callers {
		results[c.pod] = p.pullProfile(ctx, c.req)
		user[c.pod] = c.req.GetAuth().GetUsername()
		if c.pod == "sharer" {
			q.await(t, "joined", ref)
		} else {
			q.await(t, "started", ref)
		}
	}
	held := map[string]*call{}
	for range len(callers) { // a call for each caller but the sharer, and the image's
		c := rt.next(t)
		held[c.pod] = c
	}
	rt.idle(t)
	wantPods := []string{"bob", "future", "image", "kata", "leader", "unspecified"}
	if diff := cmp.Diff(wantPods, slices.Sorted(maps.Keys(held))); diff != "" {
		t.Fatalf("the runtime got the requests of the pods (-want +got):\n%s", diff)
	}
	if c := held["image"]; c.kind != "image" {
		t.Errorf("the image pull reached the runtime as %s", c)
	}

	// The leader's call first: the registry checks alice's credentials.
	checked := map[string]bool{}
	answered := map[string]result{}
	for _, pod := range []string{"leader", "bob", "kata", "future", "unspecified", "image"} {
		held[pod].release <- nil
		answered[pod] = await(t, pod+"'s pull", results[pod])
		if pod == "leader" {
			answered["sharer"] = await(t, "the sharer's pull", results["sharer"])
		}
		if r := answered[pod]; r.err == nil && !r.cached && pod != "image" {
			checked[user[pod]] = true
		}
	}
	for pod, want := range map[string]result{
		"leader": {cached: false}, "sharer": {cached: false}, "bob": {cached: true}, "kata": {cached: true}, "future": {cached: true},
	} {
		if got := answered[pod]; got.err != nil || got.cached != want.cached {
			t.Errorf("%s got cached=%v, %v; want cached=%v", pod, got.cached, got.err, want.cached)
		}
	}
	for pod, r := range answered {
		if r.err == nil && !r.cached && pod != "image" && !checked[user[pod]] {
			t.Errorf("%s got cached=false for %q's credentials, which the registry never checked", pod, user[pod])
		}
	}
	// The runtime's refusal of the unspecified kind, as it gave it.
	const refusal = "SecurityProfileInvalid: unsupported security profile kind 0"
	if err := answered["unspecified"].err; status.Code(err) != codes.InvalidArgument || status.Convert(err).Message() != refusal {
		t.Errorf("unspecified kind: %v, want the runtime's InvalidArgument %q", err, refusal)
	}
	if err := answered["image"].err; err != nil {
		t.Errorf("image pull: %v", err)
	}
}

// TestProfilePullErrorsVerbatim: the runtime's errors reach every caller of a profile pull with
// their code, message and details as the runtime sent them: the three well-known prefixes
// (the kubelet retries all but SecurityProfileInvalid), and a runtime older than cri-api v0.38,
// which has no such method: containerd 2.3 and 2.4 answer Unimplemented, which the kubelet
// does not retry either.
func TestProfilePullErrorsVerbatim(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  *status.Status
	}{
		{"RegistryUnavailable", status.New(codes.Unknown, `RegistryUnavailable: failed to resolve reference "registry.example.com/profiles/strict@sha256:…": unexpected status from HEAD request: 503 Service Unavailable`)},
		{"SignatureValidationFailed", status.New(codes.Unknown, "SignatureValidationFailed: no signature of registry.example.com/profiles/strict matches the policy")},
		{"SecurityProfileInvalid", status.New(codes.InvalidArgument, "SecurityProfileInvalid: the artifact holds no seccomp profile")},
		{"with details", withDetails(t, status.New(codes.ResourceExhausted, "RegistryUnavailable: 429 Too Many Requests"))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rt := newHeldRuntime()
			g := imagepull.New(imagepull.Limits{MaxParallel: 1})
			q := traceQueue(g)
			p := startProfileProxy(t, rt, g, nil)
			ref := profileRef("registry.example.com", "strict")
			first := p.pullProfile(t.Context(), profileReq(ref, "", "", "default", "first"))
			q.await(t, "started", ref)
			second := p.pullProfile(t.Context(), profileReq(ref, "", "", "default", "second"))
			q.await(t, "joined", ref)
			rt.next(t).release <- tc.err.Err()
			for _, res := range []<-chan result{first, second} {
				got := status.Convert(await(t, "a profile pull", res).err)
				if !cmp.Equal(got.Proto(), tc.err.Proto(), protocmp.Transform()) {
					t.Errorf("caller got %v, want the runtime's %v", got.Proto(), tc.err.Proto())
				}
			}
		})
	}
	t.Run("Unimplemented", func(t *testing.T) {
		// A runtime of cri-api v0.37, as containerd 2.4 is: its ImageService lacks the method.
		p := startOldProxy(t, &runtimeapi.UnimplementedImageServiceServer{})
		_, err := p.profiles.PullSecurityProfile(t.Context(), profileReq(profileRef("registry.example.com", "strict"), "", "", "default", "web"))
		const want = "unknown method PullSecurityProfile for service runtime.v1.ImageService"
		if st := status.Convert(err); st.Code() != codes.Unimplemented || st.Message() != want {
			t.Errorf("got %v, want the runtime's Unimplemented %q", err, want)
		}
	})
}

// withDetails is st with a detail, which must reach the caller too.
func withDetails(t *testing.T, st *status.Status) *status.Status {
	t.Helper()
	d, err := st.WithDetails(durationpb.New(30 * time.Second))
	if err != nil {
		t.Fatal(err)
	}
	return d
}
