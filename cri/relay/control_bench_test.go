package relay

import (
	"context"
	"net"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"
)

// BenchmarkControlFrames: what one control frame costs the server when its connection has 999
// calls open (each waiting for its request), the relay beside grpc-go's server in one run. A
// client sends the frames in batches of 100, each batch followed by a PING whose answer says
// the server has read them; ns/op is per frame, the client's share included (the same for
// both). WINDOW_UPDATE opens the connection's window by one byte; SETTINGS moves
// SETTINGS_INITIAL_WINDOW_SIZE by one byte, which every open stream's window follows
// (RFC 9113 §6.9.2).
func BenchmarkControlFrames(b *testing.B) {
	dir := shortDir(b)
	wait := &Target{Name: "handlers", Unary: func(ctx context.Context, call *UnaryCall) *UnaryAnswer {
		return &UnaryAnswer{}
	}}
	relaySock := startRelay(b, dir, &Server{Route: func(string) *Target { return wait }})
	grpcSock := filepath.Join(dir, "grpc.sock")
	l, err := net.Listen("unix", grpcSock)
	if err != nil {
		b.Fatal(err)
	}
	// The benchmark's PINGs are its clock: grpc-go may not take them for an attack.
	gs := grpc.NewServer(grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: time.Nanosecond, PermitWithoutStream: true}),
		grpc.UnknownServiceHandler(func(_ any, st grpc.ServerStream) error {
			<-st.Context().Done()
			return nil
		}))
	go func() { _ = gs.Serve(l) }()
	b.Cleanup(gs.Stop)

	frames := map[string]func(fr *http2.Framer, i int) error{
		"window_update": func(fr *http2.Framer, _ int) error { return fr.WriteWindowUpdate(0, 1) },
		"settings": func(fr *http2.Framer, i int) error {
			return fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: uint32(initialWindow + i%2)})
		},
	}
	for _, server := range []struct{ name, sock string }{{"relay", relaySock}, {"grpc-go", grpcSock}} {
		for name, frame := range frames {
			b.Run("server="+server.name+"/frame="+name, func(b *testing.B) {
				p := dialRelay(b, server.sock)
				pongs := make(chan struct{}, 1)
				go func() {
					for {
						f, err := p.fr.ReadFrame()
						if err != nil {
							return
						}
						if ping, ok := f.(*http2.PingFrame); ok && ping.IsAck() {
							pongs <- struct{}{}
						}
					}
				}()
				for i := range 999 {
					p.headers(uint32(2*i+1), false, grpcRequest("/svc/Wait")...)
				}
				sync := func() {
					p.write(func(fr *http2.Framer) error { return fr.WritePing(false, [8]byte{'b'}) })
					select {
					case <-pongs:
					case <-time.After(waitFor):
						b.Fatal("no PING answer")
					}
				}
				sync()
				b.ResetTimer()
				for i := 0; i < b.N; {
					n := min(100, b.N-i)
					p.write(func(fr *http2.Framer) error {
						for k := range n {
							if err := frame(fr, i+k); err != nil {
								return err
							}
						}
						return nil
					})
					i += n
					sync()
				}
			})
		}
	}
}
