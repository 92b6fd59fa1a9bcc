// Command fakeruntime serves cri-api's fake runtime (k8s.io/cri-client/pkg/fake) on a unix
// socket, holding -containers containers and -sandboxes sandboxes shaped like a kubelet's on
// containerd (64-hex IDs, image references, the kubelet's labels and annotations). It is the
// backend of BenchmarkForwarderFakeRuntime: its own work per call is small, so what a proxy in
// front of it adds shows, and a list of 1,000 sandboxes costs no 1,000 real pods. It prints
// "ready" once it serves.
//
//	fakeruntime -listen /tmp/x/fake.sock -containers 1000 -sandboxes 1000
//
// With -lists-once it answers ListContainers with one message, built and encoded once at start
// (filters are not applied): for attacks that ask it for a large list many times, whose cost
// should be the proxy's, not the fake's (cri-api's fake copies its list under one lock per
// call, and grpc-go encodes it again each time, which starves every other call).
//
// With -stream-page N it answers StreamContainers with its containers in messages of N each,
// made once at start (filters are not applied), as a runtime that streams its lists does
// (containerd 2.4); cri-api's fake sends the whole list as one message.
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	encproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	apitest "k8s.io/cri-api/pkg/apis/testing"
	"k8s.io/cri-client/pkg/fake"
)

func main() {
	listen := flag.String("listen", "", "unix socket to serve on")
	containers := flag.Int("containers", 1000, "containers the runtime holds")
	sandboxes := flag.Int("sandboxes", 1000, "sandboxes the runtime holds")
	maxStreams := flag.Uint("max-streams", 0, "advertise and enforce this SETTINGS_MAX_CONCURRENT_STREAMS (0: grpc-go's default, none)")
	listsOnce := flag.Bool("lists-once", false, "answer ListContainers with one message encoded once at start, filters not applied")
	streamPage := flag.Int("stream-page", 0, "answer StreamContainers in messages of this many containers, made once at start (0: the fake's own, one message)")
	flag.Parse()
	f := fake.NewFakeRemoteRuntime()
	f.RuntimeService.SetFakeSandboxes(fakeSandboxes(*sandboxes))
	f.RuntimeService.SetFakeContainers(fakeContainers(*containers, *sandboxes))
	var stop func()
	var err error
	switch {
	case *listsOnce:
		stop, err = serveListsOnce(f, *listen)
	case *streamPage > 0:
		stop, err = servePaged(f, *listen, *streamPage)
	default:
		stop, err = serve(f, *listen, uint32(*maxStreams))
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "fakeruntime:", err)
		os.Exit(1)
	}
	fmt.Println("ready") // the benchmark waits for this line
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, os.Interrupt)
	<-sig
	stop()
}

// serve serves f on the unix socket: with the fake's own server, or, with a stream limit, with
// a server of that option holding the same services.
func serve(f *fake.RemoteRuntime, sock string, maxStreams uint32) (stop func(), err error) {
	if maxStreams == 0 {
		return f.Stop, f.Start("unix://" + sock)
	}
	l, err := net.Listen("unix", sock)
	if err != nil {
		return nil, err
	}
	srv := grpc.NewServer(grpc.MaxConcurrentStreams(maxStreams))
	runtimeapi.RegisterRuntimeServiceServer(srv, f)
	runtimeapi.RegisterImageServiceServer(srv, f)
	go func() { _ = srv.Serve(l) }()
	return srv.Stop, nil
}

// id is a containerd-like ID: 64 hex digits.
func id(kind string, i int) string { return fmt.Sprintf("%s%060x", kind, i) }

// podName is the name of pod p, as a Deployment's ReplicaSet names its pods.
func podName(p int) string { return fmt.Sprintf("web-%d-7d9c8b6f5-x2k4p", p) }

func podUID(p int) string { return fmt.Sprintf("8f14e45f-ceea-467f-a0e6-%012d", p) }

func fakeSandboxes(n int) []*apitest.FakePodSandbox {
	created := time.Now().UnixNano()
	out := make([]*apitest.FakePodSandbox, 0, n)
	for p := range n {
		sb := &apitest.FakePodSandbox{RuntimeHandler: ""}
		sb.Id = id("5b", p)
		sb.Metadata = &runtimeapi.PodSandboxMetadata{Name: podName(p), Uid: podUID(p), Namespace: "default", Attempt: 0}
		sb.State = runtimeapi.PodSandboxState_SANDBOX_READY
		sb.CreatedAt = created
		sb.Labels = map[string]string{
			"app":                          fmt.Sprintf("web-%d", p),
			"io.kubernetes.pod.name":       podName(p),
			"io.kubernetes.pod.namespace":  "default",
			"io.kubernetes.pod.uid":        podUID(p),
			"pod-template-hash":            "7d9c8b6f5",
			"io.kubernetes.container.name": "POD",
		}
		sb.Annotations = map[string]string{
			"kubernetes.io/config.seen":   "2026-11-21T10:15:42.123456789Z",
			"kubernetes.io/config.source": "api",
		}
		out = append(out, sb)
	}
	return out
}

