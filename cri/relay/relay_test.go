package relay

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"net"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
)

func isHeaders(f http2.Frame) bool { _, ok := f.(*http2.MetaHeadersFrame); return ok }
func isData(f http2.Frame) bool    { _, ok := f.(*http2.DataFrame); return ok }
func isRST(f http2.Frame) bool     { _, ok := f.(*http2.RSTStreamFrame); return ok }

func field(f http2.Frame, name string) string {
	return headerValue(f.(*http2.MetaHeadersFrame).Fields, name)
}

func randomBytes(t testing.TB, n int) []byte {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

// relayTo starts a relay that sends every call to up, observed by a recorder. Once the relay
// has shut down, every call it began has ended.
func relayTo(t *testing.T, dir string, up *rawUpstream) (string, *recorder) {
	rec := newRecorder()
	t.Cleanup(func() { // after startRelay's Shutdown
		rec.mu.Lock()
		defer rec.mu.Unlock()
		if rec.open != 0 {
			t.Errorf("%d calls began and never ended (began %v, ended %v)", rec.open, rec.begun, rec.ended)
		}
	})
	tgt := up.target()
	sock := startRelay(t, dir, &Server{Route: func(string) *Target { return tgt }, Observer: rec})
	return sock, rec
}

// TestForwardsEachFrameAsItArrives: the relay passes a call's request and headers to the server
// as they came, and the server's answer to the client frame by frame: the client has the first
// DATA frame while the server still holds the rest back, so a large answer costs one more
// hop's latency, not one more transfer.
func TestForwardsEachFrameAsItArrives(t *testing.T) {
	dir := shortDir(t)
	up := startRawUpstream(t, dir)
	sock, rec := relayTo(t, dir, up)
	cl := dialRelay(t, sock)

	req := randomBytes(t, 3000)
	cl.headers(1, false, append(grpcRequest("/svc/Method"), "x-caller", "kubelet", "grpc-timeout", "2S")...)
	cl.write(func(fr *http2.Framer) error { return fr.WriteData(1, true, req) })

	srv := up.accept()
	h := srv.readUntil(isHeaders).(*http2.MetaHeadersFrame)
	for name, want := range map[string]string{":path": "/svc/Method", ":method": "POST", "x-caller": "kubelet", "grpc-timeout": "2S", "te": "trailers", "content-type": "application/grpc"} {
		if got := headerValue(h.Fields, name); got != want {
			t.Errorf("server got %s %q, want %q", name, got, want)
		}
	}
	var got []byte
	for {
		d := srv.readUntil(isData).(*http2.DataFrame)
		got = append(got, d.Data()...)
		if d.StreamEnded() {
			break
		}
	}
	if !bytes.Equal(got, req) {
		t.Fatalf("server got %d request bytes, not the client's %d", len(got), len(req))
	}

	id := h.StreamID
	part1, part2 := randomBytes(t, 16000), randomBytes(t, 9000)
	srv.headers(id, false, ":status", "200", "content-type", "application/grpc", "x-answer", "a")
	srv.write(func(fr *http2.Framer) error { return fr.WriteData(id, false, part1) })

	if ch := cl.readUntil(isHeaders); field(ch, "x-answer") != "a" || field(ch, ":status") != "200" {
		t.Errorf("client got headers %v", ch.(*http2.MetaHeadersFrame).Fields)
	}
	// The server has not sent the rest yet: this frame came through on its own.
	if d := cl.readUntil(isData).(*http2.DataFrame); !bytes.Equal(d.Data(), part1) || d.StreamEnded() {
		t.Fatalf("client's first DATA: %d bytes (end %v), want the server's first %d", len(d.Data()), d.StreamEnded(), len(part1))
	}

	srv.write(func(fr *http2.Framer) error { return fr.WriteData(id, false, part2) })
	srv.headers(id, true, "grpc-status", "0", "x-trailer", "b")
	if d := cl.readUntil(isData).(*http2.DataFrame); !bytes.Equal(d.Data(), part2) {
		t.Fatalf("client's second DATA: %d bytes, want %d", len(d.Data()), len(part2))
	}
	tr := cl.readUntil(isHeaders).(*http2.MetaHeadersFrame)
	if !tr.StreamEnded() || field(tr, "grpc-status") != "0" || field(tr, "x-trailer") != "b" {
		t.Errorf("client's trailers: %v (end %v)", tr.Fields, tr.StreamEnded())
	}
	rec.wantEnded(t, "/svc/Method", codes.OK)
}

// TestRespectsTheClientsWindow: a client that gives a small window gets the answer in pieces
// no larger than what it allowed, all of it, in order, and the trailers only after the last
// byte.
func TestRespectsTheClientsWindow(t *testing.T) {
	dir := shortDir(t)
	up := startRawUpstream(t, dir)
	sock, _ := relayTo(t, dir, up)
	const window = 1024
	cl := dialRelay(t, sock, http2.Setting{ID: http2.SettingInitialWindowSize, Val: window})
	cl.headers(1, true, grpcRequest("/svc/Big")...)

	srv := up.accept()
	id := srv.readUntil(isHeaders).Header().StreamID
	answer := randomBytes(t, 40000) // within the connection's default window of 65,535
	srv.headers(id, false, ":status", "200", "content-type", "application/grpc")
	for off := 0; off < len(answer); off += 10000 {
		srv.write(func(fr *http2.Framer) error { return fr.WriteData(id, false, answer[off:off+10000]) })
	}
	srv.headers(id, true, "grpc-status", "0")

	var got []byte
	allowed := window
	for {
		f := cl.readUntil(func(f http2.Frame) bool { return isData(f) || isHeaders(f) })
		if h, ok := f.(*http2.MetaHeadersFrame); ok {
			if h.StreamEnded() {
				break
			}
			continue
		}
		d := f.(*http2.DataFrame)
		got = append(got, d.Data()...)
		if len(got) > allowed {
			t.Fatalf("the relay sent %d bytes on a stream whose window allowed %d", len(got), allowed)
		}
		if len(got) == allowed {
			allowed += window
			cl.write(func(fr *http2.Framer) error { return fr.WriteWindowUpdate(1, window) })
		}
	}
	if !bytes.Equal(got, answer) {
		t.Fatalf("client got %d bytes before the trailers, want the server's %d in order", len(got), len(answer))
	}
}

// TestBoundsWhatItHoldsForASlowClient: for a client that reads nothing, the relay holds at most
// its stream window of the server's answer; a server that sends more breaks flow control, and
// the relay resets the call on both sides instead of holding more. The connections go on.
func TestBoundsWhatItHoldsForASlowClient(t *testing.T) {
	dir := shortDir(t)
	up := startRawUpstream(t, dir)
	sock, rec := relayTo(t, dir, up)
	cl := dialRelay(t, sock, http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0})
	cl.headers(1, true, grpcRequest("/svc/Flood")...)

	srv := up.accept()
	id := srv.readUntil(isHeaders).Header().StreamID
	srv.headers(id, false, ":status", "200", "content-type", "application/grpc")
	chunk := randomBytes(t, 16384)
	for sent := 0; sent < streamWindow; sent += len(chunk) {
		srv.write(func(fr *http2.Framer) error { return fr.WriteData(id, false, chunk) })
	}
	srv.write(func(fr *http2.Framer) error { return fr.WriteData(id, false, []byte{1}) }) // one byte too many

	if r := srv.readUntil(isRST).(*http2.RSTStreamFrame); r.StreamID != id {
		t.Errorf("server got RST_STREAM for stream %d, want %d", r.StreamID, id)
	}
	if r := cl.readUntil(isRST).(*http2.RSTStreamFrame); r.StreamID != 1 || r.ErrCode != http2.ErrCodeFlowControl {
		t.Errorf("client got RST_STREAM %d %v, want 1 FLOW_CONTROL_ERROR", r.StreamID, r.ErrCode)
	}
	rec.wantEnded(t, "/svc/Flood", codes.Internal)

	// Both connections still carry calls.
	cl.headers(3, true, grpcRequest("/svc/Next")...)
	id = srv.readUntil(isHeaders).Header().StreamID
	srv.headers(id, true, ":status", "200", "content-type", "application/grpc", "grpc-status", "0")
	if h := cl.readUntil(isHeaders); h.Header().StreamID != 3 || field(h, "grpc-status") != "0" {
		t.Errorf("the next call: %v", h.(*http2.MetaHeadersFrame).Fields)
	}
}

