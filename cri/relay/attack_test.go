package relay

// Hostile local clients against the relay's limits (issue 30), each bounded: what the relay
// holds stays within its budget, a well-behaved client goes on being answered, and the log
// and the refusals' count name the reason.

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
)

// attackBed is a relay in front of an echo gRPC server (/svc/Echo, passed through) and an
// in-process handler (/svc/Update, intercepted, as cri's are), with what it reports.
type attackBed struct {
	sock    string
	srv     *Server
	up      *rawUpstream // /svc/Raw goes to it
	mu      sync.Mutex
	reasons map[string]int
	logs    []string
}

func newAttackBed(t *testing.T, lim Limits, maxMessage int) *attackBed {
	t.Helper()
	return newAttackBedRouting(t, lim, maxMessage, nil)
}

// newAttackBedRouting is newAttackBed whose relay also routes the paths of extra to their
// targets: set before it serves (a Route changed while it serves would race with its readers).
func newAttackBedRouting(t *testing.T, lim Limits, maxMessage int, extra map[string]*Target) *attackBed {
	t.Helper()
	dir := shortDir(t)
	b := &attackBed{reasons: map[string]int{}, up: startRawUpstream(t, dir)}
	echoT := startEchoServer(t, dir)
	raw := b.up.target()
	update := &Target{Name: "handlers", MaxMessage: maxMessage, Unary: func(ctx context.Context, call *UnaryCall) *UnaryAnswer {
		if call.Path == "/svc/BigHeader" {
			return &UnaryAnswer{Header: metadata.Pairs("x-big", strings.Repeat("h", 1024))}
		}
		return &UnaryAnswer{Message: call.Message}
	}}
	b.srv = &Server{
		Route: func(path string) *Target {
			if t, ok := extra[path]; ok {
				return t
			}
			switch path {
			case "/svc/Echo":
				return echoT
			case "/svc/Raw":
				return raw
			case "/svc/Unknown":
				return nil // answered Unimplemented at once
			}
			return update
		},
		Limits: lim,
		Logger: funcr.New(func(prefix, args string) {
			b.mu.Lock()
			b.logs = append(b.logs, args)
			b.mu.Unlock()
		}, funcr.Options{}),
		Refused: func(reason string) {
			b.mu.Lock()
			b.reasons[reason]++
			b.mu.Unlock()
		},
	}
	b.sock = startRelay(t, dir, b.srv)
	return b
}

// wantReported checks that reason was counted and logged with this process's pid and uid (the
// attacks come from the test itself).
func (b *attackBed) wantReported(t *testing.T, reason string) {
	t.Helper()
	b.wantCounted(t, reason)
	b.mu.Lock()
	defer b.mu.Unlock()
	want := []string{`"reason"="` + reason + `"`, fmt.Sprintf(`"pid"=%d`, os.Getpid()), fmt.Sprintf(`"uid"=%d`, os.Getuid())}
	for _, l := range b.logs {
		if containsAll(l, want) {
			return
		}
	}
	t.Errorf("no log line with %v; logged %q", want, b.logs)
}

// wantCounted checks that reason was counted: a connection that was logged for another
// reason already is not logged again.
func (b *attackBed) wantCounted(t *testing.T, reason string) {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.reasons[reason] == 0 {
		t.Errorf("no refusal counted for %s; counted %v", reason, b.reasons)
	}
}

func containsAll(s string, subs []string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}

// goodClient calls /svc/Echo (passed through) and /svc/Update (intercepted) as a kubelet
// does, and fails the test when a call fails.
func (b *attackBed) goodClient(t *testing.T) func() {
	t.Helper()
	c := unaryClient(t, b.sock)
	return func() {
		t.Helper()
		for _, m := range []string{"/svc/Echo", "/svc/Update"} {
			ctx, cancel := context.WithTimeout(t.Context(), waitFor)
			in, out := []byte("version"), []byte(nil)
			err := c.Invoke(ctx, m, &in, &out)
			cancel()
			if err != nil || !bytes.Equal(in, out) {
				t.Errorf("the well-behaved client's %s: %q, %v", m, out, err)
			}
		}
	}
}

// attacker is a raw client whose frames from the relay a goroutine reads (so that the relay is
// never held up writing to it) and hands to the test.
type attacker struct {
	*rawPeer
	lastID uint32 // the stream it sends on
	frames chan got
	ended  chan struct{}
}

