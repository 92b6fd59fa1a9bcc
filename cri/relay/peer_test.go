package relay

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/codes"

	"github.com/podgate/podgate/test/testfs"
)

// waitFor bounds every wait of these tests for an event that must come.
const waitFor = 20 * time.Second

// rawPeer is one end of an HTTP/2 connection driven frame by frame by a test: the client of
// the relay, or the server behind it.
type rawPeer struct {
	t    testing.TB
	conn net.Conn
	fr   *http2.Framer
	bw   *bufio.Writer
	henc *hpack.Encoder
	hbuf bytes.Buffer
	mu   sync.Mutex // writes
	// lenient peers write on after the relay closed their connection: an attacker does not
	// care, so its failed writes fail no test.
	lenient bool
}

func newRawPeer(t testing.TB, c net.Conn) *rawPeer {
	p := &rawPeer{t: t, conn: c, bw: bufio.NewWriter(c)}
	p.fr = http2.NewFramer(p.bw, bufio.NewReader(c))
	// HTTP/2's default SETTINGS_MAX_FRAME_SIZE, which the tests' peers never raise: a larger
	// frame from the relay fails the read.
	p.fr.SetMaxReadFrameSize(16384)
	p.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	p.henc = hpack.NewEncoder(&p.hbuf)
	t.Cleanup(func() { c.Close() })
	return p
}

// write runs f with the framer under the write lock and flushes.
func (p *rawPeer) write(f func(fr *http2.Framer) error) {
	p.t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := f(p.fr); err != nil {
		if !p.lenient {
			p.t.Errorf("write: %v", err)
		}
		return
	}
	if err := p.bw.Flush(); err != nil && !p.lenient {
		p.t.Errorf("flush: %v", err)
	}
}

func (p *rawPeer) headers(id uint32, end bool, fields ...string) {
	p.t.Helper()
	p.mu.Lock()
	p.hbuf.Reset()
	for i := 0; i+1 < len(fields); i += 2 {
		_ = p.henc.WriteField(hpack.HeaderField{Name: fields[i], Value: fields[i+1]})
	}
	block := append([]byte(nil), p.hbuf.Bytes()...)
	p.mu.Unlock()
	// In frames of at most HTTP/2's default 16 KiB: HEADERS, then CONTINUATIONs.
	p.write(func(fr *http2.Framer) error {
		n := min(len(block), 16384)
		if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: block[:n], EndStream: end, EndHeaders: n == len(block)}); err != nil {
			return err
		}
		for block = block[n:]; len(block) > 0; block = block[n:] {
			n = min(len(block), 16384)
			if err := fr.WriteContinuation(id, n == len(block), block[:n]); err != nil {
				return err
			}
		}
		return nil
	})
}

// read reads the next frame, failing the test after waitFor.
func (p *rawPeer) read() http2.Frame {
	p.t.Helper()
	_ = p.conn.SetReadDeadline(time.Now().Add(waitFor))
	f, err := p.fr.ReadFrame()
	if err != nil {
		p.t.Fatalf("read frame: %v", err)
	}
	return f
}

// readUntil reads frames, answering SETTINGS and PINGs, until one that match accepts.
func (p *rawPeer) readUntil(match func(http2.Frame) bool) http2.Frame {
	p.t.Helper()
	for {
		f := p.read()
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				p.write(func(fr *http2.Framer) error { return fr.WriteSettingsAck() })
			}
		case *http2.PingFrame:
			if !f.IsAck() {
				p.write(func(fr *http2.Framer) error { return fr.WritePing(true, f.Data) })
			}
		}
		if match(f) {
			return f
		}
	}
}

// readEnd reads until the connection ends and returns the GOAWAY code it got, if any.
func (p *rawPeer) readEnd() (goAway *http2.GoAwayFrame) {
	p.t.Helper()
	_ = p.conn.SetReadDeadline(time.Now().Add(waitFor))
	for {
		f, err := p.fr.ReadFrame()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				p.t.Fatal("the relay did not end the connection")
			}
			return goAway
		}
		if g, ok := f.(*http2.GoAwayFrame); ok {
			goAway = &http2.GoAwayFrame{FrameHeader: g.FrameHeader, LastStreamID: g.LastStreamID, ErrCode: g.ErrCode}
		}
	}
}