// TestUpstreamGoAwayRefusesWhatItDidNotTake: when the server says GOAWAY, the calls above its
// last stream are refused to the client (REFUSED_STREAM: gRPC clients retry them), the calls
// it took go on, and the next call goes over a new connection.
func TestUpstreamGoAwayRefusesWhatItDidNotTake(t *testing.T) {
	dir := shortDir(t)
	up := startRawUpstream(t, dir)
	sock, rec := relayTo(t, dir, up)
	cl := dialRelay(t, sock)
	cl.headers(1, false, grpcRequest("/svc/Taken")...)
	cl.headers(3, true, grpcRequest("/svc/NotTaken")...)

	srv := up.accept()
	first := srv.readUntil(isHeaders).Header().StreamID
	srv.readUntil(isHeaders)
	srv.write(func(fr *http2.Framer) error { return fr.WriteGoAway(first, http2.ErrCodeNo, nil) })
	if r := cl.readUntil(isRST).(*http2.RSTStreamFrame); r.StreamID != 3 || r.ErrCode != http2.ErrCodeRefusedStream {
		t.Errorf("client got RST_STREAM %d %v, want 3 REFUSED_STREAM", r.StreamID, r.ErrCode)
	}
	// The call the server took goes on both ways over the old connection.
	req := randomBytes(t, 5000)
	cl.write(func(fr *http2.Framer) error { return fr.WriteData(1, true, req) })
	if d := srv.readUntil(isData).(*http2.DataFrame); !bytes.Equal(d.Data(), req) || !d.StreamEnded() {
		t.Errorf("after its GOAWAY the server got %d bytes (end %v) of the call it took, want %d", len(d.Data()), d.StreamEnded(), len(req))
	}
	srv.headers(first, true, ":status", "200", "content-type", "application/grpc", "grpc-status", "0")
	if h := cl.readUntil(isHeaders); h.Header().StreamID != 1 || field(h, "grpc-status") != "0" {
		t.Errorf("the call the server took: %v", h.(*http2.MetaHeadersFrame).Fields)
	}
	srv.readEnd() // its last call done, the old connection closes

	cl.headers(5, true, grpcRequest("/svc/Later")...)
	srv2 := up.accept()
	if h := srv2.readUntil(isHeaders); field(h, ":path") != "/svc/Later" || h.Header().StreamID != 1 {
		t.Errorf("the next call reached the new connection as stream %d %q", h.Header().StreamID, field(h, ":path"))
	}
	rec.wantEnded(t, "/svc/Taken", codes.OK)
	rec.wantEnded(t, "/svc/NotTaken", codes.Unavailable)
}

