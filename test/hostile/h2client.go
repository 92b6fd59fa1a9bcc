package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// h2conn is a raw HTTP/2 client connection that keeps to the server's flow control (so that
// it can send as much as the server lets it) and records what the server does to each stream.
type h2conn struct {
	c  net.Conn
	fr *http2.Framer
	bw *bufio.Writer

	wmu sync.Mutex

	mu        sync.Mutex
	cond      *sync.Cond
	connWin   int64
	initWin   int64
	streamWin map[uint32]int64
	ended     map[uint32]string // a stream the server reset or answered whole: how
	begun     map[uint32]bool   // a stream whose answer's headers came
	endedAt   map[uint32]time.Time
	closed    error
	goAway    bool
	// deaf, while set, holds the reader: the client stops reading its socket (deafen).
	deaf atomic.Pointer[chan struct{}]
}

func dialH2(ctx context.Context, sock string) (*h2conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", sock)
	if err != nil {
		return nil, err
	}
	h := &h2conn{c: c, bw: bufio.NewWriterSize(c, 64<<10), connWin: 65535, initWin: 65535,
		streamWin: map[uint32]int64{}, ended: map[uint32]string{}, begun: map[uint32]bool{}, endedAt: map[uint32]time.Time{}}
	h.cond = sync.NewCond(&h.mu)
	h.fr = http2.NewFramer(h.bw, bufio.NewReader(c))
	h.fr.ReadMetaHeaders = hpack.NewDecoder(65536, nil)
	h.fr.MaxHeaderListSize = 16 << 20
	if err := h.write(func() error {
		if _, err := h.bw.WriteString(http2.ClientPreface); err != nil {
			return err
		}
		return h.fr.WriteSettings()
	}); err != nil {
		_ = c.Close()
		return nil, err
	}
	go h.read()
	return h, nil
}

func (h *h2conn) write(f func() error) error {
	h.wmu.Lock()
	defer h.wmu.Unlock()
	if err := f(); err != nil {
		return err
	}
	return h.bw.Flush()
}

func (h *h2conn) read() {
	for {
		if d := h.deaf.Load(); d != nil {
			<-*d
		}
		f, err := h.fr.ReadFrame()
		if err != nil {
			h.mu.Lock()
			h.closed = err
			h.cond.Broadcast()
			h.mu.Unlock()
			return
		}
		h.frame(f)
	}
}

func (h *h2conn) frame(f http2.Frame) {
	h.mu.Lock()
	defer h.mu.Unlock()
	defer h.cond.Broadcast()
	switch f := f.(type) {
	case *http2.SettingsFrame:
		if f.IsAck() {
			return
		}
		if v, ok := f.Value(http2.SettingInitialWindowSize); ok {
			for id := range h.streamWin {
				h.streamWin[id] += int64(v) - h.initWin
			}
			h.initWin = int64(v)
		}
		go h.write(h.fr.WriteSettingsAck) //nolint:errcheck // a broken connection shows in read
	case *http2.WindowUpdateFrame:
		if f.StreamID == 0 {
			h.connWin += int64(f.Increment)
		} else if _, ok := h.streamWin[f.StreamID]; ok {
			h.streamWin[f.StreamID] += int64(f.Increment)
		}
	case *http2.PingFrame:
		if !f.IsAck() {
			data := f.Data
			go h.write(func() error { return h.fr.WritePing(true, data) }) //nolint:errcheck // as above
		}
	case *http2.RSTStreamFrame:
		h.end(f.StreamID, "RST_STREAM "+f.ErrCode.String())
	case *http2.MetaHeadersFrame:
		h.begun[f.StreamID] = true
		if f.StreamEnded() {
			st := "trailers"
			for _, hf := range f.Fields {
				if hf.Name == "grpc-status" {
					st = "grpc-status " + hf.Value
				}
			}
			h.end(f.StreamID, st)
		}
	case *http2.DataFrame:
		if f.StreamEnded() {
			h.end(f.StreamID, "END_STREAM")
		}
	case *http2.GoAwayFrame:
		h.goAway = true
	}
}

// end records how the server ended stream id. mu is held.
func (h *h2conn) end(id uint32, how string) {
	if _, ok := h.ended[id]; !ok {
		h.ended[id] = how
		h.endedAt[id] = time.Now()
	}
	delete(h.streamWin, id)
}

// open sends a header block (already encoded) that opens stream id.
func (h *h2conn) open(id uint32, block []byte, end bool) error {
	h.mu.Lock()
	h.streamWin[id] = h.initWin
	h.mu.Unlock()
	return h.write(func() error {
		n := min(len(block), 16384)
		if err := h.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: block[:n], EndHeaders: n == len(block), EndStream: end}); err != nil {
			return err
		}
		for rest := block[n:]; len(rest) > 0; {
			n = min(len(rest), 16384)
			if err := h.fr.WriteContinuation(id, n == len(rest), rest[:n]); err != nil {
				return err
			}
			rest = rest[n:]
		}
		return nil
	})
}

// send writes data on stream id within the server's windows; it stops (and says why) when the
// server ends the stream or the connection, or gives no window for stall.
func (h *h2conn) send(id uint32, data []byte, stall time.Duration) (int, error) {
	sent := 0
	for len(data) > 0 {
		n, err := h.window(id, min(len(data), 16384), stall)
		if err != nil {
			return sent, err
		}
		if err := h.write(func() error { return h.fr.WriteData(id, false, data[:n]) }); err != nil {
			return sent, err
		}
		sent += n
		data = data[n:]
	}
	return sent, nil
}

