package cri

// Methods newer than podgate's k8s.io/cri-api (v0.37). cri-api v0.38 (Kubernetes 1.38,
// KEP-6061) adds three ImageService methods for seccomp profiles pulled from registries as OCI
// artifacts. podgate has no generated types for their messages until it moves to cri-api
// v0.38.0, which the module proxy does not serve yet (v0.38.0-beta.0 is served, and needs Go
// 1.27). Then PullSecurityProfile becomes a Method like PullImage (its Interceptor typed),
// newerMethods comes from the generated ServiceDesc as the others' names do, and this file
// goes.

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/reflect/protoreflect"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/klog/v2"

	"github.com/podgate/podgate/cri/relay"
)

// newerMethods are the unary methods of cri-api v0.38 that v0.37 lacks, by service. They are
// counted under their own names in podgate_cri_requests_total (not "other"), and served as the
// unary calls they are: a Shutdown lets them finish rather than ending them as streams.
var newerMethods = map[string][]string{
	imageService: {"PullSecurityProfile", "ListSecurityProfiles", "RemoveSecurityProfile"},
}

// newerMethodNames are newerMethods' full names, "/service/Method".
func newerMethodNames() []string {
	var out []string
	for service, names := range newerMethods {
		for _, name := range names {
			out = append(out, "/"+service+"/"+name)
		}
	}
	return out
}

// RawMethod names a method newer than podgate's cri-api: podgate has no types for its
// messages, so its hook gets the request's bytes and decodes what it needs of them itself
// (InterceptRaw), and the backend gets those bytes as the client sent them.
type RawMethod struct {
	service, name string
	// shape is a request type of podgate's cri-api whose fields are the request's wherever
	// both have a field: the pre-scan (decodeCost) walks the request along it, so that what
	// the hook decodes of it is bounded and counted against the relay's budget, as for a
	// Method's request. A field shape lacks is counted as bytes.
	shape protoreflect.MessageDescriptor
	// refusal begins the message of a request refused as malformed before the hook runs: the
	// method's word for a permanent rejection, which the kubelet does not retry.
	refusal string
	// detached: the call may outlive its caller (a shared pull), so it goes on podgate's own
	// connection to the backend, as PullImage's does.
	detached bool
}

// FullName is the method's gRPC name, e.g. "/runtime.v1.ImageService/PullSecurityProfile".
func (m RawMethod) FullName() string { return "/" + m.service + "/" + m.name }

// PullSecurityProfile (cri-api v0.38, KEP-6061, the kubelet's gate SecurityProfileOCI) pulls a
// security profile from a registry into the runtime. Its request's fields 1 to 3 (image, auth,
// sandbox_config) are PullImageRequest's, with the same messages, and field 4 is profile_kind,
// an enum: PullImageRequest is its shape. A runtime refuses a request for good with the message
// prefix SecurityProfileInvalid (k8s.io/cri-api/pkg/errors in v0.38), which the kubelet does
// not retry; podgate's refusals of a malformed request say the same.
var PullSecurityProfile = RawMethod{
	service: imageService, name: "PullSecurityProfile",
	shape:    (*runtimeapi.PullImageRequest)(nil).ProtoReflect().Descriptor(),
	refusal:  "SecurityProfileInvalid",
	detached: true,
}

// RawForward sends the request, as the client sent it, to the backend and returns the bytes of
// the backend's answer. It may be called again (a retry), but not concurrently.
type RawForward func(ctx context.Context) ([]byte, error)

// RawInterceptor runs around the forwarding of a RawMethod: it gets the request's bytes (to
// read, never to change: the slice is the relay's) and next, and returns the bytes the client
// gets, the backend's own or bytes it made, which it must not change afterwards (several
// answers may send the same slice).
type RawInterceptor func(ctx context.Context, req []byte, next RawForward) ([]byte, error)

// InterceptRaw makes fn the hook of method m; a RawMethod has one hook. Call it before Serve.
func InterceptRaw(s *Server, m RawMethod, fn RawInterceptor) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.started {
		panic(fmt.Sprintf("cri: a hook for %s after Serve", m.FullName()))
	}
	if _, ok := s.unaryHandlers[m.FullName()]; ok {
		panic(fmt.Sprintf("cri: a second hook for %s", m.FullName()))
	}
	h := &rawMethod{s: s, m: m, fn: fn, plan: newDecodePlan(m.shape)}
	s.unaryHandlers[m.FullName()] = h.serveUnary
}

// rawMethod serves a RawMethod: the pre-scan and the hold of its request, its hook around the
// forwarding of the request's bytes, the hook's bytes back.
type rawMethod struct {
	s    *Server
	m    RawMethod
	fn   RawInterceptor
	plan *decodePlan
}

// serveUnary serves the method as the relay's Unary target, as interceptedMethod.serveUnary
// does a Method.
func (h *rawMethod) serveUnary(ctx context.Context, call *relay.UnaryCall) *relay.UnaryAnswer {
	ts := &unaryStream{method: call.Path}
	ctx = grpc.NewContextWithServerTransportStream(metadata.NewIncomingContext(ctx, call.Header), ts)
	ctx = h.s.statsBegin(ctx, call.Path, false)
	var out []byte
	logged := klog.NewContext(ctx, h.s.logger)
	err := h.s.instrument(logged, h.m.FullName(), func() error {
		release, err := h.hold(call)
		if err != nil {
			return err
		}
		defer release()
		out, err = h.fn(logged, call.Message, func(ctx context.Context) ([]byte, error) { return h.forward(ctx, call) })
		return err
	})
	h.s.statsEnd(ctx, err)
	a := &relay.UnaryAnswer{Err: err, Message: out}
	a.Header, a.Trailer = ts.finish()
	return a
}

// hold walks the request along the method's shape and holds what decoding it may allocate
// against the relay's budget, until the returned function is called. A malformed request, or
// one with a list no kubelet could send, is refused InvalidArgument with the method's refusal
// word.
func (h *rawMethod) hold(uc *relay.UnaryCall) (func(), error) {
	cost, err := h.plan.decodeCost(h.m.name, uc.Message)
	var long listTooLong
	if errors.As(err, &long) {
		uc.Report(relay.ReasonListTooLong, fmt.Sprintf("sent %s with %d entries in %s", h.m.name, long.n, long.path), "answered InvalidArgument")
	}
	if err != nil {
		return nil, h.refuse(err)
	}
	return uc.Hold(cost)
}

// refuse gives an InvalidArgument refusal the method's refusal word.
func (h *rawMethod) refuse(err error) error {
	st := status.Convert(err)
	if h.m.refusal == "" || st.Code() != codes.InvalidArgument || strings.HasPrefix(st.Message(), h.m.refusal) {
		return err
	}
	return status.Error(codes.InvalidArgument, h.m.refusal+": "+st.Message())
}

// forward sends the request's bytes, unchanged, to the backend and returns its answer's bytes;
// the backend's header and trailer metadata go to the caller, as a Method's forward does.
func (h *rawMethod) forward(ctx context.Context, uc *relay.UnaryCall) ([]byte, error) {
	name := h.m.FullName()
	hdr, trl, resp, err := h.s.forward(ctx, uc, h.s.backendFor(name), name, h.m.detached, uc.Message)
	if len(hdr) > 0 {
		_ = grpc.SetHeader(ctx, hdr) // fails only once the answer is out: a follower's, or a caller gone
	}
	if len(trl) > 0 {
		_ = grpc.SetTrailer(ctx, trl)
	}
	return resp, err
}