// TestUpstreamLostEndsCallsUnavailable: when the server's connection breaks, a call whose
// answer had begun ends with trailers, one that had none with a trailers-only answer, both
// Unavailable and naming the server.
func TestUpstreamLostEndsCallsUnavailable(t *testing.T) {
	dir := shortDir(t)
	up := startRawUpstream(t, dir)
	sock, rec := relayTo(t, dir, up)
	cl := dialRelay(t, sock)
	cl.headers(1, true, grpcRequest("/svc/Begun")...)
	cl.headers(3, true, grpcRequest("/svc/NotBegun")...)
	srv := up.accept()
	id := srv.readUntil(isHeaders).Header().StreamID
	srv.readUntil(isHeaders)
	srv.headers(id, false, ":status", "200", "content-type", "application/grpc")
	cl.readUntil(isHeaders)
	srv.conn.Close()

	for range 2 {
		h := cl.readUntil(isHeaders).(*http2.MetaHeadersFrame)
		trailersOnly := headerValue(h.Fields, ":status") == "200"
		if want := h.StreamID == 3; trailersOnly != want {
			t.Errorf("stream %d: trailers-only %v, want %v", h.StreamID, trailersOnly, want)
		}
		if !h.StreamEnded() || field(h, "grpc-status") != fmt.Sprint(int(codes.Unavailable)) || !strings.Contains(field(h, "grpc-message"), "test upstream") {
			t.Errorf("stream %d ended with %v", h.StreamID, h.Fields)
		}
	}
	rec.wantEnded(t, "/svc/Begun", codes.Unavailable)
	rec.wantEnded(t, "/svc/NotBegun", codes.Unavailable)
}

