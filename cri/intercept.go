package cri

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/klog/v2"

	"github.com/podgate/podgate/cri/relay"
)

// Method names a CRI method with its request and response types.
type Method[Req, Resp proto.Message] struct {
	service string
	name    string
	newReq  func() Req
	newResp func() Resp
	// detached: the call its hooks forward may outlive the caller's connection (a shared image
	// pull), so it goes on podgate's own connection to the backend, not the caller's.
	detached bool
}

// FullName is the method's gRPC name, e.g. "/runtime.v1.RuntimeService/RunPodSandbox".
func (m Method[Req, Resp]) FullName() string { return "/" + m.service + "/" + m.name }

func runtimeMethod[Req, Resp proto.Message](name string, newReq func() Req, newResp func() Resp) Method[Req, Resp] {
	return Method[Req, Resp]{service: runtimeService, name: name, newReq: newReq, newResp: newResp}
}

// The methods podgate's features intercept.
var (
	RunPodSandbox = runtimeMethod("RunPodSandbox",
		func() *runtimeapi.RunPodSandboxRequest { return new(runtimeapi.RunPodSandboxRequest) },
		func() *runtimeapi.RunPodSandboxResponse { return new(runtimeapi.RunPodSandboxResponse) })
	StopPodSandbox = runtimeMethod("StopPodSandbox",
		func() *runtimeapi.StopPodSandboxRequest { return new(runtimeapi.StopPodSandboxRequest) },
		func() *runtimeapi.StopPodSandboxResponse { return new(runtimeapi.StopPodSandboxResponse) })
	RemovePodSandbox = runtimeMethod("RemovePodSandbox",
		func() *runtimeapi.RemovePodSandboxRequest { return new(runtimeapi.RemovePodSandboxRequest) },
		func() *runtimeapi.RemovePodSandboxResponse { return new(runtimeapi.RemovePodSandboxResponse) })
	CreateContainer = runtimeMethod("CreateContainer",
		func() *runtimeapi.CreateContainerRequest { return new(runtimeapi.CreateContainerRequest) },
		func() *runtimeapi.CreateContainerResponse { return new(runtimeapi.CreateContainerResponse) })
	StartContainer = runtimeMethod("StartContainer",
		func() *runtimeapi.StartContainerRequest { return new(runtimeapi.StartContainerRequest) },
		func() *runtimeapi.StartContainerResponse { return new(runtimeapi.StartContainerResponse) })
	RemoveContainer = runtimeMethod("RemoveContainer",
		func() *runtimeapi.RemoveContainerRequest { return new(runtimeapi.RemoveContainerRequest) },
		func() *runtimeapi.RemoveContainerResponse { return new(runtimeapi.RemoveContainerResponse) })
	UpdateContainerResources = runtimeMethod("UpdateContainerResources",
		func() *runtimeapi.UpdateContainerResourcesRequest {
			return new(runtimeapi.UpdateContainerResourcesRequest)
		},
		func() *runtimeapi.UpdateContainerResourcesResponse {
			return new(runtimeapi.UpdateContainerResourcesResponse)
		})
	// UpdatePodSandboxResources is the kubelet's word to the runtime of a pod-level resize
	// (PodLevelResources, InPlacePodLevelResourcesVerticalScaling), sent before the kubelet
	// writes the pod's cgroup itself.
	UpdatePodSandboxResources = runtimeMethod("UpdatePodSandboxResources",
		func() *runtimeapi.UpdatePodSandboxResourcesRequest {
			return new(runtimeapi.UpdatePodSandboxResourcesRequest)
		},
		func() *runtimeapi.UpdatePodSandboxResourcesResponse {
			return new(runtimeapi.UpdatePodSandboxResourcesResponse)
		})
	PullImage = Method[*runtimeapi.PullImageRequest, *runtimeapi.PullImageResponse]{
		service: imageService, name: "PullImage",
		newReq:   func() *runtimeapi.PullImageRequest { return new(runtimeapi.PullImageRequest) },
		newResp:  func() *runtimeapi.PullImageResponse { return new(runtimeapi.PullImageResponse) },
		detached: true,
	}
)

// Forward sends req to the backend and returns its response.
type Forward[Req, Resp proto.Message] func(ctx context.Context, req Req) (Resp, error)

// Interceptor runs around the forwarding of one CRI method: what it does before calling next is
// the "before" interception point, what it does with next's result the "after" one. It may
// refuse the call by returning an error without calling next (nothing reaches the backend), wait
// before calling next, or call it with a changed request.
//
// Messages are compared, not trusted: if req and the response come back unchanged, the bytes
// the kubelet sent and the bytes the backend answered are forwarded as they were; if an
// interceptor changed either, the changed message is encoded. A hook that only reads is
// registered with Observe instead, and its method spared the comparison.
type Interceptor[Req, Resp proto.Message] func(ctx context.Context, req Req, next Forward[Req, Resp]) (Resp, error)

