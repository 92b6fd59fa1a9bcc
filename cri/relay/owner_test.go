package relay

// The outgoing side's one owner (issue 47): credit to the server leaves as the bytes it frees
// leave, whatever the client sends (F1); a client that reads is never shed for what others hold
// (F2); a small answer takes its turn beside a big one on the same connection (F3); after a slow
// write the writes that do not wait work again (F5).

import (
	"context"
	"encoding/binary"
	"errors"
	"net"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// startSizedServer serves a gRPC server on a socket of dir that answers every call with as many
// bytes as the request's first 8 bytes say (big-endian), or 1 byte without them.
func startSizedServer(t testing.TB, dir string) *Target {
	t.Helper()
	sock := filepath.Join(dir, "sized.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.ForceServerCodec(rawCodec{}), grpc.MaxSendMsgSize(64<<20),
		grpc.UnknownServiceHandler(func(_ any, ss grpc.ServerStream) error {
			var m []byte
			if err := ss.RecvMsg(&m); err != nil {
				return err
			}
			n := 1
			if len(m) >= 8 {
				n = int(binary.BigEndian.Uint64(m))
			}
			answer := make([]byte, n)
			for i := range answer {
				answer[i] = byte(i)
			}
			return ss.SendMsg(&answer)
		}))
	go srv.Serve(l) //nolint:errcheck // ends with Stop
	t.Cleanup(srv.Stop)
	return &Target{Name: "sized", Dial: func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}
}

// sizeRequest asks startSizedServer for n bytes.
func sizeRequest(n int) []byte { return binary.BigEndian.AppendUint64(nil, uint64(n)) }

// slowConn reads at most rate bytes a second: a client that takes what it is sent slower than
// the server makes it.
type slowConn struct {
	net.Conn
	rate  int
	start time.Time
	read  int
	total atomic.Int64 // read, for other goroutines
}

func (c *slowConn) readBytes() int64 { return c.total.Load() }

func (c *slowConn) Read(p []byte) (int, error) {
	if c.start.IsZero() {
		c.start = time.Now()
	}
	// Pace: by now at most rate bytes per second since the first read.
	if ahead := time.Duration(c.read) * time.Second / time.Duration(c.rate); ahead > time.Since(c.start) {
		time.Sleep(ahead - time.Since(c.start))
	}
	n, err := c.Conn.Read(p[:min(len(p), 32<<10)])
	c.read += n
	c.total.Add(int64(n))
	return n, err
}

// slowClient is a gRPC client of the relay at sock that reads rate bytes a second, with the
// given dial options.
func slowClient(t *testing.T, sock string, rate int, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	opts = append(opts, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.ForceCodec(rawCodec{}), grpc.MaxCallRecvMsgSize(64<<20)),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			var d net.Dialer
			c, err := d.DialContext(ctx, "unix", sock)
			if err != nil {
				return nil, err
			}
			return &slowConn{Conn: c, rate: rate}, nil
		}))
	c, err := grpc.NewClient("passthrough:///relay", opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestCreditLeavesWithoutAPeerFrame (F1): a client with windows of 1 GiB, which it never needs
// to open again, reads an answer larger than the server's window toward podgate slower than the
// server sends it: the server's window is given back as the bytes leave to the client, though
// the client sends nothing meanwhile. Before the outgoing side had one owner, the credit waited
// for a frame from the client, and the call stalled until its deadline.
func TestCreditLeavesWithoutAPeerFrame(t *testing.T) {
	dir := shortDir(t)
	tgt := startSizedServer(t, dir)
	sock := startRelay(t, dir, &Server{Route: func(string) *Target { return tgt }})
	cl := slowClient(t, sock, 16<<20, grpc.WithStaticStreamWindowSize(1<<30), grpc.WithStaticConnWindowSize(1<<30))
	const size = 3 * streamWindow // three of the server's windows toward podgate
	ctx, cancel := context.WithTimeout(t.Context(), 2*waitFor)
	defer cancel()
	in, out := sizeRequest(size), []byte(nil)
	if err := cl.Invoke(ctx, "/svc/Big", &in, &out); err != nil || len(out) != size {
		t.Fatalf("a %d-byte answer to a client that sends no WINDOW_UPDATE: %d bytes, %v", size, len(out), err)
	}
}

// TestSmallAnswerTakesItsTurn (F3): on one connection, a small call made while a big answer is
// being read slowly is answered after at most a batch and the sockets' buffers of the big one
// (under 1 MiB), whatever is left of it: streams take turns of at most 16 KiB. Before, the small
// answer queued behind what the big one had waiting (2–3 MiB of it here, the whole of it in
// the runs).
func TestSmallAnswerTakesItsTurn(t *testing.T) {
	dir := shortDir(t)
	tgt := startSizedServer(t, dir)
	sock := startRelay(t, dir, &Server{Route: func(string) *Target { return tgt }})
	var conn atomic.Pointer[slowConn]
	cl, err := grpc.NewClient("passthrough:///relay", grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.ForceCodec(rawCodec{}), grpc.MaxCallRecvMsgSize(64<<20)),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			var d net.Dialer
			c, err := d.DialContext(ctx, "unix", sock)
			if err != nil {
				return nil, err
			}
			sc := &slowConn{Conn: c, rate: 1 << 20}
			conn.Store(sc)
			return sc, nil
		}))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 3*waitFor)
	defer cancel()

	const size = 6 << 20 // six seconds at the client's pace
	var bigDone atomic.Bool
	bigErr := make(chan error, 1)
	go func() {
		in, out := sizeRequest(size), []byte(nil)
		err := cl.Invoke(ctx, "/svc/Big", &in, &out)
		if err == nil && len(out) != size {
			err = errors.New("short answer")
		}
		bigDone.Store(true)
		bigErr <- err
	}()
	// Small calls while more than a second of the big answer is left to read.
	const most = 1 << 20
	var calls int
	var worst int64
	for {
		sc := conn.Load()
		before := int64(0)
		if sc != nil {
			before = sc.readBytes()
		}
		if before > size-(1<<20) {
			break
		}
		in, out := []byte("x"), []byte(nil)
		if err := cl.Invoke(ctx, "/svc/Small", &in, &out); err != nil || len(out) != 1 {
			t.Fatalf("small call %d: %d bytes, %v", calls, len(out), err)
		}
		if bigDone.Load() {
			t.Fatalf("small call %d, made with more than a second of the big answer left, was answered only after all %d bytes of it", calls, size)
		}
		if sc != nil {
			worst = max(worst, sc.readBytes()-before)
		}
		calls++
	}
	if err := <-bigErr; err != nil {
		t.Fatalf("the big answer: %v", err)
	}
	if worst > most {
		t.Errorf("a small call waited while the client read %d bytes of the big answer beside it, more than %d", worst, most)
	}
	t.Logf("%d small calls answered beside the big one, each after at most %d of its bytes", calls, worst)
}