// TestAnswerThatCameWholeOutlivesItsConnection: an answer that arrived whole (trailers
// included) but waits for the client's window still reaches the client whole and OK when the
// server's connection closes meanwhile, and a server's RST_STREAM(NO_ERROR) after its answer
// (grpc-go's when a handler returns first) only stops the request.
func TestAnswerThatCameWholeOutlivesItsConnection(t *testing.T) {
	for _, end := range []string{"connection closed", "RST_STREAM NO_ERROR"} {
		t.Run(end, func(t *testing.T) {
			dir := shortDir(t)
			up := startRawUpstream(t, dir)
			sock, rec := relayTo(t, dir, up)
			cl := dialRelay(t, sock, http2.Setting{ID: http2.SettingInitialWindowSize, Val: 100})
			cl.headers(1, false, grpcRequest("/svc/Answered")...)
			srv := up.accept()
			id := srv.readUntil(isHeaders).Header().StreamID
			answer := randomBytes(t, 300)
			srv.headers(id, false, ":status", "200", "content-type", "application/grpc")
			srv.write(func(fr *http2.Framer) error { return fr.WriteData(id, false, answer) })
			srv.headers(id, true, "grpc-status", "0")
			if end == "connection closed" {
				srv.conn.Close()
			} else {
				srv.write(func(fr *http2.Framer) error { return fr.WriteRSTStream(id, http2.ErrCodeNo) })
			}
			var got []byte
			for {
				f := cl.readUntil(func(f http2.Frame) bool { return isData(f) || isHeaders(f) || isRST(f) })
				if r, ok := f.(*http2.RSTStreamFrame); ok {
					t.Fatalf("client got RST_STREAM %v", r.ErrCode)
				}
				if d, ok := f.(*http2.DataFrame); ok {
					got = append(got, d.Data()...)
					cl.write(func(fr *http2.Framer) error { return fr.WriteWindowUpdate(1, uint32(len(d.Data()))) })
					continue
				}
				if h := f.(*http2.MetaHeadersFrame); h.StreamEnded() {
					if field(h, "grpc-status") != "0" {
						t.Errorf("trailers %v, want grpc-status 0", h.Fields)
					}
					break
				}
			}
			if !bytes.Equal(got, answer) {
				t.Errorf("client got %d bytes, want the server's %d", len(got), len(answer))
			}
			// The client may still end its side: nothing of it reaches the server, nothing breaks.
			cl.write(func(fr *http2.Framer) error { return fr.WriteData(1, true, []byte("late")) })
			rec.wantEnded(t, "/svc/Answered", codes.OK)
		})
	}
}

// TestQueueHoldsBytesNotFrames: for a client that reads nothing, the server's answer in many
// tiny and empty frames is held as its bytes, in one buffer, and reaches the client whole once
// it opens its window.
func TestQueueHoldsBytesNotFrames(t *testing.T) {
	dir := shortDir(t)
	up := startRawUpstream(t, dir)
	rec := newRecorder()
	tgt := up.target()
	srv := &Server{Route: func(string) *Target { return tgt }, Observer: rec}
	sock := startRelay(t, dir, srv)
	cl := dialRelay(t, sock, http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0})
	cl.headers(1, true, grpcRequest("/svc/Tiny")...)
	upc := up.accept()
	id := upc.readUntil(isHeaders).Header().StreamID
	upc.headers(id, false, ":status", "200", "content-type", "application/grpc")
	const frames = 20000 // more than one frame's worth when they leave
	var want []byte
	for i := range frames {
		b := []byte{byte(i)}
		want = append(want, b[0])
		upc.write(func(fr *http2.Framer) error {
			if err := fr.WriteData(id, false, nil); err != nil {
				return err
			}
			return fr.WriteData(id, false, b)
		})
	}
	upc.headers(id, true, "grpc-status", "0")
	cl.readUntil(isHeaders) // the response headers, which flow control does not hold
	// The server wrote its last frame; a PING's answer comes after the relay read them all.
	upc.write(func(fr *http2.Framer) error { return fr.WritePing(false, [8]byte{1}) })
	upc.readUntil(func(f http2.Frame) bool { p, ok := f.(*http2.PingFrame); return ok && p.IsAck() })

	var chunksHeld int
	var heldLen int64
	var tail bool
	ownQueue(t, srv, 1, func(q *queue) {
		chunksHeld, heldLen, tail = len(q.data), q.size, q.tail != nil
	})
	if want := (frames + chunkSize - 1) / chunkSize; chunksHeld != want || heldLen != frames || !tail {
		t.Errorf("the relay holds %d chunks of %d bytes (trailers %v) for %d tiny frames and the trailers; want %d chunks of %d bytes and the trailers", chunksHeld, heldLen, tail, 2*frames, want, frames)
	}

	cl.write(func(fr *http2.Framer) error { return fr.WriteWindowUpdate(1, frames) })
	var got []byte
	for {
		f := cl.readUntil(func(f http2.Frame) bool { return isData(f) || isHeaders(f) })
		if d, ok := f.(*http2.DataFrame); ok {
			got = append(got, d.Data()...)
			continue
		}
		break
	}
	if !bytes.Equal(got, want) {
		t.Errorf("client got %d bytes, want %d in order", len(got), len(want))
	}
	rec.wantEnded(t, "/svc/Tiny", codes.OK)
}