// Intercept adds fn around method m. Interceptors of one method nest in the order they are
// added: the first added is the outermost. Call it before Serve.
func Intercept[Req, Resp proto.Message](s *Server, m Method[Req, Resp], fn Interceptor[Req, Resp]) {
	addHook(s, m, fn, true)
}

// Observe adds fn around method m as Intercept does, for a hook that only reads: it may
// refuse the call, wait before calling next, and act on the answer, but it changes neither the
// request nor the response. A method whose hooks all observe is served without looking for
// changes: the backend gets the bytes the kubelet sent and the kubelet the bytes the backend
// answered, whatever fn does to the messages, and the copies and comparisons that finding a
// change takes are not made. Beside an Interceptor of the same method, an observer's change
// would be found and sent as the Interceptor's; it must make none.
func Observe[Req, Resp proto.Message](s *Server, m Method[Req, Resp], fn Interceptor[Req, Resp]) {
	addHook(s, m, fn, false)
}

func addHook[Req, Resp proto.Message](s *Server, m Method[Req, Resp], fn Interceptor[Req, Resp], changes bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.started {
		panic(fmt.Sprintf("cri: a hook for %s after Serve", m.FullName()))
	}
	if h, ok := s.chains[m.FullName()]; ok {
		// The entry was made by this function for this Method, so it has these types.
		h := h.(*interceptedMethod[Req, Resp])
		h.chain = append(h.chain, fn)
		h.changes = h.changes || changes
		return
	}
	h := &interceptedMethod[Req, Resp]{s: s, m: m, chain: []Interceptor[Req, Resp]{fn}, changes: changes,
		plan: newDecodePlan(m.newReq().ProtoReflect().Descriptor())}
	s.chains[m.FullName()] = h
	s.unaryHandlers[m.FullName()] = h.serveUnary
}

// interceptedMethod serves one intercepted method: it decodes the request, runs the
// interceptors around the forwarding, and answers with the backend's bytes when nothing changed.
type interceptedMethod[Req, Resp proto.Message] struct {
	s     *Server
	m     Method[Req, Resp]
	chain []Interceptor[Req, Resp]
	// changes: a hook was added by Intercept and may change the messages, so they are
	// compared with copies of what came; with observers only, what came goes on.
	changes bool
	// plan is what the pre-scan of a request (decodeCost) knows of the request type.
	plan *decodePlan
}

// serveUnary serves the method as the relay's Unary target: the request message as it came,
// the answer's bytes back. The stats handlers (tracing) see the call as a gRPC server's would.
func (h *interceptedMethod[Req, Resp]) serveUnary(ctx context.Context, call *relay.UnaryCall) *relay.UnaryAnswer {
	ts := &unaryStream{method: call.Path}
	ctx = grpc.NewContextWithServerTransportStream(metadata.NewIncomingContext(ctx, call.Header), ts)
	ctx = h.s.statsBegin(ctx, call.Path, false)
	out, err := h.serve(ctx, call)
	h.s.statsEnd(ctx, err)
	a := &relay.UnaryAnswer{Err: err}
	a.Header, a.Trailer = ts.finish()
	if err == nil {
		a.Message, a.Err = answerBytes(out)
	}
	return a
}

// serve runs the interceptors around the forwarding of one request: the boundary's metrics and
// error mapping, the request decoded, the answer as the backend's bytes when nothing changed.
func (h *interceptedMethod[Req, Resp]) serve(ctx context.Context, uc *relay.UnaryCall) (any, error) {
	var out any
	name := h.m.FullName()
	ctx = klog.NewContext(ctx, h.s.logger)
	err := h.s.instrument(ctx, name, func() error {
		c := &interceptedCall[Req, Resp]{h: h, call: uc}
		req, release, err := h.decode(uc)
		if err != nil {
			return err
		}
		defer release()
		c.req = req
		if h.changes {
			c.pristineReq = proto.Clone(req)
		}
		call := Forward[Req, Resp](c.forward)
		for i := len(h.chain) - 1; i >= 0; i-- {
			fn, next := h.chain[i], call
			call = func(ctx context.Context, r Req) (Resp, error) { return fn(ctx, r, next) }
		}
		resp, err := call(ctx, req)
		if err != nil {
			return err
		}
		out = c.answer(resp)
		return nil
	})
	return out, err
}