// TestReadingClientIsNotShed (F2): connections that do not read fill the process's budget with
// answers; a client reading a larger answer at a steady pace on its one connection is never
// shed, however much it holds: the connections that are stuck are. Before, the connection
// that held the most was shed, which was the reading one.
func TestReadingClientIsNotShed(t *testing.T) {
	// The parked answers (8 MiB) fit the budget: the reading client's take it over.
	lim := Limits{TotalBytes: 9 << 20}
	sized := startSizedServer(t, shortDir(t))
	b := newAttackBedRouting(t, lim, 16<<20, map[string]*Target{"/svc/Big": sized})
	var parked []*attacker
	for range 4 {
		a := dialAttacker(t, b.sock, http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0})
		parked = append(parked, a)
		a.headers(1, true, grpcRequest("/svc/Raw")...)
		srv := b.up.accept()
		answerBig(t, srv, srv.readUntil(isHeaders).Header().StreamID, 2<<20)
	}
	waitUntil(t, "the parked answers fill the budget", func() bool { return b.srv.Held() >= 8<<20 })

	var dials atomic.Int64
	cl, err := grpc.NewClient("passthrough:///relay", grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.ForceCodec(rawCodec{}), grpc.MaxCallRecvMsgSize(64<<20)),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			dials.Add(1)
			var d net.Dialer
			c, err := d.DialContext(ctx, "unix", b.sock)
			if err != nil {
				return nil, err
			}
			return &slowConn{Conn: c, rate: 8 << 20}, nil
		}))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 3*waitFor)
	defer cancel()
	for i := range 3 {
		in, out := sizeRequest(12<<20), []byte(nil)
		if err := cl.Invoke(ctx, "/svc/Big", &in, &out); err != nil || len(out) != 12<<20 {
			t.Fatalf("list %d of the reading client: %d bytes, %v", i, len(out), err)
		}
	}
	if n := dials.Load(); n != 1 {
		t.Errorf("the reading client dialled %d connections, want its one: it was shed", n)
	}
	var calm int
	for _, a := range parked {
		a.conn.Close()
		<-a.ended
		if a.goAwayCode() == http2.ErrCodeEnhanceYourCalm {
			calm++
		}
	}
	if calm == 0 {
		t.Error("no parked connection was shed")
	}
	b.wantReported(t, ReasonTotalBudget)
}