// TestClientResetReachesTheServer: a call the client cancels (RST_STREAM CANCEL) is cancelled
// at the server, and the observer sees it Canceled.
func TestClientResetReachesTheServer(t *testing.T) {
	dir := shortDir(t)
	up := startRawUpstream(t, dir)
	sock, rec := relayTo(t, dir, up)
	cl := dialRelay(t, sock)
	cl.headers(1, true, grpcRequest("/svc/Cancelled")...)
	srv := up.accept()
	id := srv.readUntil(isHeaders).Header().StreamID
	cl.write(func(fr *http2.Framer) error { return fr.WriteRSTStream(1, http2.ErrCodeCancel) })
	if r := srv.readUntil(isRST).(*http2.RSTStreamFrame); r.StreamID != id || r.ErrCode != http2.ErrCodeCancel {
		t.Errorf("server got RST_STREAM %d %v, want %d CANCEL", r.StreamID, r.ErrCode, id)
	}
	rec.wantEnded(t, "/svc/Cancelled", codes.Canceled)
}

// TestConnectionWindowAndSettingsChanges: the client's connection window bounds what the relay
// sends on all streams together, and a larger SETTINGS_INITIAL_WINDOW_SIZE mid-call lets what
// waited go; a client that wants no dynamic header table (SETTINGS_HEADER_TABLE_SIZE 0) gets
// header blocks it can decode without one.
func TestConnectionWindowAndSettingsChanges(t *testing.T) {
	dir := shortDir(t)
	up := startRawUpstream(t, dir)
	sock, _ := relayTo(t, dir, up)
	cl := dialRelay(t, sock,
		http2.Setting{ID: http2.SettingInitialWindowSize, Val: 40000},
		http2.Setting{ID: http2.SettingHeaderTableSize, Val: 0})
	cl.fr.ReadMetaHeaders = hpack.NewDecoder(0, nil)
	cl.headers(1, true, grpcRequest("/svc/A")...)
	cl.headers(3, true, grpcRequest("/svc/B")...)
	srv := up.accept()
	ids := []uint32{srv.readUntil(isHeaders).Header().StreamID, srv.readUntil(isHeaders).Header().StreamID}
	answer := randomBytes(t, 40000)
	for _, id := range ids {
		srv.headers(id, false, ":status", "200", "content-type", "application/grpc", "x-same", "value")
		for off := 0; off < len(answer); off += 10000 {
			srv.write(func(fr *http2.Framer) error { return fr.WriteData(id, false, answer[off:off+10000]) })
		}
		srv.headers(id, true, "grpc-status", "0")
	}
	got := map[uint32]int{}
	total, ended := 0, 0
	const connWindow = 65535 // the client's, never raised here
	for total < connWindow {
		f := cl.readUntil(func(f http2.Frame) bool { return isData(f) || isHeaders(f) })
		if h, ok := f.(*http2.MetaHeadersFrame); ok {
			if h.StreamEnded() {
				ended++
			} else if field(h, "x-same") != "value" {
				t.Errorf("headers of stream %d: %v", h.StreamID, h.Fields)
			}
			continue
		}
		d := f.(*http2.DataFrame)
		got[d.StreamID] += len(d.Data())
		total += len(d.Data())
		if total > connWindow {
			t.Fatalf("the relay sent %d bytes on a connection whose window was %d", total, connWindow)
		}
	}
	// The connection window open again, and the streams' larger: the rest comes.
	cl.write(func(fr *http2.Framer) error {
		if err := fr.WriteWindowUpdate(0, 1<<20); err != nil {
			return err
		}
		return fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1 << 20})
	})
	for ended < 2 {
		f := cl.readUntil(func(f http2.Frame) bool { return isData(f) || isHeaders(f) })
		if d, ok := f.(*http2.DataFrame); ok {
			got[d.StreamID] += len(d.Data())
			continue
		}
		if f.(*http2.MetaHeadersFrame).StreamEnded() {
			ended++
		}
	}
	if got[1] != len(answer) || got[3] != len(answer) {
		t.Errorf("client got %v bytes per stream, want %d each", got, len(answer))
	}
}

