package stresscall

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand/v2"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// Method is the stress call's path.
const Method = "/runtime.v1.RuntimeService/HostileStress"

// The metadata keys: the request's, the answer's header and its trailer.
const (
	RequestKey = "x-stress-request"
	HeaderKey  = "x-stress-header"
	TrailerKey = "x-stress-trailer"
)

// Spec is what one call sends and wants back, all of it made from Seed.
type Spec struct {
	Seed uint64
	// Answer is the answer's size in bytes, in Messages messages (at least one).
	Answer, Messages int
	// Header and Trailer are the sizes of the answer's metadata values.
	Header, Trailer int
	// Payload is the size of the request's payload; Request that of its metadata value.
	Payload, Request int
}

// The kinds of bytes a seed makes.
const (
	kindAnswer byte = iota + 1
	kindPayload
	kindRequest
	kindHeader
	kindTrailer
)

const specSize = 8 + 6*4

// Encode is the request's message: the spec, then the payload.
func (s Spec) Encode() []byte {
	b := make([]byte, specSize, specSize+s.Payload)
	binary.BigEndian.PutUint64(b, s.Seed)
	for i, v := range []int{s.Answer, s.Messages, s.Header, s.Trailer, s.Payload, s.Request} {
		binary.BigEndian.PutUint32(b[8+4*i:], uint32(v))
	}
	return append(b, Bytes(s.Seed, kindPayload, s.Payload)...)
}

// Decode reads a request's message and checks its payload.
func Decode(b []byte) (Spec, error) {
	if len(b) < specSize {
		return Spec{}, fmt.Errorf("request of %d bytes, shorter than a spec (%d)", len(b), specSize)
	}
	s := Spec{Seed: binary.BigEndian.Uint64(b)}
	for i, v := range []*int{&s.Answer, &s.Messages, &s.Header, &s.Trailer, &s.Payload, &s.Request} {
		*v = int(binary.BigEndian.Uint32(b[8+4*i:]))
	}
	if s.Messages < 1 {
		return s, fmt.Errorf("%d messages", s.Messages)
	}
	if at := Differs(b[specSize:], Bytes(s.Seed, kindPayload, s.Payload)); at >= 0 {
		return s, fmt.Errorf("payload of %d bytes (want %d) differs at byte %d", len(b)-specSize, s.Payload, at)
	}
	return s, nil
}

// Bytes are the n bytes of kind that seed makes.
func Bytes(seed uint64, kind byte, n int) []byte {
	var key [32]byte
	binary.BigEndian.PutUint64(key[:], seed)
	key[8] = kind
	b := make([]byte, n)
	_, _ = rand.NewChaCha8(key).Read(b)
	return b
}

// text is n letters that seed makes: a metadata value.
func text(seed uint64, kind byte, n int) string {
	b := Bytes(seed, kind, n)
	for i, c := range b {
		b[i] = 'a' + c%26
	}
	return string(b)
}

// AnswerBytes are the answer's bytes, all its messages one after the other.
func (s Spec) AnswerBytes() []byte { return Bytes(s.Seed, kindAnswer, s.Answer) }

// Parts splits the answer into its messages: equal parts, the last taking what is left.
func (s Spec) Parts() [][]byte {
	all := s.AnswerBytes()
	each := len(all) / s.Messages
	parts := make([][]byte, s.Messages)
	for i := range parts {
		end := (i + 1) * each
		if i == len(parts)-1 {
			end = len(all)
		}
		parts[i] = all[i*each : end]
	}
	return parts
}

// RequestValue is the request's metadata value (RequestKey).
func (s Spec) RequestValue() string { return text(s.Seed, kindRequest, s.Request) }

// HeaderValue is the answer's header metadata value (HeaderKey).
func (s Spec) HeaderValue() string { return text(s.Seed, kindHeader, s.Header) }

// TrailerValue is the answer's trailer metadata value (TrailerKey).
func (s Spec) TrailerValue() string { return text(s.Seed, kindTrailer, s.Trailer) }

// Differs is the first offset at which got and want differ (their lengths too), -1 when they
// are equal.
func Differs(got, want []byte) int {
	if bytes.Equal(got, want) {
		return -1
	}
	for i := range min(len(got), len(want)) {
		if got[i] != want[i] {
			return i
		}
	}
	return min(len(got), len(want))
}

// Serve is a grpc-go server's unknown-service handler that answers Method and, as grpc-go
// does without it, Unimplemented for every other method it has no handler for. A request
// whose bytes are not what its seed makes is answered DataLoss, saying where they differ.
func Serve(_ any, stream grpc.ServerStream) error {
	method, _ := grpc.MethodFromServerStream(stream)
	if method != Method {
		return status.Errorf(codes.Unimplemented, "unknown method %s", method)
	}
	var req wrapperspb.BytesValue
	if err := stream.RecvMsg(&req); err != nil {
		return err
	}
	s, err := Decode(req.GetValue())
	if err != nil {
		return status.Error(codes.DataLoss, err.Error())
	}
	md, _ := metadata.FromIncomingContext(stream.Context())
	if got := md.Get(RequestKey); s.Request > 0 && (len(got) != 1 || got[0] != s.RequestValue()) {
		return status.Errorf(codes.DataLoss, "request metadata: %d values, want one of %d letters", len(got), s.Request)
	}
	if s.Header > 0 {
		if err := stream.SetHeader(metadata.Pairs(HeaderKey, s.HeaderValue())); err != nil {
			return err
		}
	}
	for _, p := range s.Parts() {
		if err := stream.SendMsg(&wrapperspb.BytesValue{Value: p}); err != nil {
			return err
		}
	}
	if s.Trailer > 0 {
		stream.SetTrailer(metadata.Pairs(TrailerKey, s.TrailerValue()))
	}
	return nil
}