// window takes up to want bytes of window for stream id, waiting at most stall for some.
func (h *h2conn) window(id uint32, want int, stall time.Duration) (int, error) {
	timer := time.AfterFunc(stall, func() {
		h.mu.Lock()
		h.cond.Broadcast()
		h.mu.Unlock()
	})
	defer timer.Stop()
	deadline := time.Now().Add(stall)
	h.mu.Lock()
	defer h.mu.Unlock()
	for {
		switch {
		case h.closed != nil:
			return 0, fmt.Errorf("connection ended: %w", h.closed)
		case h.ended[id] != "":
			return 0, errors.New(h.ended[id])
		}
		if w := min(h.connWin, h.streamWin[id]); w > 0 {
			n := int(min(int64(want), w))
			h.connWin -= int64(n)
			h.streamWin[id] -= int64(n)
			return n, nil
		}
		if !time.Now().Before(deadline) {
			return 0, errors.New("no window")
		}
		h.cond.Wait()
	}
}

// waitEnd waits at most d for the server to end stream id and says how and when.
func (h *h2conn) waitEnd(id uint32, d time.Duration) (string, time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.waitLocked(d, func() bool { return h.ended[id] != "" || h.closed != nil })
	if h.ended[id] == "" && h.closed != nil {
		return "connection closed", time.Now()
	}
	return h.ended[id], h.endedAt[id]
}

// waitBegun waits at most d for the server to begin its answer on stream id, or to end the
// stream or the connection, and says whether it began the answer.
func (h *h2conn) waitBegun(id uint32, d time.Duration) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.waitLocked(d, func() bool { return h.begun[id] || h.ended[id] != "" || h.closed != nil })
	return h.begun[id]
}

// waitClosed waits at most d for the connection to end, and says whether it did.
func (h *h2conn) waitClosed(d time.Duration) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.waitLocked(d, func() bool { return h.closed != nil })
	return h.closed != nil
}

// waitLocked waits at most d for done, which the reader's frames make true; mu is held.
func (h *h2conn) waitLocked(d time.Duration, done func() bool) {
	timer := time.AfterFunc(d, func() {
		h.mu.Lock()
		h.cond.Broadcast()
		h.mu.Unlock()
	})
	defer timer.Stop()
	deadline := time.Now().Add(d)
	for !done() && time.Now().Before(deadline) {
		h.cond.Wait()
	}
}

// isClosed says whether the server ended the connection.
func (h *h2conn) isClosed() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.closed != nil
}

// endings counts the streams the server ended, by how.
func (h *h2conn) endings() map[string]int {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := map[string]int{}
	for _, how := range h.ended {
		out[how]++
	}
	return out
}

func (h *h2conn) close() { _ = h.c.Close() }

// deafen stops reading the socket after the frame being read; hear reads on.
func (h *h2conn) deafen() (hear func()) {
	d := make(chan struct{})
	h.deaf.Store(&d)
	return func() {
		h.deaf.Store(nil)
		close(d)
	}
}

// openWindows opens the connection's window and every stream's as wide as HTTP/2 allows: the
// server may send all it has.
func (h *h2conn) openWindows() error {
	return h.write(func() error {
		if err := h.fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1<<31 - 1}); err != nil {
			return err
		}
		return h.fr.WriteWindowUpdate(0, 1<<31-1-65535)
	})
}

// call opens stream id with a gRPC request for path whose message is empty, ended.
func (h *h2conn) call(id uint32, path string) error {
	if err := h.open(id, grpcBlock(path), false); err != nil {
		return err
	}
	return h.write(func() error { return h.fr.WriteData(id, true, make([]byte, 5)) })
}

// Header blocks, encoded by hand so that no field but the attack's enters HPACK's dynamic
// table.

// hpackInt appends i in HPACK's integer encoding with an n-bit prefix and the flags first.
func hpackInt(b []byte, first byte, n uint, i int) []byte {
	limit := 1<<n - 1
	if i < limit {
		return append(b, first|byte(i))
	}
	b = append(b, first|byte(limit))
	for i -= limit; i >= 128; i >>= 7 {
		b = append(b, byte(i%128+128))
	}
	return append(b, byte(i))
}

func hpackString(b []byte, s string) []byte {
	return append(hpackInt(b, 0, 7, len(s)), s...)
}

// literal is a field with a literal name and value, not indexed (first 0x00) or added to the
// dynamic table (0x40).
func literal(b []byte, first byte, name, value string) []byte {
	return hpackString(hpackString(append(b, first), name), value)
}

// grpcBlock is a gRPC request's header block for path, with more fields (name, value pairs).
func grpcBlock(path string, more ...string) []byte {
	b := []byte{0x83, 0x86} // :method POST, :scheme http (static table)
	b = literal(b, 0, ":path", path)
	b = literal(b, 0, ":authority", "localhost")
	b = literal(b, 0, "content-type", "application/grpc")
	b = literal(b, 0, "te", "trailers")
	for i := 0; i+1 < len(more); i += 2 {
		b = literal(b, 0, more[i], more[i+1])
	}
	return b
}
