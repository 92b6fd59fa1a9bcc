package imagepull_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podgate/podgate/cri/imagepull"
	"github.com/podgate/podgate/test/crifake"
)

// TestProfilePullRefused: a request podgate cannot govern is InvalidArgument naming the field,
// with the prefix SecurityProfileInvalid (the kubelet does not retry it), before anything is
// queued or reaches the runtime: malformed protobuf, no reference, a reference that is
// malformed or not digest-pinned (the API's image.image is "the canonical, digest-pinned
// reference").
func TestProfilePullRefused(t *testing.T) {
	rt := newHeldRuntime()
	g := imagepull.New(imagepull.Limits{MaxParallel: 1})
	p := startProfileProxy(t, rt, g, nil)
	valid := profileReq(profileRef("registry.example.com", "strict"), "", "", "default", "web")
	encode := func(r crifake.ProfileRequest) []byte {
		b, err := r.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	with := func(ref string) []byte {
		r := profileReq(ref, "", "", "default", "web")
		return encode(r)
	}
	noImage := valid
	noImage.PullImageRequest = &runtimeapi.PullImageRequest{SandboxConfig: valid.SandboxConfig}
	for _, tc := range []struct {
		name string
		msg  []byte
		want string
	}{
		{"truncated", encode(valid)[:7], "SecurityProfileInvalid: decode PullSecurityProfile request: unexpected EOF"},
		{"profile_kind of another wire type", protowire.AppendBytes(protowire.AppendTag(with(valid.GetImage().GetImage()), 4, protowire.BytesType), []byte{1}),
			"SecurityProfileInvalid: decode PullSecurityProfile request: profile_kind: wire type 2, want varint (an enum)"},
		{"no image", encode(noImage), "SecurityProfileInvalid: image.image: the security profile's reference is empty"},
		{"empty reference", with(""), "SecurityProfileInvalid: image.image: the security profile's reference is empty"},
		{"a tag", with("registry.example.com/profiles/strict:v1"),
			`SecurityProfileInvalid: image.image "registry.example.com/profiles/strict:v1": not digest-pinned: a security profile is pulled by digest (name@sha256:…)`},
		{"malformed", with("registry.example.com/Strict@sha256:abc"),
			`SecurityProfileInvalid: image.image "registry.example.com/Strict@sha256:abc": invalid reference format: repository name (Strict@sha256) must be lowercase`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := p.profiles.PullSecurityProfileBytes(t.Context(), tc.msg)
			if st := status.Convert(err); st.Code() != codes.InvalidArgument || st.Message() != tc.want {
				t.Errorf("got %v, want InvalidArgument %q", err, tc.want)
			}
		})
	}
	rt.idle(t)
	if calls := rt.Calls(); len(calls) != 0 {
		t.Errorf("the runtime got %v, want nothing", calls)
	}
	if s := g.Stats(); s != (imagepull.Stats{}) {
		t.Errorf("governor %+v after refused pulls, want empty", s)
	}
}

// TestListAndRemoveSecurityProfilesPassThrough: ListSecurityProfiles and RemoveSecurityProfile
// reach the runtime untouched and their answers the client, counted under their names, while
// profile pulls go through the governor: three pulls of two references (one pulled twice,
// the second time cached), listed by digest, one removed.
func TestListAndRemoveSecurityProfilesPassThrough(t *testing.T) {
	rt := &crifake.Images{ImageServiceServer: &runtimeapi.UnimplementedImageServiceServer{}, ProfileServer: &crifake.Profiles{}}
	g := imagepull.New(imagepull.Limits{MaxParallel: 1})
	p := startProfileProxy(t, rt, g, nil)
	ctx := t.Context()
	strict, loose := profileRef("registry.example.com", "strict"), profileRef("registry.example.com", "loose")
	for i, ref := range []string{strict, loose, strict} {
		cached, err := p.profiles.PullSecurityProfile(ctx, profileReq(ref, "", "", "default", "web"))
		if err != nil || cached != (i == 2) {
			t.Fatalf("pull %d of %s: cached=%v, %v; want cached=%v", i, ref, cached, err, i == 2)
		}
	}
	digest := func(ref string) string { return ref[len(ref)-len("sha256:")-64:] }
	list, err := p.profiles.ListSecurityProfiles(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := []crifake.ProfileInfo{{Digest: digest(loose), Refs: []string{loose}, Size: 1024}, {Digest: digest(strict), Refs: []string{strict}, Size: 1024}}
	if digest(loose) > digest(strict) {
		want[0], want[1] = want[1], want[0]
	}
	if diff := cmp.Diff(want, list); diff != "" {
		t.Errorf("ListSecurityProfiles (-want +got):\n%s", diff)
	}
	if err := p.profiles.RemoveSecurityProfile(ctx, digest(strict)); err != nil {
		t.Fatal(err)
	}
	if err := p.profiles.RemoveSecurityProfile(ctx, ""); status.Code(err) != codes.InvalidArgument {
		t.Errorf("RemoveSecurityProfile of no digest: %v, want the runtime's InvalidArgument", err)
	}
	if list, err := p.profiles.ListSecurityProfiles(ctx); err != nil || len(list) != 1 || list[0].Digest != digest(loose) {
		t.Errorf("after removing %s: %v, %v; want %s alone", digest(strict), list, err, digest(loose))
	}
	for _, tt := range []struct {
		method, code string
		want         int
	}{
		{"PullSecurityProfile", "OK", 3}, {"ListSecurityProfiles", "OK", 2}, {"RemoveSecurityProfile", "OK", 1},
		{"RemoveSecurityProfile", "InvalidArgument", 1}, {"other", "OK", 0},
	} {
		if got := requests(t, p, tt.method, tt.code); got != tt.want {
			t.Errorf("podgate_cri_requests_total{method=%q,code=%q} = %d, want %d", tt.method, tt.code, got, tt.want)
		}
	}
}

// requests is podgate_cri_requests_total of method and code.
func requests(t *testing.T, p *profileProxy, method, code string) int {
	t.Helper()
	mfs, err := p.metrics.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "podgate_cri_requests_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["method"] == method && labels["code"] == code {
				return int(m.GetCounter().GetValue())
			}
		}
	}
	return 0
}
