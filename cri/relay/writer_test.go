package relay

// Clients that stop reading (issue 38): the relay's writer is the only goroutine that waits for
// them, so its timers, resets, sheds and closes go on; what it holds for them counts against
// the budget.

import (
	"errors"
	"io"
	"net"
	"os"
	"runtime"
	"testing"
	"time"

	"golang.org/x/net/http2"
)

// dialDeaf connects a client that opens every window as wide as HTTP/2 allows, sends its
// calls' headers and never reads its socket.
func dialDeaf(t *testing.T, sock string) *rawPeer {
	t.Helper()
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	p := newRawPeer(t, c)
	p.lenient = true
	p.write(func(fr *http2.Framer) error {
		if _, err := p.bw.WriteString(http2.ClientPreface); err != nil {
			return err
		}
		if err := fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: maxWindow}); err != nil {
			return err
		}
		return fr.WriteWindowUpdate(0, maxWindow-initialWindow)
	})
	return p
}

// answerBig makes the upstream answer stream id with n bytes of DATA, never ending it, in a
// goroutine: against a client that does not read, the relay's side may stop taking them.
func answerBig(t *testing.T, srv *rawPeer, id uint32, n int) {
	t.Helper()
	srv.headers(id, false, ":status", "200", "content-type", "application/grpc")
	chunk := randomBytes(t, 16384)
	srv.lenient = true
	go func() {
		for sent := 0; sent < n; sent += len(chunk) {
			srv.write(func(fr *http2.Framer) error { return fr.WriteData(id, false, chunk) })
		}
	}()
}

// waitClosed waits until the relay closes the connection whose other end c is, reading and
// dropping what comes; it returns how long that took.
func waitClosed(t *testing.T, c net.Conn) time.Duration {
	t.Helper()
	start := time.Now()
	_ = c.SetReadDeadline(start.Add(waitFor))
	_, err := io.Copy(io.Discard, c)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("the connection was still open after %s", waitFor)
	}
	return time.Since(start)
}

// TestClientThatStopsReadingIsClosedByKeepalive: a client that opens huge windows, makes a
// call whose answer is larger than every socket buffer and never reads is closed by the
// keepalive (its PING cannot reach it: the writer is stuck), and its upstream connection with
// it; meanwhile another client is answered, the answer's bytes count against the budget, and
// they are given back once the connection is gone. Before the writer had a goroutine of its
// own, the PING waited for the stuck write, and the connection was never closed.
func TestClientThatStopsReadingIsClosedByKeepalive(t *testing.T) {
	lim := Limits{KeepaliveTime: 200 * time.Millisecond, KeepaliveTimeout: 300 * time.Millisecond}
	b := newAttackBed(t, lim, 16<<20)
	good := b.goodClient(t)
	deaf := dialDeaf(t, b.sock)
	start := time.Now()
	deaf.headers(1, true, grpcRequest("/svc/Raw")...)
	srv := b.up.accept()
	answerBig(t, srv, srv.readUntil(isHeaders).Header().StreamID, streamWindow)

	waitUntil(t, "the answer's bytes the client did not take are counted", func() bool { return b.srv.Held() >= streamWindow/2 })
	good()
	took := waitClosed(t, srv.conn) // the upstream connection ends with the client's
	b.wantReported(t, ReasonKeepalive)
	waitClosed(t, deaf.conn)
	waitUntil(t, "the bytes are given back", func() bool { return b.srv.Held() == 0 })
	good()
	// How soon is the hostile test's to say (test/hostile, default limits): here the machine
	// may be loaded, and only the keepalive may have closed it (the reason above).
	t.Logf("closed %s after the call, the upstream connection %s after the answer was counted (keepalive %s + %s)",
		time.Since(start).Round(time.Millisecond), took.Round(time.Millisecond), lim.KeepaliveTime, lim.KeepaliveTimeout)
}