// TestHostileClients: a client that breaks HTTP/2 gets the error HTTP/2 prescribes (its
// connection ends with GOAWAY, or its stream with RST_STREAM), and the relay goes on serving
// other clients.
func TestHostileClients(t *testing.T) {
	dir := shortDir(t)
	up := startRawUpstream(t, dir)
	sock, _ := relayTo(t, dir, up)
	tests := []struct {
		name string
		do   func(cl *rawPeer)
		// goAway is the GOAWAY code the connection ends with; rst the RST_STREAM code of
		// stream 1 when the connection stays.
		goAway, rst *http2.ErrCode
	}{
		{"even stream id", func(cl *rawPeer) { cl.headers(2, true, grpcRequest("/svc/M")...) }, ptr(http2.ErrCodeProtocol), nil},
		{"stream id going back", func(cl *rawPeer) {
			cl.headers(5, true, ":method", "GET", ":scheme", "http", ":path", "/svc/M", ":authority", "x")
			cl.headers(3, true, grpcRequest("/svc/M")...)
		}, ptr(http2.ErrCodeProtocol), nil},
		{"PUSH_PROMISE", func(cl *rawPeer) {
			cl.write(func(fr *http2.Framer) error {
				return fr.WritePushPromise(http2.PushPromiseParam{StreamID: 1, PromiseID: 2, EndHeaders: true})
			})
		}, ptr(http2.ErrCodeProtocol), nil},
		{"connection window overflow", func(cl *rawPeer) {
			cl.write(func(fr *http2.Framer) error { return fr.WriteWindowUpdate(0, 1<<31-1) })
		}, ptr(http2.ErrCodeFlowControl), nil},
		{"initial window too large", func(cl *rawPeer) {
			cl.write(func(fr *http2.Framer) error {
				return fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1 << 31})
			})
		}, ptr(http2.ErrCodeFlowControl), nil},
		{"no path", func(cl *rawPeer) {
			cl.headers(1, true, ":method", "POST", ":scheme", "http", ":authority", "x")
		}, nil, ptr(http2.ErrCodeProtocol)},
		{"frame larger than the relay's maximum", func(cl *rawPeer) {
			cl.write(func(fr *http2.Framer) error { return fr.WriteRawFrame(http2.FrameData, 0, 1, make([]byte, maxFrame+1)) })
		}, ptr(http2.ErrCodeFrameSize), nil},
		{"trailers after the relay's reset are ignored", func(cl *rawPeer) {
			cl.headers(1, false, ":method", "POST", ":scheme", "http", ":authority", "x")
			cl.headers(1, true, "x-trailer", "late")
		}, nil, ptr(http2.ErrCodeProtocol)},
		{"header list too large", func(cl *rawPeer) {
			// Fields each within the limit, together over it: the decoder counts them as it
			// decodes them and keeps none past the limit.
			fields := grpcRequest("/svc/M")
			for i := range int(DefaultLimits.MaxHeaderList)/4096 + 1 {
				fields = append(fields, fmt.Sprintf("x-big-%d", i), strings.Repeat("a", 4096))
			}
			cl.headers(1, true, fields...)
		}, nil, ptr(http2.ErrCodeProtocol)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cl := dialRelay(t, sock)
			tt.do(cl)
			if tt.goAway != nil {
				g := cl.readEnd()
				if g == nil || g.ErrCode != *tt.goAway {
					t.Errorf("connection ended with GOAWAY %v, want %v", g, *tt.goAway)
				}
			} else if r := cl.readUntil(isRST).(*http2.RSTStreamFrame); r.StreamID != 1 || r.ErrCode != *tt.rst {
				t.Errorf("got RST_STREAM %d %v, want 1 %v", r.StreamID, r.ErrCode, *tt.rst)
			}
			// Another client's call goes through meanwhile.
			good := dialRelay(t, sock)
			good.headers(1, true, grpcRequest("/svc/Good")...)
			srv := up.accept()
			h := srv.readUntil(isHeaders)
			if field(h, ":path") != "/svc/Good" {
				t.Fatalf("server got %q, want the good client's call", field(h, ":path"))
			}
			srv.headers(h.Header().StreamID, true, ":status", "200", "content-type", "application/grpc", "grpc-status", "0")
			if h := good.readUntil(isHeaders); field(h, "grpc-status") != "0" {
				t.Errorf("the good client's call: %v", h.(*http2.MetaHeadersFrame).Fields)
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }

// TestShutdown: Shutdown refuses new connections, tells the client GOAWAY, ends the long-lived
// calls at once with Unavailable (their server sees them cancelled), lets the other calls
// finish, and returns once the last connection closed; Serve then returns nil.
func TestShutdown(t *testing.T) {
	dir := shortDir(t)
	up := startRawUpstream(t, dir)
	tgt := up.target()
	srv := &Server{
		Route:           func(string) *Target { return tgt },
		LongLived:       func(path string) bool { return path == "/svc/Watch" },
		ShutdownMessage: "relay is shutting down",
	}
	sock, served := serveRelay(t, dir, srv, nil)
	cl := dialRelay(t, sock)
	cl.headers(1, true, grpcRequest("/svc/Watch")...)
	cl.headers(3, true, grpcRequest("/svc/Slow")...)
	upc := up.accept()
	watchID := upc.readUntil(isHeaders).Header().StreamID
	slowID := upc.readUntil(isHeaders).Header().StreamID

	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		srv.Shutdown(context.Background())
	}()
	if g := cl.readUntil(func(f http2.Frame) bool { _, ok := f.(*http2.GoAwayFrame); return ok }).(*http2.GoAwayFrame); g.LastStreamID != 3 || g.ErrCode != http2.ErrCodeNo {
		t.Errorf("GOAWAY %d %v, want 3 NO_ERROR", g.LastStreamID, g.ErrCode)
	}
	h := cl.readUntil(isHeaders).(*http2.MetaHeadersFrame)
	if h.StreamID != 1 || field(h, "grpc-status") != fmt.Sprint(int(codes.Unavailable)) || field(h, "grpc-message") != "relay is shutting down" {
		t.Errorf("stream %d ended with %v, want the watch ended Unavailable", h.StreamID, h.Fields)
	}
	if r := upc.readUntil(isRST).(*http2.RSTStreamFrame); r.StreamID != watchID || r.ErrCode != http2.ErrCodeCancel {
		t.Errorf("server got RST_STREAM %d %v, want %d CANCEL", r.StreamID, r.ErrCode, watchID)
	}
	if err := <-served; err != nil {
		t.Errorf("Serve after Shutdown: %v", err)
	}
	if c, err := net.Dial("unix", sock); err == nil {
		c.Close()
		t.Error("a new connection was accepted during Shutdown")
	}
	select {
	case <-stopped:
		t.Fatal("Shutdown returned with a call still open")
	default:
	}

	upc.headers(slowID, true, ":status", "200", "content-type", "application/grpc", "grpc-status", "0")
	if h := cl.readUntil(isHeaders); h.Header().StreamID != 3 || field(h, "grpc-status") != "0" {
		t.Errorf("the unary call: %v", h.(*http2.MetaHeadersFrame).Fields)
	}
	if g := cl.readEnd(); g != nil {
		t.Errorf("a second GOAWAY %v", g)
	}
	select {
	case <-stopped:
	case <-time.After(waitFor):
		t.Fatal("Shutdown did not return after the last call ended")
	}
}

