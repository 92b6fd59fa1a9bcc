package imagepull_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podgate/podgate/cri/imagepull"
)

// goldenRef is the reference in testdata/profilewire's golden request.
const goldenRef = "registry.example.com/profiles/strict@sha256:2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae"

// TestProfileWireGolden: podgate reads the PullSecurityProfile messages that cri-api
// v0.38.0-beta.0's generated code wrote (testdata/profilewire/gen, run with Go 1.27), every
// field where the API puts it.
func TestProfileWireGolden(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("testdata", "profilewire", "request.bin"))
	if err != nil {
		t.Fatal(err)
	}
	got, err := imagepull.DecodeProfileRequest(b)
	if err != nil {
		t.Fatal(err)
	}
	want := &imagepull.ProfileRequest{
		Image: &runtimeapi.ImageSpec{Image: goldenRef, UserSpecifiedImage: goldenRef, RuntimeHandler: "kata",
			Annotations: map[string]string{"a": "b"}},
		Auth: &runtimeapi.AuthConfig{Username: "user", Password: "secret", ServerAddress: "registry.example.com"},
		SandboxConfig: &runtimeapi.PodSandboxConfig{
			Metadata:    &runtimeapi.PodSandboxMetadata{Name: "web", Namespace: "prod", Uid: "uid-web", Attempt: 2},
			Labels:      map[string]string{"app": "web"},
			Annotations: map[string]string{"note": "x"},
		},
		Kind: imagepull.ProfileKindSeccomp,
	}
	if diff := cmp.Diff(want, got, protocmp.Transform()); diff != "" {
		t.Errorf("the v0.38 request as podgate reads it (-want +got):\n%s", diff)
	}
	b, err = os.ReadFile(filepath.Join("testdata", "profilewire", "response.bin"))
	if err != nil {
		t.Fatal(err)
	}
	if cached, err := imagepull.DecodeProfileResponse(b); err != nil || !cached {
		t.Errorf("the v0.38 response cached=true as podgate reads it: %v, %v", cached, err)
	}
}

// TestDecodeProfileRequest: proto3's rules (a message field merged across its occurrences, a
// scalar's last occurrence winning, unknown fields kept as they came), and errors naming the
// field of a request that is malformed.
func TestDecodeProfileRequest(t *testing.T) {
	msg := func(m proto.Message) []byte {
		b, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	field := func(num protowire.Number, v []byte) []byte {
		return protowire.AppendBytes(protowire.AppendTag(nil, num, protowire.BytesType), v)
	}
	varint := func(num protowire.Number, v uint64) []byte {
		return protowire.AppendVarint(protowire.AppendTag(nil, num, protowire.VarintType), v)
	}
	join := func(parts ...[]byte) []byte {
		var b []byte
		for _, p := range parts {
			b = append(b, p...)
		}
		return b
	}
	unknown := field(9, []byte("future"))
	t.Run("proto3 rules", func(t *testing.T) {
		b := join(
			field(1, msg(&runtimeapi.ImageSpec{Image: "a@sha256:x"})),
			varint(4, 7),
			unknown,
			field(1, msg(&runtimeapi.ImageSpec{RuntimeHandler: "kata"})),
			field(3, msg(&runtimeapi.PodSandboxConfig{Labels: map[string]string{"l": "1"}})),
			field(3, msg(&runtimeapi.PodSandboxConfig{Metadata: &runtimeapi.PodSandboxMetadata{Name: "web"}})),
			varint(4, 1),
		)
		got, err := imagepull.DecodeProfileRequest(b)
		if err != nil {
			t.Fatal(err)
		}
		want := &imagepull.ProfileRequest{
			Image:         &runtimeapi.ImageSpec{Image: "a@sha256:x", RuntimeHandler: "kata"},
			SandboxConfig: &runtimeapi.PodSandboxConfig{Labels: map[string]string{"l": "1"}, Metadata: &runtimeapi.PodSandboxMetadata{Name: "web"}},
			Kind:          imagepull.ProfileKindSeccomp,
			Unknown:       unknown,
		}
		if diff := cmp.Diff(want, got, protocmp.Transform()); diff != "" {
			t.Errorf("(-want +got):\n%s", diff)
		}
	})
	for _, tc := range []struct {
		name string
		msg  []byte
		want string
	}{
		{"a truncated tag", []byte{0x80}, "field tag: unexpected EOF"},
		{"a truncated image", field(1, msg(&runtimeapi.ImageSpec{Image: "abc"}))[:4], "image: unexpected EOF"},
		{"profile_kind as bytes", field(4, []byte{1}), "profile_kind: wire type 2, want varint (an enum)"},
		{"image as a varint", varint(1, 1), "image: wire type 0, want length-delimited (a message)"},
		{"invalid UTF-8 in the pod's name", field(3, field(1, field(1, []byte{0xff}))), "sandbox_config: "},
		{"a truncated unknown field", field(12, []byte("xyz"))[:3], "field 12: unexpected EOF"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := imagepull.DecodeProfileRequest(tc.msg)
			if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
				t.Errorf("DecodeProfileRequest(%x) = %v, want an error starting %q", tc.msg, err, tc.want)
			}
		})
	}
}

// TestDecodeProfileResponse: cached as a bool's varint; another wire type is an error.
func TestDecodeProfileResponse(t *testing.T) {
	for _, tc := range []struct {
		msg    []byte
		cached bool
		err    bool
	}{
		{nil, false, false},
		{[]byte{0x08, 0x01}, true, false},
		{[]byte{0x08, 0x00}, false, false},
		{[]byte{0x08, 0x01, 0x08, 0x00}, false, false}, // the last wins
		{[]byte{0x12, 0x01, 0x61, 0x08, 0x01}, true, false},
		{[]byte{0x0a, 0x01, 0x01}, false, true},
		{[]byte{0x08}, false, true},
	} {
		cached, err := imagepull.DecodeProfileResponse(tc.msg)
		if cached != tc.cached || (err != nil) != tc.err {
			t.Errorf("DecodeProfileResponse(%x) = %v, %v; want %v, error %v", tc.msg, cached, err, tc.cached, tc.err)
		}
	}
}