// TestWriteTimeoutClosesAClientThatPingsButDoesNotRead: a client that keeps the keepalive
// happy with frames of its own (SETTINGS, each of which asks for an acknowledgement) but never
// reads is closed once a write makes no progress for WriteTimeout; the acknowledgements it asks
// for do not pile up (its reader waits for the writer). (PINGs that often would be a ping flood:
// TestPingFloodClosed.)
func TestWriteTimeoutClosesAClientThatPingsButDoesNotRead(t *testing.T) {
	lim := Limits{KeepaliveTime: time.Minute, WriteTimeout: 300 * time.Millisecond}
	b := newAttackBed(t, lim, 16<<20)
	deaf := dialDeaf(t, b.sock)
	deaf.headers(1, true, grpcRequest("/svc/Raw")...)
	srv := b.up.accept()
	answerBig(t, srv, srv.readUntil(isHeaders).Header().StreamID, streamWindow)
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
			deaf.write(func(fr *http2.Framer) error { return fr.WriteSettings() })
		}
	}()
	waitClosed(t, srv.conn)
	b.wantReported(t, ReasonWriteTimeout)
	b.mu.Lock()
	keepalive := b.reasons[ReasonKeepalive]
	b.mu.Unlock()
	if keepalive > 0 {
		t.Errorf("closed by the keepalive, though the client sent PINGs")
	}
	waitUntil(t, "the bytes are given back", func() bool { return b.srv.Held() == 0 })
}

// shutWindowTimeout is the WindowTimeout of shutWindowCall's relay.
const shutWindowTimeout = 300 * time.Millisecond

// shutWindowCall is a relay with WindowTimeout shutWindowTimeout, and a client that opens no
// window whose call the upstream answers with 1 MiB: the relay, the client, the upstream's end
// of the call's connection and the call's upstream stream id.
func shutWindowCall(t *testing.T) (*attackBed, *attacker, *rawPeer, uint32) {
	t.Helper()
	b := newAttackBed(t, Limits{WindowTimeout: shutWindowTimeout}, 16<<20)
	a := dialAttacker(t, b.sock, http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0})
	a.headers(1, true, grpcRequest("/svc/Raw")...)
	srv := b.up.accept()
	id := srv.readUntil(isHeaders).Header().StreamID
	answerBig(t, srv, id, 1<<20)
	return b, a, srv, id
}

// TestAnswerOnAShutWindowIsReset: a client that reads its socket but never opens a window
// leaves an answer waiting; after WindowTimeout without a byte leaving it is reset on both
// sides, reported, and its bytes are given back.
func TestAnswerOnAShutWindowIsReset(t *testing.T) {
	b, a, srv, id := shutWindowCall(t)
	waitUntil(t, "the answer is counted", func() bool { return b.srv.Held() >= 1<<20 })
	if r := srv.readUntil(isRST).(*http2.RSTStreamFrame); r.StreamID != id || r.ErrCode != http2.ErrCodeCancel {
		t.Errorf("the server got RST_STREAM %d %v, want %d CANCEL", r.StreamID, r.ErrCode, id)
	}
	for {
		if f := a.next(t, 1); f.typ == http2.FrameRSTStream {
			if f.code != http2.ErrCodeCancel {
				t.Errorf("the client's stream was reset with %v, want CANCEL", f.code)
			}
			break
		}
	}
	b.wantReported(t, ReasonWindowTimeout)
	waitUntil(t, "the bytes are given back", func() bool { return b.srv.Held() == 0 })
}

// TestSlowReaderIsNotReset: a client that opens its window a little at a time keeps its call:
// WindowTimeout counts from the last byte that left, not from when the answer began to wait.
func TestSlowReaderIsNotReset(t *testing.T) {
	b, a, _, _ := shutWindowCall(t)
	a.next(t, 1) // the answer's headers: it has begun
	tick := time.NewTicker(shutWindowTimeout / 3)
	defer tick.Stop()
	for range 12 { // four window timeouts
		<-tick.C
		a.write(func(fr *http2.Framer) error {
			if err := fr.WriteWindowUpdate(1, 4096); err != nil {
				return err
			}
			return fr.WriteWindowUpdate(0, 4096)
		})
	}
	b.mu.Lock()
	stalls := b.reasons[ReasonWindowTimeout]
	b.mu.Unlock()
	if stalls > 0 {
		t.Errorf("a call whose client opened its window every %s was reset as stuck", shutWindowTimeout/3)
	}
	select {
	case f := <-a.frames:
		if f.typ == http2.FrameRSTStream {
			t.Errorf("the slow reader's call was reset: %v", f.code)
		}
	default:
	}
}