// got is a frame the relay sent an attacker, copied: the framer reuses its frames.
type got struct {
	id     uint32
	typ    http2.FrameType
	code   http2.ErrCode // RST_STREAM's, GOAWAY's
	fields []hpack.HeaderField
	end    bool
}

func dialAttacker(t *testing.T, sock string, settings ...http2.Setting) *attacker {
	t.Helper()
	a := &attacker{rawPeer: dialRelay(t, sock, settings...), frames: make(chan got, 4096), ended: make(chan struct{})}
	a.lenient = true
	go func() {
		defer close(a.ended)
		for {
			f, err := a.fr.ReadFrame()
			if err != nil {
				return
			}
			g := got{id: f.Header().StreamID, typ: f.Header().Type}
			switch f := f.(type) {
			case *http2.MetaHeadersFrame:
				g.fields, g.end = append([]hpack.HeaderField(nil), f.Fields...), f.StreamEnded()
			case *http2.RSTStreamFrame:
				g.code = f.ErrCode
			case *http2.GoAwayFrame:
				g.code = f.ErrCode
			default:
				continue // SETTINGS, WINDOW_UPDATE, DATA; PINGs an attacker never answers
			}
			select {
			case a.frames <- g:
			default:
			}
		}
	}()
	return a
}

// next is the next frame of stream id (0: of the connection) the relay sent.
func (a *attacker) next(t *testing.T, id uint32) got {
	t.Helper()
	timeout := time.After(waitFor)
	for {
		select {
		case f := <-a.frames:
			if f.id == id {
				return f
			}
		case <-a.ended:
			t.Fatalf("the connection ended before a frame of stream %d", id)
		case <-timeout:
			t.Fatalf("no frame of stream %d", id)
		}
	}
}

// message is the start of a gRPC message whose prefix says n bytes.
func message(n uint32, body []byte) []byte {
	b := make([]byte, 5, 5+len(body))
	binary.BigEndian.PutUint32(b[1:], n)
	return append(b, body...)
}

// sendBody sends n bytes of DATA on id in 16 KiB frames, first the prefix, never the end.
func (a *attacker) sendBody(prefix uint32, n int) {
	chunk := make([]byte, 16384)
	first := message(prefix, chunk[:16384-5])
	a.write(func(fr *http2.Framer) error { return fr.WriteData(a.lastID, false, first) })
	for sent := len(first); sent < n; sent += len(chunk) {
		a.write(func(fr *http2.Framer) error { return fr.WriteData(a.lastID, false, chunk[:min(len(chunk), n-sent)]) })
	}
}

// heapInUse is the heap in use after a collection.
func heapInUse() int64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapInuse)
}

// maxHeld samples srv.Held until stop is called, and returns the most it saw.
func maxHeld(srv *Server) (stop func() int64) {
	var most atomic.Int64
	end := maxOf(srv.Held, &most)
	return func() int64 { end(); return most.Load() }
}

// TestBudgetHoldsAgainstRequestsThatNeverEnd: clients that send intercepted requests of the
// message limit and never end them (the 40 × 16 MiB against the default budgets, here
// 12 × 4 MiB over three connections against budgets scaled alike) make the relay hold no more than its budget: a
// connection over its own gets its calls refused, and when all of them together reach the
// process's, the one that holds the most is closed (GOAWAY ENHANCE_YOUR_CALM). A well-behaved
// client is answered throughout, and the budget is whole again once the attackers are gone.
func TestBudgetHoldsAgainstRequestsThatNeverEnd(t *testing.T) {
	const msg = 4 << 20
	lim := Limits{ConnectionBytes: 10 << 20, TotalBytes: 24 << 20}
	b := newAttackBed(t, lim, msg)
	good := b.goodClient(t)
	good()
	heapBefore := heapInUse()
	stop := maxHeld(b.srv)
	var attackers []*attacker
	for range 3 {
		a := dialAttacker(t, b.sock)
		attackers = append(attackers, a)
		for i := range 4 {
			a.lastID = uint32(2*i + 1)
			a.headers(a.lastID, false, grpcRequest("/svc/Update")...)
			a.sendBody(msg, msg) // the stream's whole window: no WINDOW_UPDATE needed
		}
		good()
	}
	heapDuring := heapInUse()
	most := stop()
	// The connection that pays gives its bytes back as its calls end, a moment after it is
	// closed: until then they count, one connection's worth at most.
	if most > lim.TotalBytes+lim.ConnectionBytes {
		t.Errorf("the relay held %d bytes at most, over its budget of %d and a closing connection's %d", most, lim.TotalBytes, lim.ConnectionBytes)
	}
	if grew := heapDuring - heapBefore; grew > 3*lim.TotalBytes {
		t.Errorf("the heap grew by %d bytes while the attackers held their calls, budget %d", grew, lim.TotalBytes)
	}
	t.Logf("held at most %d bytes of a %d budget; heap %d → %d", most, lim.TotalBytes, heapBefore, heapDuring)
	b.wantReported(t, ReasonConnectionBudget)
	b.wantCounted(t, ReasonTotalBudget)
	var calm bool
	for _, a := range attackers {
		a.conn.Close()
		<-a.ended
		calm = calm || a.goAwayCode() == http2.ErrCodeEnhanceYourCalm
	}
	if !calm {
		t.Error("no attacker's connection was closed with GOAWAY ENHANCE_YOUR_CALM")
	}
	good()
	waitUntil(t, "the attackers' bytes are given back", func() bool { return b.srv.Held() == 0 })
}

