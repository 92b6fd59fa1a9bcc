package relay

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"
)

// rawCodec carries messages as their bytes.
type rawCodec struct{}

func (rawCodec) Name() string                  { return "proto" }
func (rawCodec) Marshal(v any) ([]byte, error) { return *v.(*[]byte), nil }
func (rawCodec) Unmarshal(data []byte, v any) error {
	*v.(*[]byte) = append([]byte(nil), data...)
	return nil
}

var _ encoding.Codec = rawCodec{}

// startEchoServer serves a gRPC server on a socket of dir that answers every unary call with
// its request.
func startEchoServer(t testing.TB, dir string) *Target {
	t.Helper()
	sock := filepath.Join(dir, "echo.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.ForceServerCodec(rawCodec{}), grpc.UnknownServiceHandler(func(_ any, ss grpc.ServerStream) error {
		var m []byte
		if err := ss.RecvMsg(&m); err != nil {
			return err
		}
		return ss.SendMsg(&m)
	}))
	go srv.Serve(l) //nolint:errcheck // ends with Stop
	t.Cleanup(srv.Stop)
	return &Target{Name: "echo", Dial: func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}
}

// echo makes one call through the relay at sock with a gRPC client and checks the answer.
func echo(t testing.TB, sock string) {
	t.Helper()
	c, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	in, out := []byte("ping"), []byte(nil)
	if err := c.Invoke(ctx, "/svc/Echo", &in, &out, grpc.ForceCodec(rawCodec{})); err != nil || !bytes.Equal(in, out) {
		t.Fatalf("echo through the relay: %q, %v", out, err)
	}
}

// encodeFrames is a valid call as a client sends it after its preface: SETTINGS, HEADERS, one
// DATA frame with a gRPC message.
func encodeFrames() []byte {
	var buf bytes.Buffer
	fr := http2.NewFramer(&buf, nil)
	_ = fr.WriteSettings()
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	fields := grpcRequest("/svc/Echo")
	for i := 0; i < len(fields); i += 2 {
		_ = enc.WriteField(hpack.HeaderField{Name: fields[i], Value: fields[i+1]})
	}
	_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: hb.Bytes(), EndHeaders: true})
	_ = fr.WriteData(1, true, []byte{0, 0, 0, 0, 4, 'p', 'i', 'n', 'g'})
	return buf.Bytes()
}

// FuzzClientFrames: whatever a client sends after the HTTP/2 preface, the relay neither
// panics nor hangs: it ends the connection when the client stops sending, and goes on serving
// others.
func FuzzClientFrames(f *testing.F) {
	valid := encodeFrames()
	f.Add(valid)
	f.Add(valid[:len(valid)-3])
	f.Add(append(append([]byte(nil), valid...), valid...))
	f.Add([]byte{0xff, 0xff, 0xff, 0x01, 0x05, 0x00, 0x00, 0x00, 0x01})                          // a HEADERS frame claiming 16 MiB
	f.Add([]byte{0, 0, 4, 0x08, 0, 0, 0, 0, 0, 0x7f, 0xff, 0xff, 0xff})                          // connection WINDOW_UPDATE to the top
	f.Add([]byte{0, 0, 6, 0x04, 0, 0, 0, 0, 0, 0, 0x04, 0x80, 0, 0, 0})                          // SETTINGS_INITIAL_WINDOW_SIZE 2^31
	f.Add([]byte{0, 0, 8, 0x07, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0})                          // GOAWAY
	f.Add(append(append([]byte(nil), valid[:9+6]...), 0, 0, 4, 0x03, 0, 0, 0, 0, 1, 0, 0, 0, 8)) // RST_STREAM
	dir := shortDir(f)
	tgt := startEchoServer(f, dir)
	sock := startRelay(f, dir, &Server{Route: func(string) *Target { return tgt }})
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := net.Dial("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		go func() {
			_, _ = c.Write(append([]byte(http2.ClientPreface), data...))
			_ = c.(*net.UnixConn).CloseWrite()
		}()
		_ = c.SetReadDeadline(time.Now().Add(waitFor))
		if _, err := io.Copy(io.Discard, c); err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				t.Fatal("the relay kept the connection open after the client stopped sending")
			}
		}
		echo(t, sock)
	})
}