// TestAnswersCountAgainstTheProcessBudget: clients that open no window hold answers in the
// relay; over the process's budget the connection whose answers waited the longest without a
// byte leaving (minStuck at least) is closed (GOAWAY ENHANCE_YOUR_CALM), so what the relay
// holds stays within the budget and the answer of one connection not stuck yet, and a
// well-behaved client is answered throughout.
func TestAnswersCountAgainstTheProcessBudget(t *testing.T) {
	lim := Limits{TotalBytes: 6 << 20}
	b := newAttackBed(t, lim, 16<<20)
	good := b.goodClient(t)
	stop := maxHeld(b.srv)
	var attackers []*attacker
	for i := range 4 {
		a := dialAttacker(t, b.sock, http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0})
		attackers = append(attackers, a)
		a.headers(1, true, grpcRequest("/svc/Raw")...)
		srv := b.up.accept()
		id := srv.readUntil(isHeaders).Header().StreamID
		answerBig(t, srv, id, 3<<20)
		if i == 0 {
			waitUntil(t, "the answer is counted", func() bool { return b.srv.Held() >= 3<<20 })
		}
		// The next one comes once this one's answer counts as stuck.
		parked := time.Now()
		waitUntil(t, "the answer waits long enough to count as stuck", func() bool { return time.Since(parked) > minStuck })
		good()
	}
	calm := 0
	waitUntil(t, "a connection is closed", func() bool {
		for _, a := range attackers {
			select {
			case <-a.ended:
				if a.goAwayCode() == http2.ErrCodeEnhanceYourCalm {
					calm++
				}
			default:
			}
		}
		return calm > 0
	})
	b.wantReported(t, ReasonTotalBudget) // the shed is told before its GOAWAY goes
	most := stop()
	if limit := lim.TotalBytes + 3<<20; most > limit {
		t.Errorf("the relay held %d bytes at most, over its budget and the answer of a connection not stuck yet (%d)", most, limit)
	}
	t.Logf("held at most %d bytes of a %d budget", most, lim.TotalBytes)
	for _, a := range attackers {
		a.conn.Close()
	}
	waitUntil(t, "the bytes are given back", func() bool { return b.srv.Held() == 0 })
	good()
}

// TestHeaderOnlyStreamsChargedWhatTheyHold: calls whose request never comes hold their stream's
// state; the budget counts at least what the heap holds for them, answered in the process or
// passed through.
func TestHeaderOnlyStreamsChargedWhatTheyHold(t *testing.T) {
	for _, path := range []string{"/svc/Update", "/svc/Raw"} {
		t.Run(path, func(t *testing.T) {
			b := newAttackBed(t, Limits{}, 16<<20)
			a := dialAttacker(t, b.sock)
			const n = 999
			a.headers(1, true, grpcRequest("/svc/Unknown")...)
			a.next(t, 1) // answered: the session is up
			if path == "/svc/Raw" {
				a.headers(3, false, grpcRequest(path)...)
				b.up.accept() // the upstream connection is up; it reads nothing more
			}
			before, heldBefore := heapAlloc(), b.srv.Held()
			for i := range n {
				a.headers(uint32(2*i+5), false, grpcRequest(path)...)
			}
			waitUntil(t, "every call is open", func() bool {
				b.srv.mu.Lock()
				var sessions []*session
				for ss := range b.srv.sessions {
					sessions = append(sessions, ss)
				}
				b.srv.mu.Unlock() // the lock order is a session's mu, then the server's
				for _, ss := range sessions {
					ss.mu.Lock()
					open := len(ss.streams)
					ss.mu.Unlock()
					if open >= n {
						return true
					}
				}
				return false
			})
			heap, held := heapAlloc()-before, b.srv.Held()-heldBefore
			runtime.KeepAlive(a)
			t.Logf("%d header-only calls: heap +%d bytes (%d each), charged %d (%d each)", n, heap, heap/n, held, held/n)
			if held < heap {
				t.Errorf("charged %d bytes for %d header-only calls, the heap holds %d for them", held, n, heap)
			}
		})
	}
}

// heapAlloc is the heap's live bytes after two collections.
func heapAlloc() int64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}