// goAwayCode is the code of a GOAWAY the relay sent, if any came before the connection ended.
func (a *attacker) goAwayCode() http2.ErrCode {
	for {
		select {
		case f := <-a.frames:
			if f.typ == http2.FrameGoAway {
				return f.code
			}
		default:
			return http2.ErrCodeNo
		}
	}
}

// waitUntil waits for cond, which the relay makes true by itself soon, polling.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, waitFor)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestLengthPrefixOverTheLimitIsRefusedAtOnce: an intercepted request whose length prefix says
// more than the message limit (0xFFFFFFFF) is answered ResourceExhausted at the first DATA
// frame that carries the prefix, and reset (NO_ERROR), as gRPC's server does; the relay holds
// nothing of it.
func TestLengthPrefixOverTheLimitIsRefusedAtOnce(t *testing.T) {
	b := newAttackBed(t, Limits{}, 16<<20)
	good := b.goodClient(t)
	a := dialAttacker(t, b.sock)
	for i := range 8 {
		a.lastID = uint32(2*i + 1)
		a.headers(a.lastID, false, grpcRequest("/svc/Update")...)
		a.write(func(fr *http2.Framer) error {
			return fr.WriteData(a.lastID, false, message(0xFFFFFFFF, make([]byte, 16384-5)))
		})
		if h := a.next(t, a.lastID); h.typ != http2.FrameHeaders || !h.end || headerValue(h.fields, "grpc-status") != fmt.Sprint(int(codes.ResourceExhausted)) {
			t.Fatalf("stream %d: got %+v, want a ResourceExhausted answer", a.lastID, h)
		}
		if r := a.next(t, a.lastID); r.typ != http2.FrameRSTStream || r.code != http2.ErrCodeNo {
			t.Errorf("stream %d: after the answer %+v, want RST_STREAM NO_ERROR", a.lastID, r)
		}
		// The rest of its body is dropped.
		a.write(func(fr *http2.Framer) error { return fr.WriteData(a.lastID, false, make([]byte, 16384)) })
	}
	good()
	if h := b.srv.Held(); h > 16<<10 {
		t.Errorf("the relay holds %d bytes of requests it refused", h)
	}
	b.wantReported(t, ReasonMessageTooLarge)
}

