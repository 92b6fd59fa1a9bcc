package relay

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"sync"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// endpoint is one HTTP/2 connection: the client's, or an upstream one. Only its reader
// goroutine reads frames; writes happen under wmu, from either side's reader.
type endpoint struct {
	conn net.Conn
	br   *bufio.Reader
	fr   *http2.Framer

	wmu  sync.Mutex
	bw   *pooledWriter
	henc *hpack.Encoder
	hbuf bytes.Buffer

	// Under the session's mu:
	send           window // the peer's connection-level window for what podgate sends
	peerInitWindow int64  // the peer's SETTINGS_INITIAL_WINDOW_SIZE
	peerMaxFrame   uint32 // the peer's SETTINGS_MAX_FRAME_SIZE
	// peerMaxHeaderList is the peer's SETTINGS_MAX_HEADER_LIST_SIZE, 0 while it set none.
	peerMaxHeaderList uint32
	recv              window // what the peer may still send on the connection
	updates           []windowUpdate
}

// windowUpdate is a WINDOW_UPDATE waiting for the endpoint's next flush.
type windowUpdate struct {
	id  uint32
	inc uint32
}

func newEndpoint(c net.Conn, br *bufio.Reader) *endpoint {
	e := &endpoint{conn: c, br: br, bw: &pooledWriter{w: c}}
	e.fr = http2.NewFramer(e.bw, br)
	e.fr.SetMaxReadFrameSize(maxFrame)
	e.fr.SetReuseFrames() // a DATA frame is passed on or queued (copied) before the next is read
	e.henc = hpack.NewEncoder(&e.hbuf)
	e.send = newWindow(initialWindow)
	e.peerInitWindow = initialWindow
	e.peerMaxFrame = 16384
	e.recv = newWindow(connWindow)
	return e
}

// writeSettingsLocked sends podgate's SETTINGS and opens the connection window to connWindow;
// the caller holds wmu.
func (e *endpoint) writeSettingsLocked(settings ...http2.Setting) error {
	if err := e.fr.WriteSettings(settings...); err != nil {
		return err
	}
	if err := e.fr.WriteWindowUpdate(0, connWindow-initialWindow); err != nil {
		return err
	}
	return e.bw.Flush()
}

// writeHeaders encodes fields and writes them as one header block; the caller holds wmu.
func (e *endpoint) writeHeaders(id uint32, fields []hpack.HeaderField, end bool, maxFrame uint32) error {
	e.hbuf.Reset()
	for _, f := range fields {
		if err := e.henc.WriteField(f); err != nil {
			return err
		}
	}
	block := e.hbuf.Bytes()
	first := true
	for first || len(block) > 0 {
		n := min(len(block), int(maxFrame))
		frag := block[:n]
		block = block[n:]
		if first {
			if err := e.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: frag, EndStream: end, EndHeaders: len(block) == 0}); err != nil {
				return err
			}
			first = false
			continue
		}
		if err := e.fr.WriteContinuation(id, len(block) == 0, frag); err != nil {
			return err
		}
	}
	return nil
}

// pooledWriter buffers writes in a buffer it borrows from a pool at the first write and gives
// back at Flush: an idle connection holds none.
type pooledWriter struct {
	w  io.Writer
	bw *bufio.Writer
}

var writers = sync.Pool{New: func() any { return bufio.NewWriterSize(nil, writeBuffer) }}

func (p *pooledWriter) Write(b []byte) (int, error) {
	if p.bw == nil {
		p.bw = writers.Get().(*bufio.Writer)
		p.bw.Reset(p.w)
	}
	return p.bw.Write(b)
}

func (p *pooledWriter) WriteString(s string) (int, error) {
	return p.Write([]byte(s))
}

// Buffered is how many bytes wait for Flush.
func (p *pooledWriter) Buffered() int {
	if p.bw == nil {
		return 0
	}
	return p.bw.Buffered()
}

// Flush writes what is buffered and gives the buffer back.
func (p *pooledWriter) Flush() error {
	if p.bw == nil {
		return nil
	}
	err := p.bw.Flush()
	p.bw.Reset(nil)
	writers.Put(p.bw)
	p.bw = nil
	return err
}

// writeRST writes and flushes a RST_STREAM.
func (e *endpoint) writeRST(id uint32, code http2.ErrCode) {
	e.wmu.Lock()
	defer e.wmu.Unlock()
	if e.fr.WriteRSTStream(id, code) == nil {
		_ = e.bw.Flush()
	}
}

// frameBuffered says whether the next frame is already whole in the read buffer, so that
// reading it will not block.
func (e *endpoint) frameBuffered() bool {
	n := e.br.Buffered()
	if n < 9 {
		return false
	}
	h, err := e.br.Peek(9)
	if err != nil {
		return false
	}
	length := int(h[0])<<16 | int(h[1])<<8 | int(h[2])
	return n >= 9+length
}

// pong answers a PING.
func (e *endpoint) pong(f *http2.PingFrame) {
	if f.IsAck() {
		return
	}
	e.wmu.Lock()
	defer e.wmu.Unlock()
	_ = e.fr.WritePing(true, f.Data) // flushed with the rest; a broken connection shows in its reader
}

// goAway tells the peer the connection ends, and why.
func (e *endpoint) goAway(last uint32, code http2.ErrCode) {
	e.wmu.Lock()
	defer e.wmu.Unlock()
	if e.fr.WriteGoAway(last, code, nil) == nil {
		_ = e.bw.Flush()
	}
}