func fakeContainers(n, pods int) []*apitest.FakeContainer {
	created := time.Now().UnixNano()
	out := make([]*apitest.FakeContainer, 0, n)
	for i := range n {
		p := i % max(pods, 1)
		name := fmt.Sprintf("app-%d", i)
		c := &apitest.FakeContainer{SandboxID: id("5b", p)}
		c.Id = id("c0", i)
		c.Metadata = &runtimeapi.ContainerMetadata{Name: name, Attempt: 0}
		c.Image = &runtimeapi.ImageSpec{Image: "sha256:" + id("1a", i%20)}
		c.ImageRef = "sha256:" + id("1a", i%20)
		c.State = runtimeapi.ContainerState_CONTAINER_RUNNING
		c.CreatedAt = created
		c.Labels = map[string]string{
			"io.kubernetes.container.name": name,
			"io.kubernetes.pod.name":       podName(p),
			"io.kubernetes.pod.namespace":  "default",
			"io.kubernetes.pod.uid":        podUID(p),
		}
		c.Annotations = map[string]string{
			"io.kubernetes.container.hash":                     "5c1e2d4f",
			"io.kubernetes.container.restartCount":             "0",
			"io.kubernetes.container.terminationMessagePath":   "/dev/termination-log",
			"io.kubernetes.container.terminationMessagePolicy": "File",
			"io.kubernetes.pod.terminationGracePeriod":         "30",
		}
		out = append(out, c)
	}
	return out
}

// onceLists is the fake runtime with a ListContainers answer made once.
type onceLists struct {
	*fake.RemoteRuntime
	containers *runtimeapi.ListContainersResponse
}

func (o onceLists) ListContainers(context.Context, *runtimeapi.ListContainersRequest) (*runtimeapi.ListContainersResponse, error) {
	return o.containers, nil
}

// onceCodec is grpc-go's proto codec, but for the one message it encodes once.
type onceCodec struct {
	encoding.CodecV2
	once    proto.Message
	encoded []byte
}

func (c onceCodec) Marshal(v any) (mem.BufferSlice, error) {
	if v == c.once {
		return mem.BufferSlice{mem.SliceBuffer(c.encoded)}, nil
	}
	return c.CodecV2.Marshal(v)
}

// serveListsOnce serves f on the unix socket with its ListContainers answer made and encoded
// once.
func serveListsOnce(f *fake.RemoteRuntime, sock string) (stop func(), err error) {
	list, err := f.ListContainers(context.Background(), &runtimeapi.ListContainersRequest{})
	if err != nil {
		return nil, err
	}
	encoded, err := proto.Marshal(list)
	if err != nil {
		return nil, err
	}
	l, err := net.Listen("unix", sock)
	if err != nil {
		return nil, err
	}
	codec := onceCodec{CodecV2: encoding.GetCodecV2(encproto.Name), once: list, encoded: encoded}
	srv := grpc.NewServer(grpc.ForceServerCodecV2(codec))
	runtimeapi.RegisterRuntimeServiceServer(srv, onceLists{RemoteRuntime: f, containers: list})
	runtimeapi.RegisterImageServiceServer(srv, f)
	go func() { _ = srv.Serve(l) }()
	return srv.Stop, nil
}

// paged is the fake runtime with StreamContainers answered in pages made once.
type paged struct {
	*fake.RemoteRuntime
	pages []*runtimeapi.StreamContainersResponse
}

func (p paged) StreamContainers(_ *runtimeapi.StreamContainersRequest, srv grpc.ServerStreamingServer[runtimeapi.StreamContainersResponse]) error {
	for _, page := range p.pages {
		if err := srv.Send(page); err != nil {
			return err
		}
	}
	return nil
}

// servePaged serves f on the unix socket with its containers streamed n to a message.
func servePaged(f *fake.RemoteRuntime, sock string, n int) (stop func(), err error) {
	list, err := f.ListContainers(context.Background(), &runtimeapi.ListContainersRequest{})
	if err != nil {
		return nil, err
	}
	var pages []*runtimeapi.StreamContainersResponse
	for c := list.Containers; len(c) > 0; c = c[min(n, len(c)):] {
		pages = append(pages, &runtimeapi.StreamContainersResponse{Containers: c[:min(n, len(c))]})
	}
	l, err := net.Listen("unix", sock)
	if err != nil {
		return nil, err
	}
	srv := grpc.NewServer()
	runtimeapi.RegisterRuntimeServiceServer(srv, paged{RemoteRuntime: f, pages: pages})
	runtimeapi.RegisterImageServiceServer(srv, f)
	go func() { _ = srv.Serve(l) }()
	return srv.Stop, nil
}