// TestDeadlineAppliesFromTheHeaders: a call with grpc-timeout 1S whose request never ends is
// reset (RST_STREAM CANCEL, as gRPC's server does) at about 1 s, intercepted or passed
// through (its server sees it cancelled); a call without one, after RequestTimeout.
func TestDeadlineAppliesFromTheHeaders(t *testing.T) {
	b := newAttackBed(t, Limits{RequestTimeout: 300 * time.Millisecond}, 16<<20)
	good := b.goodClient(t)
	for _, tt := range []struct {
		path     string
		timeout  string
		after    time.Duration
		upstream bool
	}{
		{"/svc/Update", "1S", time.Second, false},
		{"/svc/Raw", "1S", time.Second, true},
		{"/svc/Update", "", 300 * time.Millisecond, false},
	} {
		a := dialAttacker(t, b.sock) // each its own: a connection gets one log line
		a.lastID = 1
		fields := grpcRequest(tt.path)
		if tt.timeout != "" {
			fields = append(fields, "grpc-timeout", tt.timeout)
		}
		start := time.Now()
		a.headers(a.lastID, false, fields...)
		a.write(func(fr *http2.Framer) error { return fr.WriteData(a.lastID, false, message(100, []byte("part"))) })
		var srv *rawPeer
		if tt.upstream {
			srv = b.up.accept()
		}
		r := a.next(t, a.lastID)
		took := time.Since(start)
		if r.typ != http2.FrameRSTStream || r.code != http2.ErrCodeCancel {
			t.Errorf("%s %q: got %+v, want RST_STREAM CANCEL", tt.path, tt.timeout, r)
		}
		if took < tt.after-50*time.Millisecond || took > tt.after+2*time.Second {
			t.Errorf("%s %q: reset after %s, want about %s", tt.path, tt.timeout, took, tt.after)
		}
		if srv != nil {
			if r := srv.readUntil(isRST).(*http2.RSTStreamFrame); r.ErrCode != http2.ErrCodeCancel {
				t.Errorf("%s: the server got RST_STREAM %v, want CANCEL", tt.path, r.ErrCode)
			}
		}
		good()
	}
	b.wantReported(t, ReasonDeadline)
	b.wantReported(t, ReasonRequestTimeout)
	waitUntil(t, "the calls' bytes are given back", func() bool { return b.srv.Held() == 0 })
}

// TestHeaderListAmplification: one 4,000-byte -bin entry put in HPACK's table once and
// referenced 255 times per stream (about 1 MB decoded from a few hundred bytes), over 1,000
// streams of an intercepted method: each stream is refused as its header list passes the
// limit, counted while it is decoded, and the relay holds none of it.
func TestHeaderListAmplification(t *testing.T) {
	b := newAttackBed(t, Limits{}, 16<<20)
	good := b.goodClient(t)
	heapBefore := heapInUse()
	stop := maxHeld(b.srv)
	a := dialAttacker(t, b.sock)
	big := hpack.HeaderField{Name: "x-amp-bin", Value: strings.Repeat("A", 4000)}
	var sent int
	for i := range 1000 {
		a.mu.Lock()
		a.hbuf.Reset()
		// The request's own fields never indexed, so that the big entry stays in the table.
		for f := grpcRequest("/svc/Update"); len(f) > 1; f = f[2:] {
			_ = a.henc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1], Sensitive: true})
		}
		for range 255 {
			_ = a.henc.WriteField(big)
		}
		block := append([]byte(nil), a.hbuf.Bytes()...)
		a.mu.Unlock()
		sent += len(block)
		id := uint32(2*i + 1)
		a.write(func(fr *http2.Framer) error {
			return fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: block, EndStream: true, EndHeaders: true})
		})
		if r := a.next(t, id); r.typ != http2.FrameRSTStream || r.code != http2.ErrCodeProtocol {
			t.Fatalf("stream %d: got %+v, want RST_STREAM PROTOCOL_ERROR", id, r)
		}
	}
	most := stop()
	if grew := heapInUse() - heapBefore; grew > 16<<20 {
		t.Errorf("the heap grew by %d bytes", grew)
	}
	if most > 64<<10 {
		t.Errorf("the relay held %d bytes", most)
	}
	t.Logf("%d bytes of header blocks sent", sent)
	good()
	b.wantReported(t, ReasonHeaderList)
}