// TestFastWritesAfterASlowOne (F5): after a write that had to wait for the client, and longer
// than WriteTimeout after it, answers to a client that reads leave without waking the writer
// goroutine. Before, the slow write's deadline stayed on the connection: every later write that
// does not wait failed at once, and each answer went through the goroutine.
func TestFastWritesAfterASlowOne(t *testing.T) {
	dir := shortDir(t)
	tgt := startSizedServer(t, dir)
	const timeout = 2 * time.Second // the client comes back to read well within it, however loaded the machine
	srv := &Server{Route: func(string) *Target { return tgt }, Limits: Limits{WriteTimeout: timeout}}
	sock := startRelay(t, dir, srv)
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	p := newRawPeer(t, c)
	p.write(func(fr *http2.Framer) error {
		if _, err := p.bw.WriteString(http2.ClientPreface); err != nil {
			return err
		}
		if err := fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: maxWindow}); err != nil {
			return err
		}
		return fr.WriteWindowUpdate(0, maxWindow-initialWindow)
	})
	call := func(id uint32, n int) {
		t.Helper()
		p.headers(id, false, grpcRequest("/svc/Big")...)
		p.write(func(fr *http2.Framer) error { return fr.WriteData(id, true, message(8, sizeRequest(n))) })
	}
	// An answer larger than the socket's buffers, not read until the writer waits for it.
	call(1, 4<<20)
	down := clientSender(t, srv)
	waitUntil(t, "the writer goroutine waits for the client", func() bool { return down.handoffs.Load() > 0 })
	readAnswer(t, p, 1)
	// Later than the slow write's deadline.
	slowEnded := time.Now()
	waitUntil(t, "the slow write's deadline passes", func() bool { return time.Since(slowEnded) > 2*timeout })
	before := down.handoffs.Load()
	for i := range 20 {
		id := uint32(3 + 2*i)
		call(id, 100)
		readAnswer(t, p, id)
	}
	if n := down.handoffs.Load() - before; n > 0 {
		t.Errorf("%d of 20 small answers to a client that reads went through the writer goroutine", n)
	}
}

// clientSender is the sender of the client connection of srv's one session.
func clientSender(t *testing.T, srv *Server) *sender {
	t.Helper()
	var s *sender
	waitUntil(t, "the session", func() bool {
		srv.mu.Lock()
		defer srv.mu.Unlock()
		for ss := range srv.sessions {
			s = ss.down.out
		}
		return s != nil
	})
	return s
}

// readAnswer reads the frames of stream id's answer until its trailers.
func readAnswer(t *testing.T, p *rawPeer, id uint32) {
	t.Helper()
	for {
		f := p.read()
		if h, ok := f.(*http2.MetaHeadersFrame); ok && h.StreamID == id && h.StreamEnded() {
			return
		}
	}
}

// TestPingFloodClosed: a client that sends PINGs less than minPingInterval apart while podgate
// sends it nothing is closed after maxPingStrikes of them (GOAWAY ENHANCE_YOUR_CALM, reported
// too_many_pings), as grpc-go's server closes one; PINGs that come as answers arrive (a BDP
// estimator's) are answered however often, and a well-behaved client goes on being answered.
func TestPingFloodClosed(t *testing.T) {
	b := newAttackBed(t, Limits{}, 16<<20)
	good := b.goodClient(t)

	// As answers arrive: a PING after each answer is answered, and the connection stays.
	reader := dialRelay(t, b.sock)
	for i := range 10 {
		id := uint32(2*i + 1)
		reader.headers(id, false, grpcRequest("/svc/Update")...)
		reader.write(func(fr *http2.Framer) error { return fr.WriteData(id, true, message(1, []byte{1})) })
		readAnswer(t, reader, id)
		data := [8]byte{byte(i)}
		reader.write(func(fr *http2.Framer) error { return fr.WritePing(false, data) })
		reader.readUntil(func(f http2.Frame) bool {
			p, ok := f.(*http2.PingFrame)
			return ok && p.IsAck() && p.Data == data
		})
	}

	flood := dialAttacker(t, b.sock)
	for i := range 2 * (maxPingStrikes + 2) {
		flood.write(func(fr *http2.Framer) error { return fr.WritePing(false, [8]byte{byte(i)}) })
	}
	<-flood.ended
	if code := flood.goAwayCode(); code != http2.ErrCodeEnhanceYourCalm {
		t.Errorf("the flooding client got GOAWAY %v, want ENHANCE_YOUR_CALM", code)
	}
	b.wantReported(t, ReasonTooManyPings)
	good()
}
