package crifake

// A fake of a Kubernetes 1.38 runtime's image service: cri-api v0.37's ImageService methods
// and the three that cri-api v0.38 adds for security profiles (KEP-6061): PullSecurityProfile,
// ListSecurityProfiles, RemoveSecurityProfile. podgate's module stays on cri-api v0.37 until
// v0.38.0 is served, so there are no generated types for the new messages: the fake registers
// one hand-made grpc.ServiceDesc for runtime.v1.ImageService holding both, and carries the new
// messages as raw bytes (rawCodec), read and written with protowire at cri-api v0.38.0-beta.0's
// field numbers. It reads a PullSecurityProfileRequest another way than podgate does: fields 1
// to 3 are PullImageRequest's messages, so it decodes the request as a v0.37 PullImageRequest
// and takes field 4 (profile_kind) from what that leaves unknown.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/distribution/reference"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	encproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// SeccompKind is cri-api v0.38's SecurityProfileKind Seccomp.
const SeccompKind int32 = 1

// ProfileRequest is a PullSecurityProfileRequest (cri-api v0.38).
type ProfileRequest struct {
	// PullImageRequest holds fields 1 to 3: image, auth, sandbox_config.
	*runtimeapi.PullImageRequest
	// Kind is field 4, profile_kind.
	Kind int32
}

// Marshal encodes the request as a 1.38 kubelet sends it.
func (r ProfileRequest) Marshal() ([]byte, error) {
	b, err := proto.Marshal(r.PullImageRequest)
	if err != nil || r.Kind == 0 {
		return b, err
	}
	b = protowire.AppendTag(b, 4, protowire.VarintType)
	return protowire.AppendVarint(b, uint64(int64(r.Kind))), nil
}

// DecodeProfileRequest reads a PullSecurityProfileRequest as the fake does.
func DecodeProfileRequest(b []byte) (ProfileRequest, error) {
	req := &runtimeapi.PullImageRequest{}
	if err := proto.Unmarshal(b, req); err != nil {
		return ProfileRequest{}, err
	}
	r := ProfileRequest{PullImageRequest: req}
	var rest []byte
	unknown := req.ProtoReflect().GetUnknown()
	for len(unknown) > 0 {
		num, typ, n := protowire.ConsumeTag(unknown)
		vn := protowire.ConsumeFieldValue(num, typ, unknown[n:])
		if n < 0 || vn < 0 {
			return ProfileRequest{}, errors.New("malformed unknown fields")
		}
		if num == 4 && typ == protowire.VarintType {
			v, _ := protowire.ConsumeVarint(unknown[n:])
			r.Kind = int32(v) //nolint:gosec // an enum takes the varint's low 32 bits
		} else {
			rest = append(rest, unknown[:n+vn]...)
		}
		unknown = unknown[n+vn:]
	}
	req.ProtoReflect().SetUnknown(rest)
	return r, nil
}

// ProfileInfo is a SecurityProfileInfo of ListSecurityProfiles.
type ProfileInfo struct {
	Digest string
	Refs   []string
	Size   uint64
}

// ProfileServer is what the fake serves of cri-api v0.38's security-profile methods.
type ProfileServer interface {
	PullSecurityProfile(ctx context.Context, req ProfileRequest) (cached bool, err error)
	ListSecurityProfiles(ctx context.Context) ([]ProfileInfo, error)
	RemoveSecurityProfile(ctx context.Context, digest string) error
}

// ImageServer is a 1.38 runtime's image service: v0.37's methods and the security-profile ones.
type ImageServer interface {
	runtimeapi.ImageServiceServer
	ProfileServer
}

// Images is an ImageServer: images is v0.37's image service (unimplemented methods answer
// Unimplemented), profiles the security-profile methods.
type Images struct {
	runtimeapi.ImageServiceServer
	ProfileServer
}