// TestSilentConnections: 500 connections that say the preface and then nothing: never more
// than MaxConnections are open, those over it are closed at once, the others at the idle
// timeout (GOAWAY NO_ERROR); a well-behaved client that calls every few milliseconds is never
// idle, and is answered throughout.
func TestSilentConnections(t *testing.T) {
	const capacity = 300
	const idle = 2 * time.Second
	b := newAttackBed(t, Limits{MaxConnections: capacity, IdleTimeout: idle}, 16<<20)
	good := b.goodClient(t)
	good() // its connection is open before the attack
	stopGood, goodDone := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(goodDone)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stopGood:
				return
			case <-tick.C:
				good()
			}
		}
	}()
	var mostOpen atomic.Int64
	stopCount := maxOf(func() int64 { b.srv.mu.Lock(); defer b.srv.mu.Unlock(); return int64(b.srv.open) }, &mostOpen)
	type result struct {
		settings bool
		goAway   *http2.GoAwayFrame
	}
	results := make(chan result, 500)
	dialing := time.Now()
	for range 500 {
		c, err := net.Dial("unix", b.sock)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		if _, err := c.Write([]byte(http2.ClientPreface)); err != nil {
			results <- result{} // closed over the cap before its preface went
			continue
		}
		go func() {
			fr := http2.NewFramer(io.Discard, c)
			var r result
			_ = c.SetReadDeadline(time.Now().Add(waitFor))
			for {
				f, err := fr.ReadFrame()
				if err != nil {
					results <- r
					return
				}
				switch f := f.(type) {
				case *http2.SettingsFrame:
					r.settings = true
				case *http2.GoAwayFrame:
					r.goAway = f
				}
			}
		}()
	}
	dialled := time.Since(dialing)
	var served, refused int
	for range 500 {
		r := <-results
		switch {
		case r.settings && r.goAway != nil && r.goAway.ErrCode == http2.ErrCodeNo:
			served++
		case !r.settings:
			refused++
		default:
			t.Errorf("a silent connection ended with %+v", r)
		}
	}
	stopCount()
	close(stopGood)
	<-goodDone
	if most := mostOpen.Load(); most > capacity {
		t.Errorf("%d connections open at most, want at most %d", most, capacity)
	}
	t.Logf("%d served until idle, %d refused at once; dialled in %s", served, refused, dialled)
	good()
	if dialled < idle {
		// All 500 were open before the first could be closed idle: the cap refused some.
		b.wantReported(t, ReasonConnectionCap)
	}
	b.mu.Lock()
	if b.reasons[ReasonIdle] < served {
		t.Errorf("%d idle connections counted, %d closed", b.reasons[ReasonIdle], served)
	}
	b.mu.Unlock()
}

// maxOf samples f every millisecond into most until the returned stop is called.
func maxOf(f func() int64, most *atomic.Int64) (stop func()) {
	done, finished := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(finished)
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for {
			if v := f(); v > most.Load() {
				most.Store(v)
			}
			select {
			case <-done:
				return
			case <-tick.C:
			}
		}
	}()
	return func() { close(done); <-finished }
}

// TestKeepalive: a client that sends nothing gets a PING after KeepaliveTime, and its
// connection is closed when it does not answer within KeepaliveTimeout; one that answers stays.
func TestKeepalive(t *testing.T) {
	b := newAttackBed(t, Limits{KeepaliveTime: 100 * time.Millisecond, KeepaliveTimeout: 200 * time.Millisecond}, 16<<20)
	silent := dialAttacker(t, b.sock)
	start := time.Now()
	select {
	case <-silent.ended:
	case <-time.After(waitFor):
		t.Fatal("the silent client's connection was not closed")
	}
	if took := time.Since(start); took < 250*time.Millisecond {
		t.Errorf("closed after %s, before KeepaliveTime and KeepaliveTimeout", took)
	}
	b.wantReported(t, ReasonKeepalive)

	alive := dialRelay(t, b.sock)
	for range 3 { // three PINGs answered: the connection outlives three keepalive times
		alive.readUntil(func(f http2.Frame) bool { p, ok := f.(*http2.PingFrame); return ok && !p.IsAck() })
	}
	alive.headers(1, true, grpcRequest("/svc/Nothing")...)
	if h := alive.readUntil(isHeaders); h.Header().StreamID != 1 {
		t.Errorf("the answering client's call: %v", h)
	}
}

// TestNotPostAnsweredAsGRPCServer: a HEAD (or GET) request is answered as grpc-go's server
// answers it, frame for frame: HTTP 405, grpc-status Internal and its message, the end of the
// stream, and RST_STREAM NO_ERROR when the request had not ended.
func TestNotPostAnsweredAsGRPCServer(t *testing.T) {
	dir := shortDir(t)
	echoT := startEchoServer(t, dir)
	sock := startRelay(t, dir, &Server{Route: func(string) *Target { return echoT }})
	grpcSock := strings.TrimSuffix(sock, "relay.sock") + "echo.sock"
	answer := func(sock, method string, end bool) string {
		cl := dialRelay(t, sock)
		cl.headers(1, end, ":method", method, ":scheme", "http", ":path", "/svc/Echo", ":authority", "x",
			"content-type", "application/grpc", "te", "trailers")
		h := cl.readUntil(func(f http2.Frame) bool { return f.Header().StreamID == 1 }).(*http2.MetaHeadersFrame)
		got := fmt.Sprintf("%s %s %q end=%v", field(h, ":status"), field(h, "grpc-status"), field(h, "grpc-message"), h.StreamEnded())
		if !end {
			f := cl.readUntil(func(f http2.Frame) bool { return f.Header().StreamID == 1 })
			if r, ok := f.(*http2.RSTStreamFrame); ok {
				got += fmt.Sprintf(" rst=%v", r.ErrCode)
			} else {
				got += fmt.Sprintf(" then %v", f)
			}
		}
		return got
	}
	for _, method := range []string{"HEAD", "GET"} {
		for _, end := range []bool{true, false} {
			want, got := answer(grpcSock, method, end), answer(sock, method, end)
			if got != want || !strings.HasPrefix(got, "405 13 ") {
				t.Errorf("%s (end %v): the relay answered %s, grpc-go %s", method, end, got, want)
			}
		}
	}
}

