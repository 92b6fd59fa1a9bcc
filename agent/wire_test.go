package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/cri-client/pkg/fake"
)

// The wire side of TestCRIv038FieldsCarried: a CRI runtime that records the bytes of each
// request the test sends through podgate and answers it with bytes of the test's making, and a
// client that sends and receives bytes, not messages.

// wireMsg is a gRPC message carried as its bytes.
type wireMsg struct{ b []byte }

// wireCodec sends a wireMsg as its bytes and decodes into one without looking; other messages
// are protobuf, and the bytes each decoded request came in are kept (byMessage) for the
// server's interceptors. Its name is "proto", so the content type is what a kubelet sends.
type wireCodec struct{ byMessage sync.Map } // proto.Message → []byte

var _ encoding.CodecV2 = (*wireCodec)(nil)

func (*wireCodec) Name() string { return "proto" }

func (*wireCodec) Marshal(v any) (mem.BufferSlice, error) {
	switch m := v.(type) {
	case *wireMsg:
		return mem.BufferSlice{mem.SliceBuffer(m.b)}, nil
	case proto.Message:
		b, err := proto.Marshal(m)
		return mem.BufferSlice{mem.SliceBuffer(b)}, err
	}
	return nil, fmt.Errorf("wireCodec: cannot encode %T", v)
}

func (c *wireCodec) Unmarshal(data mem.BufferSlice, v any) error {
	b := data.Materialize()
	switch m := v.(type) {
	case *wireMsg:
		m.b = b
		return nil
	case proto.Message:
		c.byMessage.Store(m, b)
		return proto.Unmarshal(b, m)
	}
	return fmt.Errorf("wireCodec: cannot decode into %T", v)
}

// caseKey is the metadata key with which the test marks its own calls: the runtime records
// them and answers them with the test's bytes, while podgate's own calls (sandbox status,
// start-up lists) get cri-client's fake runtime as it is.
const caseKey = "x-podgate-test-case"

// wireCall is one of the test's calls as the runtime saw it.
type wireCall struct {
	req     []byte   // the request's bytes as they reached the runtime
	answers [][]byte // the bytes of the runtime's answer (a stream's, one each)
}

// wireRuntime is cri-client's fake runtime behind interceptors that record the test's calls
// and write their answers: answer makes the answer to a call of method from the fake's own
// (nil when the fake was not asked: a method the test does not need the fake's state for).
type wireRuntime struct {
	fake   *fake.RemoteRuntime
	codec  wireCodec
	answer func(method string, fakes proto.Message) (proto.Message, error)
	// asFake are the methods whose calls go to the fake before answer: those that change
	// the fake's state or that podgate reads (the sandbox's and container's lifecycle).
	asFake map[string]bool

	mu    sync.Mutex
	calls map[string]*wireCall // by case and method: "case /runtime.v1.RuntimeService/X"
}

// serveWireRuntime serves a wireRuntime on path until the test ends.
func serveWireRuntime(t *testing.T, path string, asFake map[string]bool, answer func(string, proto.Message) (proto.Message, error)) *wireRuntime {
	t.Helper()
	r := &wireRuntime{fake: fake.NewFakeRemoteRuntime(), answer: answer, asFake: asFake, calls: map[string]*wireCall{}}
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(grpc.ForceServerCodecV2(&r.codec), grpc.UnaryInterceptor(r.unary), grpc.StreamInterceptor(r.stream))
	runtimeapi.RegisterRuntimeServiceServer(gs, r.fake)
	runtimeapi.RegisterImageServiceServer(gs, r.fake)
	served := make(chan struct{})
	go func() { defer close(served); _ = gs.Serve(l) }() // returns when stopped below
	t.Cleanup(func() { gs.Stop(); <-served })
	return r
}

// testCase is the case a call of the test belongs to, "" for podgate's own calls.
func testCase(ctx context.Context) string {
	md, _ := metadata.FromIncomingContext(ctx)
	if v := md.Get(caseKey); len(v) == 1 {
		return v[0]
	}
	return ""
}