// dialRelay connects a raw client to the relay's socket: preface and SETTINGS, then the relay's
// SETTINGS acknowledged.
func dialRelay(t testing.TB, sock string, settings ...http2.Setting) *rawPeer {
	t.Helper()
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	p := newRawPeer(t, c)
	p.write(func(fr *http2.Framer) error {
		if _, err := p.bw.WriteString(http2.ClientPreface); err != nil {
			return err
		}
		return fr.WriteSettings(settings...)
	})
	return p
}

// rawUpstream is a server behind the relay that the test drives frame by frame: accept hands
// each connection the relay makes to the test.
type rawUpstream struct {
	t     testing.TB
	l     net.Listener
	conns chan *rawPeer
}

func startRawUpstream(t testing.TB, dir string) *rawUpstream {
	t.Helper()
	l, err := net.Listen("unix", filepath.Join(dir, "up.sock"))
	if err != nil {
		t.Fatal(err)
	}
	u := &rawUpstream{t: t, l: l, conns: make(chan *rawPeer, 10)}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			u.conns <- newRawPeer(t, c)
		}
	}()
	return u
}

// accept waits for the relay's connection, reads its preface and answers its SETTINGS with
// settings.
func (u *rawUpstream) accept(settings ...http2.Setting) *rawPeer {
	u.t.Helper()
	var p *rawPeer
	select {
	case p = <-u.conns:
	case <-time.After(waitFor):
		u.t.Fatal("the relay did not connect upstream")
	}
	preface := make([]byte, len(http2.ClientPreface))
	_ = p.conn.SetReadDeadline(time.Now().Add(waitFor))
	if _, err := io.ReadFull(p.conn, preface); err != nil || string(preface) != http2.ClientPreface {
		u.t.Fatalf("upstream preface %q: %v", preface, err)
	}
	p.write(func(fr *http2.Framer) error { return fr.WriteSettings(settings...) })
	return p
}

func (u *rawUpstream) target() *Target {
	return &Target{Name: "test upstream", Dial: func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", u.l.Addr().String())
	}}
}

// recorder is an Observer that keeps what it saw.
type recorder struct {
	mu    sync.Mutex
	begun []string
	ended map[string][]codes.Code
	open  int
	done  chan struct{} // receives after every End
}

func newRecorder() *recorder {
	return &recorder{ended: map[string][]codes.Code{}, done: make(chan struct{}, 100)}
}

func (r *recorder) Begin(c *Call) any {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.begun = append(r.begun, c.Path)
	r.open++
	return c.Path
}

func (r *recorder) End(token any, code codes.Code) {
	r.mu.Lock()
	r.ended[token.(string)] = append(r.ended[token.(string)], code)
	r.open--
	r.mu.Unlock()
	r.done <- struct{}{}
}

// serveRelay serves srv on a socket of dir (through wrap, when set, the listener the test
// wants) and returns the socket's path and Serve's result, for the tests that shut the relay
// down themselves.
func serveRelay(t testing.TB, dir string, srv *Server, wrap func(net.Listener) net.Listener) (string, <-chan error) {
	t.Helper()
	sock := filepath.Join(dir, "relay.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	if wrap != nil {
		l = wrap(l)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()
	return sock, served
}

// wantEnded waits until the call to path has ended and checks that it ended once, with code.
func (r *recorder) wantEnded(t testing.TB, path string, code codes.Code) {
	t.Helper()
	deadline := time.After(waitFor)
	for {
		r.mu.Lock()
		got := append([]codes.Code(nil), r.ended[path]...)
		r.mu.Unlock()
		if len(got) > 0 {
			if len(got) != 1 || got[0] != code {
				t.Errorf("%s ended %v, want once %v", path, got, code)
			}
			return
		}
		select {
		case <-r.done:
		case <-deadline:
			t.Fatalf("%s did not end", path)
		}
	}
}

// startRelay serves srv on a socket of dir, shut down when the test ends, and returns the
// socket's path.
func startRelay(t testing.TB, dir string, srv *Server) string {
	t.Helper()
	sock, served := serveRelay(t, dir, srv, nil)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitFor)
		defer cancel()
		srv.Shutdown(ctx)
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return sock
}

func shortDir(t testing.TB) string { return testfs.ShortDir(t) }

// grpcRequest is the header fields of a gRPC call of path.
func grpcRequest(path string) []string {
	return []string{":method", "POST", ":scheme", "http", ":path", path, ":authority", "relay-test",
		"content-type", "application/grpc", "te", "trailers"}
}