// TestFramesOnClosedStreams: DATA or HEADERS on a stream the client ended (half-closed remote)
// or that has closed are a STREAM_CLOSED stream error (RFC 9113 §5.1), and the connection goes
// on; HEADERS on a stream both ends ended is a STREAM_CLOSED connection error.
func TestFramesOnClosedStreams(t *testing.T) {
	b := newAttackBed(t, Limits{}, 16<<20)
	cl := dialRelay(t, b.sock)
	isRSTOf := func(id uint32) func(http2.Frame) bool {
		return func(f http2.Frame) bool { return isRST(f) && f.Header().StreamID == id }
	}
	// Half-closed (remote): the call's server has not answered yet.
	cl.headers(1, true, grpcRequest("/svc/Raw")...)
	srv := b.up.accept()
	srv.readUntil(isHeaders)
	cl.write(func(fr *http2.Framer) error { return fr.WriteData(1, false, []byte("late")) })
	if r := cl.readUntil(isRSTOf(1)).(*http2.RSTStreamFrame); r.ErrCode != http2.ErrCodeStreamClosed {
		t.Errorf("DATA on a half-closed stream: RST_STREAM %v, want STREAM_CLOSED", r.ErrCode)
	}
	if r := srv.readUntil(isRST).(*http2.RSTStreamFrame); r.ErrCode != http2.ErrCodeCancel {
		t.Errorf("its server got RST_STREAM %v, want CANCEL", r.ErrCode)
	}
	cl.headers(3, true, grpcRequest("/svc/Raw")...)
	srv.readUntil(isHeaders)
	cl.headers(3, true, "x-trailer", "again")
	if r := cl.readUntil(isRSTOf(3)).(*http2.RSTStreamFrame); r.ErrCode != http2.ErrCodeStreamClosed {
		t.Errorf("HEADERS on a half-closed stream: RST_STREAM %v, want STREAM_CLOSED", r.ErrCode)
	}
	// Closed: answered whole (an intercepted call), then the client's RST_STREAM.
	cl.headers(5, false, grpcRequest("/svc/Update")...)
	cl.write(func(fr *http2.Framer) error { return fr.WriteData(5, true, message(2, []byte("hi"))) })
	cl.readUntil(func(f http2.Frame) bool {
		h, ok := f.(*http2.MetaHeadersFrame)
		return ok && h.StreamID == 5 && h.StreamEnded()
	})
	cl.write(func(fr *http2.Framer) error { return fr.WriteData(5, false, []byte("after the end")) })
	if r := cl.readUntil(isRSTOf(5)).(*http2.RSTStreamFrame); r.ErrCode != http2.ErrCodeStreamClosed {
		t.Errorf("DATA on a closed stream: RST_STREAM %v, want STREAM_CLOSED", r.ErrCode)
	}
	// Closed: answered at once (a method nobody serves), then DATA.
	cl.headers(7, true, grpcRequest("/svc/Unknown")...)
	cl.readUntil(func(f http2.Frame) bool { return isHeaders(f) && f.Header().StreamID == 7 })
	cl.write(func(fr *http2.Framer) error { return fr.WriteData(7, false, []byte("after the answer")) })
	if r := cl.readUntil(isRSTOf(7)).(*http2.RSTStreamFrame); r.ErrCode != http2.ErrCodeStreamClosed {
		t.Errorf("DATA on a stream answered at once: RST_STREAM %v, want STREAM_CLOSED", r.ErrCode)
	}
	cl.headers(9, false, grpcRequest("/svc/Update")...)
	cl.write(func(fr *http2.Framer) error { return fr.WriteRSTStream(9, http2.ErrCodeCancel) })
	cl.write(func(fr *http2.Framer) error { return fr.WriteData(9, false, []byte("after the reset")) })
	if r := cl.readUntil(isRSTOf(9)).(*http2.RSTStreamFrame); r.ErrCode != http2.ErrCodeStreamClosed {
		t.Errorf("DATA after the client's RST_STREAM: RST_STREAM %v, want STREAM_CLOSED", r.ErrCode)
	}
	// The connection goes on.
	cl.headers(11, false, grpcRequest("/svc/Update")...)
	cl.write(func(fr *http2.Framer) error { return fr.WriteData(11, true, message(2, []byte("ok"))) })
	if h := cl.readUntil(func(f http2.Frame) bool { return isHeaders(f) && f.Header().StreamID == 11 }); field(h, ":status") != "200" {
		t.Errorf("the next call: %v", h.(*http2.MetaHeadersFrame).Fields)
	}

	// HEADERS on a stream both ends closed with END_STREAM: a connection error of type
	// STREAM_CLOSED (§5.1), as h2spec's "5.1 closed: Sends a HEADERS frame" asks.
	again := dialRelay(t, b.sock)
	again.headers(1, true, grpcRequest("/svc/Unknown")...)
	again.readUntil(func(f http2.Frame) bool { return isHeaders(f) && f.Header().StreamID == 1 })
	again.headers(1, true, grpcRequest("/svc/Unknown")...)
	if g := again.readUntil(func(f http2.Frame) bool { _, ok := f.(*http2.GoAwayFrame); return ok }).(*http2.GoAwayFrame); g.ErrCode != http2.ErrCodeStreamClosed {
		t.Errorf("HEADERS on a closed stream: GOAWAY %v, want STREAM_CLOSED", g.ErrCode)
	}
}

