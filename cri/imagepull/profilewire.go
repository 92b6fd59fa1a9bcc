package imagepull

// The messages of PullSecurityProfile (cri-api v0.38, KEP-6061), read with protowire at their
// field numbers in cri-api v0.38.0-beta.0's api.proto (pkg/apis/runtime/v1), since podgate's
// cri-api (v0.37) has no types for them:
//
//	message PullSecurityProfileRequest {
//	    ImageSpec image = 1;                  // image.image: the digest-pinned reference
//	    AuthConfig auth = 2;
//	    PodSandboxConfig sandbox_config = 3;  // metadata, labels, annotations; no linux
//	    SecurityProfileKind profile_kind = 4;
//	}
//	message PullSecurityProfileResponse {
//	    bool cached = 1;  // no registry request made: this request's credentials not checked
//	}
//	enum SecurityProfileKind {
//	    SecurityProfileKindUnspecified = 0;
//	    Seccomp = 1;
//	}
//
// ImageSpec, AuthConfig and PodSandboxConfig are v0.37's messages, unchanged, so their fields
// are decoded with v0.37's types. TestProfileWireGolden decodes bytes that cri-api
// v0.38.0-beta.0's generated code encoded (testdata/profilewire), which holds these numbers to
// the API's.
//
// When k8s.io/cri-api v0.38.0 is served (Kubernetes 1.38 GA), podgate moves to it: switch to
// runtimeapi.PullSecurityProfileRequest, PullSecurityProfileResponse and SecurityProfileKind,
// make cri.PullSecurityProfile a typed cri.Method, and delete this file.

import (
	"fmt"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// The field numbers of cri-api v0.38's PullSecurityProfileRequest and
// PullSecurityProfileResponse.
const (
	profileImageField         protowire.Number = 1
	profileAuthField          protowire.Number = 2
	profileSandboxConfigField protowire.Number = 3
	profileKindField          protowire.Number = 4

	profileCachedField protowire.Number = 1
)

// ProfileKind is cri-api v0.38's SecurityProfileKind: the security mechanism a pulled profile
// is for. An open enum, as proto3's are: a value podgate does not know is kept as it came.
type ProfileKind int32

// The kinds of cri-api v0.38.
const (
	// ProfileKindUnspecified: runtimes refuse it as an unsupported kind.
	ProfileKindUnspecified ProfileKind = 0
	// ProfileKindSeccomp: a seccomp profile.
	ProfileKindSeccomp ProfileKind = 1
)

// String is the kind's name in the API.
func (k ProfileKind) String() string {
	switch k {
	case ProfileKindUnspecified:
		return "SecurityProfileKindUnspecified"
	case ProfileKindSeccomp:
		return "Seccomp"
	}
	return fmt.Sprintf("SecurityProfileKind(%d)", int32(k))
}

// ProfileRequest is a PullSecurityProfileRequest as podgate reads it.
type ProfileRequest struct {
	// Image, Auth and SandboxConfig are fields 1 to 3, PullImageRequest's messages; nil when
	// absent.
	Image         *runtimeapi.ImageSpec
	Auth          *runtimeapi.AuthConfig
	SandboxConfig *runtimeapi.PodSandboxConfig
	// Kind is field 4, profile_kind.
	Kind ProfileKind
	// Unknown holds the fields podgate does not know (a CRI newer than v0.38), as they came.
	Unknown []byte
}

// asPullImage is the request's fields 1 to 3 as the PullImageRequest they are, for what reads
// a pull's image, credentials and pod alike for both kinds (its priority).
func (r *ProfileRequest) asPullImage() *runtimeapi.PullImageRequest {
	return &runtimeapi.PullImageRequest{Image: r.Image, Auth: r.Auth, SandboxConfig: r.SandboxConfig}
}

// DecodeProfileRequest reads a PullSecurityProfileRequest as proto3 does: a message field that
// occurs more than once is merged, a scalar's last occurrence wins, fields it does not know are
// kept in Unknown. A malformed request, or a known field of another wire type, is an error
// naming the field.
func DecodeProfileRequest(b []byte) (*ProfileRequest, error) {
	r := &ProfileRequest{}
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, fmt.Errorf("field tag: %w", protowire.ParseError(n))
		}
		name := profileFieldName(num)
		vn := protowire.ConsumeFieldValue(num, typ, b[n:])
		if vn < 0 {
			return nil, fmt.Errorf("%s: %w", name, protowire.ParseError(vn))
		}
		if err := r.field(num, typ, b[n:n+vn]); err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		if !known(num) {
			r.Unknown = append(r.Unknown, b[:n+vn]...)
		}
		b = b[n+vn:]
	}
	return r, nil
}

// field takes one occurrence of field num, of wire type typ, whose value is v.
func (r *ProfileRequest) field(num protowire.Number, typ protowire.Type, v []byte) error {
	switch num {
	case profileImageField:
		return mergeMessage(typ, v, &r.Image)
	case profileAuthField:
		return mergeMessage(typ, v, &r.Auth)
	case profileSandboxConfigField:
		return mergeMessage(typ, v, &r.SandboxConfig)
	case profileKindField:
		if typ != protowire.VarintType {
			return fmt.Errorf("wire type %d, want varint (an enum)", typ)
		}
		x, _ := protowire.ConsumeVarint(v) // ConsumeFieldValue has checked it
		r.Kind = ProfileKind(int32(x))     //nolint:gosec // int32 fields take the varint's low 32 bits, as proto does
	}
	return nil
}

// mergeMessage merges v, a message field's value of wire type typ, into *m, made when nil.
func mergeMessage[M any, PM interface {
	*M
	proto.Message
}](typ protowire.Type, v []byte, m *PM) error {
	if typ != protowire.BytesType {
		return fmt.Errorf("wire type %d, want length-delimited (a message)", typ)
	}
	b, _ := protowire.ConsumeBytes(v) // ConsumeFieldValue has checked it
	if *m == nil {
		*m = PM(new(M))
	}
	return proto.UnmarshalOptions{Merge: true}.Unmarshal(b, *m)
}

// profileFieldName names a field of PullSecurityProfileRequest as the API does, and one it does
// not have by its number.
func profileFieldName(num protowire.Number) string {
	switch num {
	case profileImageField:
		return "image"
	case profileAuthField:
		return "auth"
	case profileSandboxConfigField:
		return "sandbox_config"
	case profileKindField:
		return "profile_kind"
	}
	return fmt.Sprintf("field %d", num)
}

// known says whether PullSecurityProfileRequest (cri-api v0.38) has field num.
func known(num protowire.Number) bool { return num >= profileImageField && num <= profileKindField }

// DecodeProfileResponse reads a PullSecurityProfileResponse's cached: true when the runtime had
// the profile and made no registry request, so the request's credentials were not checked.
func DecodeProfileResponse(b []byte) (cached bool, err error) {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return false, fmt.Errorf("field tag: %w", protowire.ParseError(n))
		}
		vn := protowire.ConsumeFieldValue(num, typ, b[n:])
		if vn < 0 {
			return false, fmt.Errorf("field %d: %w", num, protowire.ParseError(vn))
		}
		if num == profileCachedField {
			if typ != protowire.VarintType {
				return false, fmt.Errorf("cached: wire type %d, want varint (a bool)", typ)
			}
			x, _ := protowire.ConsumeVarint(b[n:])
			cached = x != 0
		}
		b = b[n+vn:]
	}
	return cached, nil
}
