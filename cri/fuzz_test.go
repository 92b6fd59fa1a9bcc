package cri

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podgate/podgate/test/testfs"
)

// passThrough intercepts m with an interceptor that only forwards, so that m's requests take the
// typed path: decoded by podgate, then encoded again for the backend.
func passThrough[Req, Resp proto.Message](s *Server, m Method[Req, Resp]) {
	Intercept(s, m, func(ctx context.Context, req Req, next Forward[Req, Resp]) (Resp, error) { return next(ctx, req) })
}

// fuzzMethod is an intercepted method: its full name, short name and a new request.
type fuzzMethod struct {
	full, name string
	newReq     func() proto.Message
}

func fuzzMethodOf[Req, Resp proto.Message](m Method[Req, Resp]) fuzzMethod {
	return fuzzMethod{full: m.FullName(), name: m.name, newReq: func() proto.Message { return m.newReq() }}
}

// interceptedMethods are the methods podgate's features intercept.
var interceptedMethods = []fuzzMethod{
	fuzzMethodOf(RunPodSandbox), fuzzMethodOf(StopPodSandbox), fuzzMethodOf(RemovePodSandbox),
	fuzzMethodOf(CreateContainer), fuzzMethodOf(StartContainer), fuzzMethodOf(RemoveContainer),
	fuzzMethodOf(UpdateContainerResources), fuzzMethodOf(PullImage),
}

// FuzzInterceptedRequest sends arbitrary bytes as the request of every intercepted method
// through the real server: podgate must answer each with a gRPC status (its own
// InvalidArgument for bytes it cannot decode, or the backend's answer), never crash or hang.
//
//	go test -run '^$' -fuzz FuzzInterceptedRequest -fuzztime 60s ./cri
func FuzzInterceptedRequest(f *testing.F) {
	for _, seed := range [][]byte{
		nil,
		{0xff},                   // a truncated varint tag
		{0x0a, 0x05, 'a'},        // a length beyond the message
		{0x0a, 0x80, 0x80, 0x80}, // an unterminated length
		mustMarshal(f, &runtimeapi.RunPodSandboxRequest{Config: &runtimeapi.PodSandboxConfig{Metadata: &runtimeapi.PodSandboxMetadata{Name: "p", Uid: "u"}}}),
		mustMarshal(f, &runtimeapi.CreateContainerRequest{PodSandboxId: "s", Config: &runtimeapi.ContainerConfig{Metadata: &runtimeapi.ContainerMetadata{Name: "c"}}}),
		mustMarshal(f, &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: "busybox"}}),
		{0x12, 0x02, 0xc3, 0x28}, // invalid UTF-8 in a string field
	} {
		f.Add(seed)
	}
	dir := testfs.ShortDir(f)
	newTestRuntime(f, filepath.Join(dir, "rt.sock"))
	_, conn := proxyFor(f, filepath.Join(dir, "rt.sock"), "", func(s *Server) {
		passThrough(s, RunPodSandbox)
		passThrough(s, StopPodSandbox)
		passThrough(s, RemovePodSandbox)
		passThrough(s, CreateContainer)
		passThrough(s, StartContainer)
		passThrough(s, RemoveContainer)
		passThrough(s, UpdateContainerResources)
		passThrough(s, PullImage)
	})
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, m := range interceptedMethods {
			// What podgate must make of the bytes: a request it decodes goes to the backend;
			// one it cannot decode is its own InvalidArgument, naming the method.
			undecodable := proto.Unmarshal(body, m.newReq()) != nil
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			var resp frame
			err := conn.Invoke(ctx, m.full, frameOf(body), &resp, grpc.ForceCodecV2(newRawCodec()))
			cancel()
			if err == nil {
				resp.free()
				if undecodable {
					t.Fatalf("%s(%x): answered OK, although the bytes do not decode", m.name, body)
				}
				continue
			}
			st, ok := status.FromError(err)
			switch {
			case !ok:
				t.Fatalf("%s(%x): %v is no gRPC status", m.name, body, err)
			case st.Code() == codes.DeadlineExceeded:
				t.Fatalf("%s(%x): no answer within 10 s", m.name, body)
			case st.Code() == codes.Unavailable:
				t.Fatalf("%s(%x): %v: podgate or its connection went down", m.name, body, err)
			case undecodable && (st.Code() != codes.InvalidArgument || !strings.HasPrefix(st.Message(), "decode "+m.name+" request: ")):
				t.Fatalf("%s(%x): %v; want InvalidArgument \"decode %s request: ...\"", m.name, body, err, m.name)
			}
		}
	})
}

func mustMarshal(tb testing.TB, m proto.Message) []byte {
	tb.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}