// TestShutdownCutsWhatIsLeftWhenCtxEnds: a call that does not finish within Shutdown's
// context is cut: the connections close and Shutdown returns.
func TestShutdownCutsWhatIsLeftWhenCtxEnds(t *testing.T) {
	dir := shortDir(t)
	up := startRawUpstream(t, dir)
	tgt := up.target()
	srv := &Server{Route: func(string) *Target { return tgt }}
	sock, _ := serveRelay(t, dir, srv, nil)
	cl := dialRelay(t, sock)
	cl.headers(1, true, grpcRequest("/svc/Never")...)
	upc := up.accept()
	upc.readUntil(isHeaders)

	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		srv.Shutdown(ctx)
	}()
	cl.readUntil(func(f http2.Frame) bool { _, ok := f.(*http2.GoAwayFrame); return ok })
	cancel()
	cl.readEnd()
	upc.readEnd()
	select {
	case <-stopped:
	case <-time.After(waitFor):
		t.Fatal("Shutdown did not return after its context ended")
	}
}

// TestShutdownClosesSilentConnections: a connection that never says the HTTP/2 preface does
// not hold Shutdown up.
func TestShutdownClosesSilentConnections(t *testing.T) {
	dir := shortDir(t)
	up := startRawUpstream(t, dir)
	tgt := up.target()
	srv := &Server{Route: func(string) *Target { return tgt }}
	sock, served := serveRelay(t, dir, srv, nil)
	silent, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	// A call on another connection shows the relay serves (and has accepted the silent one).
	cl := dialRelay(t, sock)
	cl.headers(1, true, grpcRequest("/svc/M")...)
	upc := up.accept()
	upc.headers(upc.readUntil(isHeaders).Header().StreamID, true, ":status", "200", "content-type", "application/grpc", "grpc-status", "0")
	cl.readUntil(isHeaders)

	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		srv.Shutdown(context.Background()) // no deadline: only the relay can end it
	}()
	select {
	case <-stopped:
	case <-time.After(waitFor):
		t.Fatal("Shutdown waits for a connection that never said the preface")
	}
	if err := <-served; err != nil {
		t.Errorf("Serve: %v", err)
	}
	_ = silent.SetReadDeadline(time.Now().Add(waitFor))
	if n, err := silent.Read(make([]byte, 1)); err == nil {
		t.Errorf("the silent connection is still open (read %d bytes)", n)
	}
}