// decode decodes the call's request once what it will hold decoded is counted against the
// relay's budget, and returns the function that gives that back, for when the call is done
// with the request. A request no kubelet could send (a list of millions of entries) is refused
// InvalidArgument naming its field, one that does not fit the budget ResourceExhausted: before
// anything is decoded, and nothing is forwarded.
func (h *interceptedMethod[Req, Resp]) decode(uc *relay.UnaryCall) (Req, func(), error) {
	var zero Req
	cost, err := h.plan.decodeCost(h.m.name, uc.Message)
	var long listTooLong
	if errors.As(err, &long) {
		uc.Report(relay.ReasonListTooLong, fmt.Sprintf("sent %s with %d entries in %s", h.m.name, long.n, long.path), "answered InvalidArgument")
	}
	if err != nil {
		return zero, nil, err
	}
	if h.changes {
		// The pristine copy costs as much again, and a changed request is encoded anew.
		cost = 2*cost + int64(len(uc.Message))
	}
	release, err := uc.Hold(cost)
	if err != nil {
		return zero, nil, err
	}
	req := h.m.newReq()
	if err := proto.Unmarshal(uc.Message, req); err != nil {
		release()
		return zero, nil, status.Errorf(codes.InvalidArgument, "decode %s request: %v", h.m.name, err)
	}
	return req, release, nil
}

// interceptedCall is the state of one intercepted call. next may be called again (a retry),
// but not concurrently.
type interceptedCall[Req, Resp proto.Message] struct {
	h    *interceptedMethod[Req, Resp]
	call *relay.UnaryCall // the request's bytes as the client sent them: call.Message
	req  Req
	// pristineReq and pristineResp are copies to find changes in, made only when a hook may
	// change the messages (changes).
	pristineReq proto.Message
	// what the backend last answered: the decoded message, its copy, its bytes
	resp         Resp
	pristineResp proto.Message
	respBytes    []byte
}

func (c *interceptedCall[Req, Resp]) forward(ctx context.Context, r Req) (Resp, error) {
	var zero Resp
	m := c.h.m
	send := c.call.Message
	if c.h.changes && (proto.Message(r) != proto.Message(c.req) || !proto.Equal(r, c.pristineReq)) {
		b, err := proto.Marshal(r)
		if err != nil {
			return zero, fmt.Errorf("encode %s request: %w", m.name, err)
		}
		send = b
	}
	b := c.h.s.backendFor(m.FullName())
	hdr, trl, respBytes, err := c.h.s.forward(ctx, c.call, b, m.FullName(), m.detached, send)
	if len(hdr) > 0 {
		_ = grpc.SetHeader(ctx, hdr) // fails only once headers are out, which they are not
	}
	if len(trl) > 0 {
		_ = grpc.SetTrailer(ctx, trl)
	}
	if err != nil {
		return zero, err
	}
	resp := m.newResp()
	if err := proto.Unmarshal(respBytes, resp); err != nil {
		return zero, status.Errorf(codes.Internal, "decode %s response from %s backend: %v", m.name, b.name, err)
	}
	c.resp, c.respBytes = resp, respBytes
	if c.h.changes {
		c.pristineResp = proto.Clone(resp)
	}
	return resp, nil
}

// answer returns what goes back to the client: the backend's own bytes when the hooks returned
// its response unchanged (or only observe), else the message they returned.
func (c *interceptedCall[Req, Resp]) answer(resp Resp) any {
	if c.respBytes == nil {
		return resp // not forwarded: a hook's own answer
	}
	if !c.h.changes || proto.Message(resp) == proto.Message(c.resp) && proto.Equal(resp, c.pristineResp) {
		return frameOf(c.respBytes)
	}
	return resp
}

// unaryStream is what grpc.SetHeader and grpc.SetTrailer reach in a handler the relay runs: it
// keeps the header and trailer metadata for the answer. A forward may outlive its caller (a
// shared image pull); once the answer has taken them, it refuses more, as grpc's stream does.
type unaryStream struct {
	method          string
	mu              sync.Mutex
	header, trailer metadata.MD
	done            bool
}

var _ grpc.ServerTransportStream = (*unaryStream)(nil)

func (s *unaryStream) Method() string { return s.method }

func (s *unaryStream) SetHeader(md metadata.MD) error { return s.add(&s.header, md) }

func (s *unaryStream) SendHeader(md metadata.MD) error { return s.SetHeader(md) }

func (s *unaryStream) SetTrailer(md metadata.MD) error { return s.add(&s.trailer, md) }

// add joins md to the header or trailer metadata, until the call is answered.
func (s *unaryStream) add(to *metadata.MD, md metadata.MD) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.done {
		return status.Error(codes.Internal, "the call has been answered")
	}
	*to = metadata.Join(*to, md)
	return nil
}

// finish returns the metadata for the answer; later changes are refused.
func (s *unaryStream) finish() (header, trailer metadata.MD) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.done = true
	return s.header, s.trailer
}

// answerBytes is what an intercepted method's handler returned, as bytes: the backend's own, or
// the changed message encoded.
func answerBytes(out any) ([]byte, error) {
	switch m := out.(type) {
	case *frame:
		b := m.bytes()
		return b, nil
	case proto.Message:
		b, err := proto.Marshal(m)
		if err != nil {
			return nil, status.Errorf(codes.Internal, "encode the answer: %v", err)
		}
		return b, nil
	}
	return nil, status.Errorf(codes.Internal, "an answer of type %T", out)
}