// ServeImages serves rt (RuntimeService; nil for none) and images (ImageService, cri-api v0.38)
// on the unix socket path until the test ends.
func ServeImages(t testing.TB, path string, rt runtimeapi.RuntimeServiceServer, images ImageServer) {
	t.Helper()
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(grpc.ForceServerCodecV2(rawCodec{}))
	if rt != nil {
		runtimeapi.RegisterRuntimeServiceServer(gs, rt)
	}
	desc := imageServiceDesc()
	gs.RegisterService(&desc, images)
	served := make(chan struct{})
	go func() { defer close(served); _ = gs.Serve(l) }() // returns when stopped below
	t.Cleanup(func() { gs.Stop(); <-served })
}

// imageServiceDesc is cri-api v0.37's ImageService with cri-api v0.38's security-profile methods.
func imageServiceDesc() grpc.ServiceDesc {
	d := runtimeapi.ImageService_ServiceDesc
	d.HandlerType = (*ImageServer)(nil)
	d.Methods = append(slices.Clone(d.Methods),
		grpc.MethodDesc{MethodName: "PullSecurityProfile", Handler: rawHandler(func(ctx context.Context, s ProfileServer, in []byte) ([]byte, error) {
			req, err := DecodeProfileRequest(in)
			if err != nil {
				return nil, status.Errorf(codes.InvalidArgument, "fake runtime: decode PullSecurityProfileRequest: %v", err)
			}
			cached, err := s.PullSecurityProfile(ctx, req)
			if err != nil || !cached {
				return nil, err // cached false: the empty message
			}
			return protowire.AppendVarint(protowire.AppendTag(nil, 1, protowire.VarintType), 1), nil
		})},
		grpc.MethodDesc{MethodName: "ListSecurityProfiles", Handler: rawHandler(func(ctx context.Context, s ProfileServer, _ []byte) ([]byte, error) {
			infos, err := s.ListSecurityProfiles(ctx)
			return encodeProfileList(infos), err
		})},
		grpc.MethodDesc{MethodName: "RemoveSecurityProfile", Handler: rawHandler(func(ctx context.Context, s ProfileServer, in []byte) ([]byte, error) {
			digest, err := stringField(in, 1)
			if err != nil {
				return nil, status.Errorf(codes.InvalidArgument, "fake runtime: decode RemoveSecurityProfileRequest: %v", err)
			}
			return nil, s.RemoveSecurityProfile(ctx, digest)
		})},
	)
	return d
}

// rawHandler is a grpc.MethodDesc handler of raw messages.
func rawHandler(fn func(ctx context.Context, s ProfileServer, in []byte) ([]byte, error)) grpc.MethodHandler {
	return func(srv any, ctx context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
		var in raw
		if err := dec(&in); err != nil {
			return nil, err
		}
		out, err := fn(ctx, srv.(ProfileServer), in)
		if err != nil {
			return nil, err
		}
		return (*raw)(&out), nil
	}
}

// encodeProfileList is a ListSecurityProfilesResponse: profiles = 1, each a SecurityProfileInfo
// (digest = 1, refs = 2, size = 3).
func encodeProfileList(infos []ProfileInfo) []byte {
	var out []byte
	for _, p := range infos {
		var m []byte
		m = protowire.AppendTag(m, 1, protowire.BytesType)
		m = protowire.AppendString(m, p.Digest)
		for _, ref := range p.Refs {
			m = protowire.AppendTag(m, 2, protowire.BytesType)
			m = protowire.AppendString(m, ref)
		}
		m = protowire.AppendTag(m, 3, protowire.VarintType)
		m = protowire.AppendVarint(m, p.Size)
		out = protowire.AppendTag(out, 1, protowire.BytesType)
		out = protowire.AppendBytes(out, m)
	}
	return out
}