// TestClientsHeaderListLimitKept: an answer whose header block is larger than the client's
// SETTINGS_MAX_HEADER_LIST_SIZE is not sent; the stream is reset (INTERNAL_ERROR), as gRPC's
// server does.
func TestClientsHeaderListLimitKept(t *testing.T) {
	b := newAttackBed(t, Limits{}, 16<<20)
	cl := dialRelay(t, b.sock, http2.Setting{ID: http2.SettingMaxHeaderListSize, Val: 512})
	cl.headers(1, false, grpcRequest("/svc/BigHeader")...)
	cl.write(func(fr *http2.Framer) error { return fr.WriteData(1, true, message(2, []byte("hi"))) })
	f := cl.readUntil(func(f http2.Frame) bool { return f.Header().StreamID == 1 })
	if r, ok := f.(*http2.RSTStreamFrame); !ok || r.ErrCode != http2.ErrCodeInternal {
		t.Errorf("got %v, want RST_STREAM INTERNAL_ERROR", f)
	}
	cl.headers(3, false, grpcRequest("/svc/Update")...)
	cl.write(func(fr *http2.Framer) error { return fr.WriteData(3, true, message(2, []byte("hi"))) })
	if h := cl.readUntil(func(f http2.Frame) bool { return f.Header().StreamID == 3 }); !isHeaders(h) || field(h, ":status") != "200" {
		t.Errorf("a call whose answer fits: %v", h)
	}
}

// TestStreamCapRefused: the relay advertises MaxStreams calls at once per connection and
// refuses one over it with REFUSED_STREAM (RFC 9113 §5.1.2, h2spec's 5.1.2), while the calls
// open stay open.
func TestStreamCapRefused(t *testing.T) {
	b := newAttackBed(t, Limits{}, 16<<20)
	cl := dialRelay(t, b.sock)
	for i := range uint32(MaxStreams) {
		cl.headers(2*i+1, false, grpcRequest("/svc/Raw")...)
	}
	over := uint32(2*MaxStreams + 1)
	cl.headers(over, false, grpcRequest("/svc/Raw")...)
	if r := cl.readUntil(isRST).(*http2.RSTStreamFrame); r.StreamID != over || r.ErrCode != http2.ErrCodeRefusedStream {
		t.Errorf("call %d over the %d advertised: RST_STREAM %d %v, want %d REFUSED_STREAM", MaxStreams+1, MaxStreams, r.StreamID, r.ErrCode, over)
	}
}