func (r *wireRuntime) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	raw, _ := r.codec.byMessage.LoadAndDelete(req)
	c := testCase(ctx)
	if c == "" {
		return handler(ctx, req)
	}
	var fakes proto.Message
	if r.asFake[info.FullMethod] {
		resp, err := handler(ctx, req)
		if err != nil {
			return nil, err
		}
		fakes = resp.(proto.Message)
	}
	msg, err := r.answer(info.FullMethod, fakes)
	if err != nil {
		return nil, err
	}
	b, err := proto.Marshal(msg)
	if err != nil {
		return nil, err
	}
	r.record(c, info.FullMethod, raw.([]byte), b)
	return &wireMsg{b: b}, nil
}

// stream answers a server stream of the test with one message of answer's making; podgate's
// own streams go to the fake.
func (r *wireRuntime) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	c := testCase(ss.Context())
	if c == "" {
		return handler(srv, ss)
	}
	var req wireMsg
	if err := ss.RecvMsg(&req); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	msg, err := r.answer(info.FullMethod, nil)
	if err != nil {
		return err
	}
	b, err := proto.Marshal(msg)
	if err != nil {
		return err
	}
	r.record(c, info.FullMethod, req.b, b)
	return ss.SendMsg(&wireMsg{b: b})
}

func (r *wireRuntime) record(c, method string, req, answer []byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls[c+" "+method] = &wireCall{req: req, answers: [][]byte{answer}}
}

// call is what the runtime saw of the case's call of method; nil when none reached it.
func (r *wireRuntime) call(c, method string) *wireCall {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.calls[c+" "+method]
}

// wireClient calls podgate's CRI socket with bytes, as a kubelet of a later cri-api would send
// them, and returns the bytes of the answer as they arrived.
type wireClient struct{ conn *grpc.ClientConn }

func newWireClient(t *testing.T, socket string) *wireClient {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.ForceCodecV2(&wireCodec{}), grpc.WaitForReady(true)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return &wireClient{conn: conn}
}

// unary makes one unary call of method, marked with the case c.
func (w *wireClient) unary(ctx context.Context, c string, m protoreflect.MethodDescriptor, req []byte) ([]byte, error) {
	var out wireMsg
	err := w.conn.Invoke(metadata.AppendToOutgoingContext(ctx, caseKey, c), fullName(m), &wireMsg{b: req}, &out)
	return out.b, err
}

// serverStream opens a server stream of method, marked with the case c, sends req and returns
// every message the stream answers.
func (w *wireClient) serverStream(ctx context.Context, c string, m protoreflect.MethodDescriptor, req []byte) ([][]byte, error) {
	ctx, cancel := context.WithCancel(metadata.AppendToOutgoingContext(ctx, caseKey, c))
	defer cancel()
	s, err := w.conn.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true}, fullName(m))
	if err != nil {
		return nil, err
	}
	if err := s.SendMsg(&wireMsg{b: req}); err != nil {
		return nil, err
	}
	if err := s.CloseSend(); err != nil {
		return nil, err
	}
	var out [][]byte
	for {
		var msg wireMsg
		if err := s.RecvMsg(&msg); errors.Is(err, io.EOF) {
			return out, nil
		} else if err != nil {
			return out, err
		}
		out = append(out, msg.b)
	}
}

// fullName is a method's gRPC name, "/runtime.v1.RuntimeService/RunPodSandbox".
func fullName(m protoreflect.MethodDescriptor) string {
	return "/" + string(m.Parent().FullName()) + "/" + string(m.Name())
}

// criMethods are the methods of cri-api's RuntimeService and ImageService, by name.
func criMethods(t *testing.T) map[string]protoreflect.MethodDescriptor {
	t.Helper()
	out := map[string]protoreflect.MethodDescriptor{}
	for _, name := range []protoreflect.FullName{"runtime.v1.RuntimeService", "runtime.v1.ImageService"} {
		d, err := protoregistry.GlobalFiles.FindDescriptorByName(name)
		if err != nil {
			t.Fatal(err)
		}
		ms := d.(protoreflect.ServiceDescriptor).Methods()
		for i := range ms.Len() {
			out[string(ms.Get(i).Name())] = ms.Get(i)
		}
	}
	return out
}

// newMessage is an empty message of type md, as cri-api registered it.
func newMessage(t testing.TB, md protoreflect.MessageDescriptor) proto.Message {
	t.Helper()
	mt, err := protoregistry.GlobalTypes.FindMessageByName(md.FullName())
	if err != nil {
		t.Fatal(err)
	}
	return mt.New().Interface()
}
