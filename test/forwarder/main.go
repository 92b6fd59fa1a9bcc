// Command forwarder is the smallest honest gRPC passthrough: every call on its unix socket goes
// to the backend's socket as raw bytes (an UnknownServiceHandler with a codec that does not
// decode), streams included. It is the baseline podgate's own forwarding cost is measured
// against (BENCHMARKS.md); it is not part of podgate. With -pprof it also serves Go's profiles
// (net/http/pprof) on that address, for comparing its profile with podgate's.
//
// With -bytes it knows nothing of HTTP/2 or gRPC: each connection is copied to one of its own
// to the backend, both ways, 64 KiB at a time. That is the floor of any relay in its own process
// on a unix socket (one more read and one more write of every byte, and their wake-ups): what
// no relay that forwards a call's bytes can go under.
//
//	forwarder -listen /run/fwd.sock -backend /run/containerd/containerd.sock [-pprof 127.0.0.1:0] [-bytes]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	_ "net/http/pprof" // the profiles on http.DefaultServeMux, served only with -pprof
	"os"
	"os/signal"
	"syscall"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/metadata"
)

// raw is a message carried as its bytes.
type raw struct{ b []byte }

// codec marshals raw messages as they are; it keeps the name "proto" for the content type.
type codec struct{}

func (codec) Name() string { return "proto" }

func (codec) Marshal(v any) ([]byte, error) { return v.(*raw).b, nil }

func (codec) Unmarshal(data []byte, v any) error {
	v.(*raw).b = append([]byte(nil), data...)
	return nil
}

var _ encoding.Codec = codec{}

func main() {
	listen := flag.String("listen", "", "unix socket to serve on")
	backend := flag.String("backend", "", "unix socket to forward to")
	pprofAddr := flag.String("pprof", "", "host:port to serve /debug/pprof/ on (printed as \"pprof ADDRESS\")")
	bytes := flag.Bool("bytes", false, "copy each connection's bytes both ways, without HTTP/2")
	flag.Parse()
	if *pprofAddr != "" {
		if err := servePprof(*pprofAddr); err != nil {
			fmt.Fprintln(os.Stderr, "forwarder:", err)
			os.Exit(1)
		}
	}
	serve := run
	if *bytes {
		serve = copyBytes
	}
	if err := serve(*listen, *backend); err != nil {
		fmt.Fprintln(os.Stderr, "forwarder:", err)
		os.Exit(1)
	}
}

// servePprof serves http.DefaultServeMux, which holds net/http/pprof's pages, on addr until the
// process ends, and prints the address it listens on.
func servePprof(addr string) error {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	fmt.Println("pprof", l.Addr().String())
	go func() {
		err := http.Serve(l, nil) //nolint:gosec // a test program's loopback listener, alive as long as it is
		fmt.Fprintln(os.Stderr, "forwarder: pprof:", err)
	}()
	return nil
}

func run(listen, backend string) error {
	conn, err := grpc.NewClient("unix://"+backend, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.ForceCodec(codec{}), grpc.MaxCallRecvMsgSize(16<<20), grpc.MaxCallSendMsgSize(16<<20)))
	if err != nil {
		return err
	}
	defer conn.Close()
	srv := grpc.NewServer(grpc.ForceServerCodec(codec{}), grpc.MaxRecvMsgSize(16<<20), grpc.MaxSendMsgSize(16<<20),
		grpc.UnknownServiceHandler(func(_ any, ss grpc.ServerStream) error { return forward(conn, ss) }))
	l, err := net.Listen("unix", listen)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	go func() {
		<-ctx.Done()
		srv.Stop()
	}()
	fmt.Println("ready") // the benchmark waits for this line
	return srv.Serve(l)
}

// forward copies one call both ways, as a bidirectional stream (a unary call is a stream of one).
func forward(conn *grpc.ClientConn, ss grpc.ServerStream) error {
	method, _ := grpc.MethodFromServerStream(ss)
	md, _ := metadata.FromIncomingContext(ss.Context())
	ctx, cancel := context.WithCancel(metadata.NewOutgoingContext(ss.Context(), md))
	defer cancel()
	cs, err := conn.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}, method)
	if err != nil {
		return err
	}
	up := make(chan error, 1)
	go func() {
		for {
			m := &raw{}
			if err := ss.RecvMsg(m); err != nil {
				if errors.Is(err, io.EOF) {
					up <- cs.CloseSend()
					return
				}
				up <- err
				return
			}
			if err := cs.SendMsg(m); err != nil {
				up <- err
				return
			}
		}
	}()
	if h, err := cs.Header(); err == nil {
		_ = ss.SendHeader(h)
	}
	for {
		m := &raw{}
		if err := cs.RecvMsg(m); err != nil {
			ss.SetTrailer(cs.Trailer())
			if errors.Is(err, io.EOF) {
				return <-up
			}
			return err
		}
		if err := ss.SendMsg(m); err != nil {
			return err
		}
	}
}

// copyBytes copies every connection on listen to a connection of its own to backend, both ways,
// until either side closes.
func copyBytes(listen, backend string) error {
	l, err := net.Listen("unix", listen)
	if err != nil {
		return err
	}
	fmt.Println("ready") // the benchmark waits for this line
	for {
		c, err := l.Accept()
		if err != nil {
			return err
		}
		go func() {
			defer c.Close()
			b, err := net.Dial("unix", backend)
			if err != nil {
				fmt.Fprintln(os.Stderr, "forwarder:", err)
				return
			}
			defer b.Close()
			done := make(chan struct{})
			go func() {
				copyConn(b, c)
				close(done)
			}()
			copyConn(c, b)
			<-done
		}()
	}
}

// copyConn copies src to dst until src ends, then ends dst's writing side. It hides both
// connections' ReadFrom and WriteTo, so that every byte is read and written by this process
// 64 KiB at a time, as a relay that looks at what it forwards must.
func copyConn(dst, src net.Conn) {
	_, _ = io.CopyBuffer(struct{ io.Writer }{dst}, struct{ io.Reader }{src}, make([]byte, 64<<10))
	if u, ok := dst.(*net.UnixConn); ok {
		_ = u.CloseWrite()
	}
}