// decodeProfileList reads a ListSecurityProfilesResponse.
func decodeProfileList(b []byte) ([]ProfileInfo, error) {
	var out []ProfileInfo
	err := eachField(b, func(num protowire.Number, v []byte) error {
		if num != 1 {
			return nil
		}
		m, _ := protowire.ConsumeBytes(v)
		var p ProfileInfo
		err := eachField(m, func(num protowire.Number, v []byte) error {
			switch num {
			case 1, 2:
				s, n := protowire.ConsumeString(v)
				if n < 0 {
					return protowire.ParseError(n)
				}
				if num == 1 {
					p.Digest = s
				} else {
					p.Refs = append(p.Refs, s)
				}
			case 3:
				p.Size, _ = protowire.ConsumeVarint(v)
			}
			return nil
		})
		out = append(out, p)
		return err
	})
	return out, err
}

// stringField is the last value of string field num in message b, "" without one.
func stringField(b []byte, num protowire.Number) (string, error) {
	var out string
	err := eachField(b, func(n protowire.Number, v []byte) error {
		if n == num {
			s, sn := protowire.ConsumeString(v)
			if sn < 0 {
				return protowire.ParseError(sn)
			}
			out = s
		}
		return nil
	})
	return out, err
}

// eachField calls fn with each field of message b and its value's bytes.
func eachField(b []byte, fn func(num protowire.Number, v []byte) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		vn := protowire.ConsumeFieldValue(num, typ, b[n:])
		if vn < 0 {
			return protowire.ParseError(vn)
		}
		if err := fn(num, b[n:n+vn]); err != nil {
			return err
		}
		b = b[n+vn:]
	}
	return nil
}

// raw is a message carried as its bytes by rawCodec.
type raw []byte

// rawCodec encodes *raw as its bytes and everything else as protobuf; it keeps the name "proto",
// so the wire content type stays application/grpc+proto.
type rawCodec struct{}

func (rawCodec) Name() string { return encproto.Name }

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	if r, ok := v.(*raw); ok {
		return mem.BufferSlice{mem.SliceBuffer(*r)}, nil
	}
	return encoding.GetCodecV2(encproto.Name).Marshal(v)
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	if r, ok := v.(*raw); ok {
		*r = data.Materialize()
		return nil
	}
	return encoding.GetCodecV2(encproto.Name).Unmarshal(data, v)
}

// ProfileClient calls cri-api v0.38's security-profile methods as a 1.38 kubelet does.
type ProfileClient struct {
	Conn grpc.ClientConnInterface
}

const imageServicePath = "/runtime.v1.ImageService/"

// PullSecurityProfile pulls req's profile and returns the answer's cached.
func (c ProfileClient) PullSecurityProfile(ctx context.Context, req ProfileRequest) (bool, error) {
	in, err := req.Marshal()
	if err != nil {
		return false, err
	}
	return c.PullSecurityProfileBytes(ctx, in)
}

// PullSecurityProfileBytes sends in, a PullSecurityProfileRequest's bytes (or not), and returns
// the answer's cached.
func (c ProfileClient) PullSecurityProfileBytes(ctx context.Context, in []byte) (bool, error) {
	var out raw
	if err := c.Conn.Invoke(ctx, imageServicePath+"PullSecurityProfile", (*raw)(&in), &out, grpc.ForceCodecV2(rawCodec{})); err != nil {
		return false, err
	}
	cached := false
	err := eachField(out, func(num protowire.Number, v []byte) error {
		if num == 1 {
			x, _ := protowire.ConsumeVarint(v)
			cached = x != 0
		}
		return nil
	})
	return cached, err
}

// ListSecurityProfiles lists the profiles the runtime holds.
func (c ProfileClient) ListSecurityProfiles(ctx context.Context) ([]ProfileInfo, error) {
	var in, out raw
	if err := c.Conn.Invoke(ctx, imageServicePath+"ListSecurityProfiles", &in, &out, grpc.ForceCodecV2(rawCodec{})); err != nil {
		return nil, err
	}
	return decodeProfileList(out)
}