// flakyListener fails its first Accept with a passing error (out of file descriptors).
type flakyListener struct {
	net.Listener
	failed bool
}

func (l *flakyListener) Accept() (net.Conn, error) {
	if !l.failed {
		l.failed = true
		return nil, &net.OpError{Op: "accept", Net: "unix", Err: syscall.EMFILE}
	}
	return l.Listener.Accept()
}

// TestServeOutlivesPassingAcceptErrors: running out of file descriptors for a moment does not
// end Serve (which would stop podgate): the next connection is served.
func TestServeOutlivesPassingAcceptErrors(t *testing.T) {
	dir := shortDir(t)
	up := startRawUpstream(t, dir)
	tgt := up.target()
	srv := &Server{Route: func(string) *Target { return tgt }}
	sock, served := serveRelay(t, dir, srv, func(l net.Listener) net.Listener { return &flakyListener{Listener: l} })
	cl := dialRelay(t, sock)
	cl.headers(1, true, grpcRequest("/svc/M")...)
	upc := up.accept()
	upc.headers(upc.readUntil(isHeaders).Header().StreamID, true, ":status", "200", "content-type", "application/grpc", "grpc-status", "0")
	if h := cl.readUntil(isHeaders); field(h, "grpc-status") != "0" {
		t.Errorf("call after the failed Accept: %v", h.(*http2.MetaHeadersFrame).Fields)
	}
	srv.Shutdown(context.Background())
	if err := <-served; err != nil {
		t.Errorf("Serve: %v", err)
	}
}

// setter is an Observer that sets metadata on every call.
type setter struct{ md metadata.MD }

func (o setter) Begin(c *Call) any {
	c.SetMetadata(o.md)
	return nil
}

func (setter) End(any, codes.Code) {}

// TestObserverSetsMetadata: what the observer sets reaches the server in place of the client's
// fields of the same names (tracing's trace context of podgate's span), binary values in
// base64 and every value of a key, the rest as the client sent it.
func TestObserverSetsMetadata(t *testing.T) {
	dir := shortDir(t)
	up := startRawUpstream(t, dir)
	tgt := up.target()
	md := metadata.Pairs("traceparent", "00-podgate-01", "grpc-trace-bin", "\x00\xffspan", "baggage", "a=1", "baggage", "b=2")
	sock := startRelay(t, dir, &Server{Route: func(string) *Target { return tgt }, Observer: setter{md}})
	cl := dialRelay(t, sock)
	cl.headers(1, true, append(grpcRequest("/svc/M"), "traceparent", "00-kubelet-01", "grpc-trace-bin", "a3ViZWxldA", "x-caller", "kubelet")...)
	h := up.accept().readUntil(isHeaders).(*http2.MetaHeadersFrame)
	got := map[string][]string{}
	for _, f := range h.Fields {
		got[f.Name] = append(got[f.Name], f.Value)
	}
	want := map[string][]string{
		"traceparent":    {"00-podgate-01"},
		"grpc-trace-bin": {base64.RawStdEncoding.EncodeToString([]byte("\x00\xffspan"))},
		"baggage":        {"a=1", "b=2"},
		"x-caller":       {"kubelet"},
		":path":          {"/svc/M"},
	}
	for k, v := range want {
		if !slices.Equal(got[k], v) {
			t.Errorf("the server got %s %q, want %q (all: %v)", k, got[k], v, h.Fields)
		}
	}
}

// ownQueue runs f on the queue of the client's stream id toward the client, as the owner of
// the client's sender (the queues are the owner's alone): it waits for the token, takes what
// was put, and lets the token go after f.
func ownQueue(t *testing.T, srv *Server, id uint32, f func(q *queue)) {
	t.Helper()
	var st *sendStream
	srv.mu.Lock()
	for ss := range srv.sessions {
		ss.mu.Lock()
		if s := ss.streams[id]; s != nil {
			st = s.ans.to
		}
		ss.mu.Unlock()
	}
	srv.mu.Unlock()
	if st == nil {
		t.Fatalf("no stream %d", id)
	}
	for !st.out.busy.CompareAndSwap(false, true) {
		runtime.Gosched()
	}
	st.out.apply()
	f(&st.q)
	st.out.busy.Store(false)
	st.out.kick()
}