// RemoveSecurityProfile removes the profile of this digest.
func (c ProfileClient) RemoveSecurityProfile(ctx context.Context, digest string) error {
	in := raw(protowire.AppendString(protowire.AppendTag(nil, 1, protowire.BytesType), digest))
	var out raw
	return c.Conn.Invoke(ctx, imageServicePath+"RemoveSecurityProfile", &in, &out, grpc.ForceCodecV2(rawCodec{}))
}

// Profiles is a ProfileServer holding profiles in memory, as cri-api v0.38's own fake image
// service does (pkg/apis/testing): a kind other than Seccomp and a reference that is not
// digest-pinned are InvalidArgument with the message prefix SecurityProfileInvalid; a pull
// answers cached when the reference was pulled before. Before, when set, runs first in every
// PullSecurityProfile (to hold it, count it, or fail it: its error is the answer).
type Profiles struct {
	Before func(ctx context.Context, req ProfileRequest) error

	mu    sync.Mutex
	refs  map[string]int32 // reference → kind
	calls []ProfileRequest
}

var _ ProfileServer = (*Profiles)(nil)

// PullSecurityProfile implements ProfileServer.
func (p *Profiles) PullSecurityProfile(ctx context.Context, req ProfileRequest) (bool, error) {
	p.mu.Lock()
	p.calls = append(p.calls, req)
	p.mu.Unlock()
	if p.Before != nil {
		if err := p.Before(ctx, req); err != nil {
			return false, err
		}
	}
	if req.Kind != SeccompKind {
		return false, status.Errorf(codes.InvalidArgument, "SecurityProfileInvalid: unsupported security profile kind %d", req.Kind)
	}
	ref := req.GetImage().GetImage()
	if digestOf(ref) == "" {
		return false, status.Errorf(codes.InvalidArgument, "SecurityProfileInvalid: security profile reference %q is not digest-pinned", ref)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.refs == nil {
		p.refs = map[string]int32{}
	}
	_, cached := p.refs[ref]
	p.refs[ref] = req.Kind
	return cached, nil
}

// ListSecurityProfiles implements ProfileServer: the profiles by digest, each with its refs.
func (p *Profiles) ListSecurityProfiles(context.Context) ([]ProfileInfo, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	byDigest := map[string]*ProfileInfo{}
	for ref := range p.refs {
		d := digestOf(ref)
		if byDigest[d] == nil {
			byDigest[d] = &ProfileInfo{Digest: d, Size: 1024}
		}
		byDigest[d].Refs = append(byDigest[d].Refs, ref)
	}
	out := make([]ProfileInfo, 0, len(byDigest))
	for _, info := range byDigest {
		slices.Sort(info.Refs)
		out = append(out, *info)
	}
	slices.SortFunc(out, func(a, b ProfileInfo) int { return strings.Compare(a.Digest, b.Digest) })
	return out, nil
}

// RemoveSecurityProfile implements ProfileServer: every reference of the digest goes; an empty
// digest is InvalidArgument.
func (p *Profiles) RemoveSecurityProfile(_ context.Context, digest string) error {
	if digest == "" {
		return status.Error(codes.InvalidArgument, "security profile digest must not be empty")
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for ref := range p.refs {
		if digestOf(ref) == digest {
			delete(p.refs, ref)
		}
	}
	return nil
}

// Calls returns the PullSecurityProfile requests received so far.
func (p *Profiles) Calls() []ProfileRequest {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.calls)
}

// digestOf is the digest of a digest-pinned reference, "" for another.
func digestOf(ref string) string {
	r, err := reference.ParseNormalizedNamed(ref)
	if err != nil {
		return ""
	}
	if d, ok := r.(reference.Digested); ok {
		return d.Digest().String()
	}
	return ""
}

// String describes the request for test failures.
func (r ProfileRequest) String() string {
	return fmt.Sprintf("%s kind %d handler %q", r.GetImage().GetImage(), r.Kind, r.GetImage().GetRuntimeHandler())
}
