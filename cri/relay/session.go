package relay

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"sync"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// session is one client connection and the upstream connections its calls go to. Lock order:
// mu, then an endpoint's wmu; never mu while holding a wmu.
type session struct {
	srv  *Server
	ctx  context.Context
	down *endpoint

	mu        sync.Mutex
	streams   map[uint32]*stream     // by the client's stream id
	ups       map[*Target]*upstream  // the connection new calls to a target take
	upConns   map[*upstream]struct{} // every upstream connection still open
	resets    [32]uint32             // the client streams podgate reset last: their frames are ignored
	nreset    int
	started   bool   // the session's SETTINGS went out
	lastID    uint32 // the client's highest stream id so far
	closed    bool
	draining  bool // Shutdown: no new calls; the connection closes when the last one ends
	upReaders sync.WaitGroup
}

// upstream is one connection to a Target.
type upstream struct {
	target  *Target
	ep      *endpoint
	nextID  uint32
	streams map[uint32]*stream // by upstream stream id
	// gone is set when the connection takes no new calls (GOAWAY, or it ended).
	gone bool
	// maxStreams is the server's SETTINGS_MAX_CONCURRENT_STREAMS, 0 while it set none.
	maxStreams uint32
}

// half is one direction of a stream: what src sends, on its way to dst.
type half struct {
	send    int64 // dst's window for this stream
	recv    int64 // what src may still send on this stream
	unacked int64 // passed on to dst, not yet given back to src
	pend    []item
	pendLen int64
	done    bool // src ended its side (END_STREAM received)
	sentEnd bool // that end went out to dst
}

// item is a frame waiting for dst's window: data, or a header block.
type item struct {
	data    []byte
	headers []hpack.HeaderField
	end     bool
}

type stream struct {
	path         string
	downID, upID uint32
	up           *upstream
	toUp, toDown half
	token        any
	code         codes.Code
	headersSent  bool // the client has the response headers
	local        bool // answered by the relay itself; the client's data is dropped
	// dropUp: the server ended the call and wants no more of the client's data, which is
	// dropped; the answer still goes out.
	dropUp  bool
	removed bool
}

// dir is one direction of forwarding: from src to dst.
type dir struct {
	src, dst *endpoint
	toUp     bool
}

func (d dir) half(s *stream) *half {
	if d.toUp {
		return &s.toUp
	}
	return &s.toDown
}

func (d dir) dstID(s *stream) uint32 {
	if d.toUp {
		return s.upID
	}
	return s.downID
}

func (d dir) srcID(s *stream) uint32 {
	if d.toUp {
		return s.downID
	}
	return s.upID
}

// connError ends a connection with a GOAWAY.
type connError struct {
	code   http2.ErrCode
	reason string
}

func (e connError) Error() string { return fmt.Sprintf("HTTP/2 %v: %s", e.code, e.reason) }

// readClient reads the client's frames until its connection ends.
func (ss *session) readClient() error {
	for {
		f, err := ss.down.fr.ReadFrame()
		var se http2.StreamError
		switch {
		case errors.As(err, &se):
			ss.reset(ss.streamByDown(se.StreamID), se.Code, true)
			ss.rstClient(se.StreamID, se.Code)
		case err != nil:
			if code, ok := goAwayCode(err); ok {
				ss.down.goAway(ss.lastIDLocked(), code)
			}
			return err
		default:
			if err := ss.clientFrame(f); err != nil {
				if code, ok := goAwayCode(err); ok {
					ss.down.goAway(ss.lastIDLocked(), code)
				}
				return err
			}
		}
		if !ss.down.frameBuffered() {
			ss.flushAll()
			ss.closeIfDrained()
		}
	}
}

// goAwayCode is the GOAWAY code a failure to read a peer's frames ends its connection with:
// none when the connection itself broke.
func goAwayCode(err error) (http2.ErrCode, bool) {
	var ce http2.ConnectionError
	var own connError
	switch {
	case errors.As(err, &own):
		return own.code, true
	case errors.As(err, &ce):
		return http2.ErrCode(ce), true
	case errors.Is(err, http2.ErrFrameTooLarge):
		return http2.ErrCodeFrameSize, true
	}
	return 0, false
}

// rstClient resets the client's stream id and remembers it, so that the frames the client
// sent before it learnt of the reset are ignored, as HTTP/2 wants.
func (ss *session) rstClient(id uint32, code http2.ErrCode) {
	ss.mu.Lock()
	ss.resets[ss.nreset%len(ss.resets)] = id
	ss.nreset++
	ss.mu.Unlock()
	ss.down.writeRST(id, code)
}

// wasReset says whether podgate reset the client's stream id lately. mu is held.
func (ss *session) wasReset(id uint32) bool {
	for _, r := range ss.resets {
		if r == id {
			return true
		}
	}
	return false
}

func (ss *session) lastIDLocked() uint32 {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return ss.lastID
}

func (ss *session) streamByDown(id uint32) *stream {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return ss.streams[id]
}

// flushAll writes what is buffered for every connection of the session: frames that arrived
// together leave together, in one write.
func (ss *session) flushAll() {
	var buf [4]*endpoint
	ss.mu.Lock()
	eps := append(buf[:0], ss.down)
	for u := range ss.upConns {
		eps = append(eps, u.ep)
	}
	ss.mu.Unlock()
	for _, e := range eps {
		ss.flush(e)
	}
}

// flush writes e's queued WINDOW_UPDATEs and everything buffered.
func (ss *session) flush(e *endpoint) {
	ss.mu.Lock()
	updates := e.updates
	e.updates = nil
	e.wmu.Lock()
	ss.mu.Unlock()
	defer e.wmu.Unlock()
	for _, u := range updates {
		if e.fr.WriteWindowUpdate(u.id, u.inc) != nil {
			return
		}
	}
	if e.bw.Buffered() > 0 {
		_ = e.bw.Flush() // a broken connection shows in its reader
	}
}

func (ss *session) clientFrame(f http2.Frame) error {
	switch f := f.(type) {
	case *http2.MetaHeadersFrame:
		return ss.clientHeaders(f)
	case *http2.DataFrame:
		ss.mu.Lock()
		s := ss.streams[f.StreamID]
		d := dir{src: ss.down, toUp: true}
		if s != nil && s.up != nil {
			d.dst = s.up.ep
		}
		return ss.dataLocked(d, s, f)
	case *http2.SettingsFrame:
		return ss.settings(ss.down, nil, f)
	case *http2.WindowUpdateFrame:
		return ss.windowUpdate(ss.down, nil, f)
	case *http2.PingFrame:
		ss.down.pong(f)
	case *http2.RSTStreamFrame:
		ss.reset(ss.streamByDown(f.StreamID), f.ErrCode, true)
	case *http2.PushPromiseFrame:
		return connError{http2.ErrCodeProtocol, "a client sent PUSH_PROMISE"}
	}
	// GOAWAY: the client opens no more streams and closes the connection when it is done.
	// PRIORITY and frames of unknown types are ignored, as HTTP/2 says.
	return nil
}

// clientHeaders starts a call, or forwards the client's trailers.
func (ss *session) clientHeaders(f *http2.MetaHeadersFrame) error {
	id := f.StreamID
	ss.mu.Lock()
	if s := ss.streams[id]; s != nil {
		// Trailers of a client stream: they end it.
		if !f.StreamEnded() || s.toUp.done {
			ss.mu.Unlock()
			ss.resetAndTell(s, http2.ErrCodeProtocol, true)
			return nil
		}
		s.toUp.done = true
		if s.local || s.dropUp {
			s.toUp.sentEnd = true
			ss.endLocked(s)
			return nil
		}
		return ss.sendLocked(dir{src: ss.down, dst: s.up.ep, toUp: true}, s, item{headers: f.Fields, end: true})
	}
	if id%2 == 1 && id <= ss.lastID && ss.wasReset(id) {
		// Trailers the client sent before it learnt of podgate's reset.
		ss.mu.Unlock()
		return nil
	}
	if id%2 == 0 || id <= ss.lastID {
		ss.mu.Unlock()
		return connError{http2.ErrCodeProtocol, fmt.Sprintf("stream %d is not a new client stream", id)}
	}
	ss.lastID = id
	full := len(ss.streams) >= maxStreams || ss.draining
	ss.mu.Unlock()
	if full {
		ss.rstClient(id, http2.ErrCodeRefusedStream)
		return nil
	}
	path := f.PseudoValue("path")
	if f.PseudoValue("method") != "POST" || path == "" || f.Truncated {
		ss.rstClient(id, http2.ErrCodeProtocol)
		return nil
	}

	s := &stream{downID: id, path: path}
	s.toUp.recv, s.toDown.recv = streamWindow, streamWindow
	s.toUp.done = f.StreamEnded()
	target := ss.srv.Route(path)
	if ss.srv.Observer != nil {
		s.token = ss.srv.Observer.Begin(Call{Path: path, Target: target})
	}
	if target == nil {
		ss.answerLocal(s, codes.Unimplemented, "unknown method "+path)
		return nil
	}
	if target.Unavailable != nil {
		if err := target.Unavailable(); err != nil {
			ss.answerLocal(s, codes.Unavailable, status.Convert(err).Message())
			return nil
		}
	}
	up, err := ss.upstreamFor(target)
	if err != nil {
		ss.answerLocal(s, codes.Unavailable, status.Convert(err).Message())
		return nil
	}
	ss.mu.Lock()
	if ss.closed {
		ss.mu.Unlock()
		ss.observeEnd(s)
		return errors.New("session closed")
	}
	if up.maxStreams > 0 && uint32(len(up.streams)) >= up.maxStreams {
		ss.mu.Unlock()
		ss.answerLocal(s, codes.Unavailable, fmt.Sprintf("%s allows %d calls at once on a connection", target.Name, up.maxStreams))
		return nil
	}
	if ss.draining && ss.srv.LongLived != nil && ss.srv.LongLived(path) {
		// Shutdown began while the call was routed: it ends as drain ends the others.
		ss.mu.Unlock()
		ss.answerLocal(s, codes.Unavailable, ss.srv.ShutdownMessage)
		return nil
	}
	s.up = up
	s.upID = up.nextID
	up.nextID += 2
	s.toUp.send = up.ep.peerInitWindow
	s.toDown.send = ss.down.peerInitWindow
	s.toUp.sentEnd = s.toUp.done
	ss.streams[id] = s
	up.streams[s.upID] = s
	up.ep.wmu.Lock()
	maxFrame := up.ep.peerMaxFrame
	ss.mu.Unlock()
	err = up.ep.writeHeaders(s.upID, f.Fields, s.toUp.done, maxFrame)
	up.ep.wmu.Unlock()
	if err != nil {
		ss.upstreamFailed(up, err)
	}
	return nil
}

// answerLocal answers a call with a gRPC status and no message; what the client still sends
// on it is dropped.
func (ss *session) answerLocal(s *stream, code codes.Code, msg string) {
	s.local, s.code, s.headersSent = true, code, true
	s.toDown.done, s.toDown.sentEnd = true, true
	s.toUp.sentEnd = s.toUp.done
	ss.mu.Lock()
	ended := s.toUp.done
	if ended {
		s.removed = true
	} else {
		ss.streams[s.downID] = s
	}
	ss.down.wmu.Lock()
	maxFrame := ss.down.peerMaxFrame
	ss.mu.Unlock()
	_ = ss.down.writeHeaders(s.downID, grpcStatus(code, msg, true), true, maxFrame) // a broken connection shows in its reader
	ss.down.wmu.Unlock()
	if ended {
		ss.observeEnd(s)
	}
}

// upstreamFor returns the session's connection to t, connecting when there is none.
func (ss *session) upstreamFor(t *Target) (*upstream, error) {
	ss.mu.Lock()
	if u := ss.ups[t]; u != nil {
		ss.mu.Unlock()
		return u, nil
	}
	ss.mu.Unlock()
	c, err := t.Dial(ss.ctx)
	if err != nil {
		return nil, err
	}
	br := bufio.NewReaderSize(c, readBuffer)
	u := &upstream{target: t, ep: newEndpoint(c, br), nextID: 1, streams: map[uint32]*stream{}}
	u.ep.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	u.ep.fr.MaxHeaderListSize = maxHeaderList
	u.ep.wmu.Lock()
	_, err = u.ep.bw.WriteString(http2.ClientPreface)
	if err == nil {
		err = u.ep.writeSettingsLocked(
			http2.Setting{ID: http2.SettingEnablePush, Val: 0},
			http2.Setting{ID: http2.SettingInitialWindowSize, Val: streamWindow},
			http2.Setting{ID: http2.SettingMaxHeaderListSize, Val: maxHeaderList},
		)
	}
	u.ep.wmu.Unlock()
	if err != nil {
		_ = c.Close()
		return nil, fmt.Errorf("connect to %s: %w", t.Name, err)
	}
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.closed {
		_ = c.Close()
		return nil, errors.New("client connection ended")
	}
	ss.ups[t] = u
	ss.upConns[u] = struct{}{}
	ss.upReaders.Add(1)
	go ss.readUpstream(u)
	return u, nil
}

// readUpstream reads an upstream connection's frames until it ends.
func (ss *session) readUpstream(u *upstream) {
	defer ss.upReaders.Done()
	for {
		f, err := u.ep.fr.ReadFrame()
		var se http2.StreamError
		switch {
		case errors.As(err, &se):
			ss.mu.Lock()
			s := u.streams[se.StreamID]
			ss.mu.Unlock()
			ss.resetAndTell(s, se.Code, false)
			u.ep.writeRST(se.StreamID, se.Code)
		case err == nil:
			err = ss.upstreamFrame(u, f)
		}
		if err != nil && se.StreamID == 0 {
			if code, ok := goAwayCode(err); ok {
				u.ep.goAway(0, code)
			}
			ss.upstreamFailed(u, err)
			ss.flushAll() // the calls' ends, to the client
			return
		}
		if !u.ep.frameBuffered() {
			ss.flushAll()
			ss.closeIfDrained()
		}
	}
}

func (ss *session) upstreamFrame(u *upstream, f http2.Frame) error {
	d := dir{src: u.ep, dst: ss.down}
	switch f := f.(type) {
	case *http2.MetaHeadersFrame:
		ss.mu.Lock()
		s := u.streams[f.StreamID]
		if s == nil || s.toDown.done {
			ss.mu.Unlock()
			return nil
		}
		end := f.StreamEnded()
		if s.headersSent && !end {
			ss.mu.Unlock()
			ss.resetAndTell(s, http2.ErrCodeProtocol, false)
			return nil
		}
		s.headersSent = true
		if v := headerValue(f.Fields, "grpc-status"); v != "" {
			if n, err := strconv.ParseUint(v, 10, 32); err == nil {
				s.code = codes.Code(n)
			}
		}
		s.toDown.done = end
		return ss.sendLocked(d, s, item{headers: f.Fields, end: end})
	case *http2.DataFrame:
		ss.mu.Lock()
		s := u.streams[f.StreamID]
		return ss.dataLocked(d, s, f)
	case *http2.SettingsFrame:
		return ss.settings(u.ep, u, f)
	case *http2.WindowUpdateFrame:
		return ss.windowUpdate(u.ep, u, f)
	case *http2.PingFrame:
		u.ep.pong(f)
	case *http2.RSTStreamFrame:
		ss.mu.Lock()
		s := u.streams[f.StreamID]
		if s != nil && s.toDown.done {
			// The server answered whole and wants no more of the request (grpc-go resets
			// with NO_ERROR when a handler returns before the client's end): the answer
			// goes out as it came.
			ss.stopUpLocked(s)
			ss.endLocked(s)
			return nil
		}
		ss.mu.Unlock()
		ss.resetAndTell(s, f.ErrCode, false)
	case *http2.GoAwayFrame:
		ss.upstreamGoAway(u, f.LastStreamID)
	case *http2.PushPromiseFrame:
		return connError{http2.ErrCodeProtocol, "PUSH_PROMISE after SETTINGS_ENABLE_PUSH=0"}
	}
	return nil
}

// dataLocked handles a DATA frame from d.src on s (nil when the stream is unknown or gone);
// called with mu held, it releases it.
func (ss *session) dataLocked(d dir, s *stream, f *http2.DataFrame) error {
	n := int64(f.Header().Length)
	payload := f.Data()
	d.src.recvWindow -= n
	if d.src.recvWindow < 0 {
		ss.mu.Unlock()
		return connError{http2.ErrCodeFlowControl, "sent more than the connection's window"}
	}
	if s == nil || s.removed {
		// A stream that ended (or was reset): the bytes go back to the connection's window.
		ss.credit(d, nil, n)
		ss.mu.Unlock()
		return nil
	}
	h := d.half(s)
	h.recv -= n
	if h.recv < 0 || h.done {
		ss.credit(d, nil, n)
		ss.mu.Unlock()
		ss.resetAndTell(s, http2.ErrCodeFlowControl, d.toUp)
		return nil
	}
	// Padding is not passed on: it goes back at once.
	ss.credit(d, s, n-int64(len(payload)))
	h.done = f.StreamEnded()
	if len(payload) == 0 && !h.done {
		// Nothing to pass on.
		ss.mu.Unlock()
		return nil
	}
	if s.local || (d.toUp && s.dropUp) {
		ss.credit(d, s, int64(len(payload)))
		if h.done {
			h.sentEnd = true
			ss.endLocked(s)
			return nil
		}
		ss.mu.Unlock()
		return nil
	}
	return ss.sendLocked(d, s, item{data: payload, end: h.done})
}

// sendLocked sends it to d.dst as far as the windows allow and queues the rest (copied: the
// framer reuses its buffers). Called with mu held, it releases it.
func (ss *session) sendLocked(d dir, s *stream, it item) error {
	h := d.half(s)
	if len(h.pend) == 0 {
		n := int64(len(it.data))
		if it.headers != nil || (n <= h.send && n <= d.dst.sendWindow) {
			// The usual case: all of it goes now, from the framer's buffer.
			if it.headers == nil {
				h.send -= n
				d.dst.sendWindow -= n
				ss.credit(d, s, n)
			}
			one := [1]item{it}
			return ss.writeLocked(d, s, one[:])
		}
	}
	// Queued bytes join the queued bytes before them: a stream's queue holds at most its
	// window's bytes in one buffer, and a header block or two, whatever frames they came in.
	if last := len(h.pend) - 1; it.headers == nil && last >= 0 && h.pend[last].headers == nil && !h.pend[last].end {
		h.pend[last].data = append(h.pend[last].data, it.data...)
		h.pend[last].end = it.end
	} else {
		h.pend = append(h.pend, cloneItem(it))
	}
	h.pendLen += int64(len(it.data))
	return ss.writeLocked(d, s, ss.takeLocked(d, s))
}

// takeLocked takes from s's queue toward d.dst what the windows allow. mu is held.
func (ss *session) takeLocked(d dir, s *stream) []item {
	h := d.half(s)
	var out []item
	take := func(n int64) {
		h.send -= n
		d.dst.sendWindow -= n
		h.pendLen -= n
		ss.credit(d, s, n)
	}
	for len(h.pend) > 0 {
		it := h.pend[0]
		if it.headers != nil {
			out = append(out, it)
			h.pend = h.pend[1:]
			continue
		}
		n := min(int64(len(it.data)), max(min(h.send, d.dst.sendWindow), 0))
		// Queued bytes were joined: they leave in frames the peer takes.
		for n > int64(d.dst.peerMaxFrame) {
			out = append(out, item{data: it.data[:d.dst.peerMaxFrame]})
			take(int64(d.dst.peerMaxFrame))
			it.data = it.data[d.dst.peerMaxFrame:]
			n -= int64(d.dst.peerMaxFrame)
		}
		if n < int64(len(it.data)) {
			if n > 0 {
				out = append(out, item{data: it.data[:n]})
				take(n)
			}
			h.pend[0] = item{data: it.data[n:], end: it.end}
			break
		}
		out = append(out, it)
		h.pend = h.pend[1:]
		take(n)
	}
	if len(h.pend) == 0 {
		h.pend = nil
	}
	return out
}

// writeLocked writes out to d.dst. Called with mu held, it takes dst's write lock before it
// lets mu go, so that frames leave in the order their windows were counted.
func (ss *session) writeLocked(d dir, s *stream, out []item) error {
	if len(out) == 0 {
		ss.mu.Unlock()
		return nil
	}
	h := d.half(s)
	for _, it := range out {
		if it.end {
			h.sentEnd = true
		}
	}
	ended := ss.removeIfDone(s)
	id := d.dstID(s)
	d.dst.wmu.Lock()
	maxFrame := d.dst.peerMaxFrame
	ss.mu.Unlock()
	var err error
	for _, it := range out {
		if it.headers != nil {
			err = d.dst.writeHeaders(id, it.headers, it.end, maxFrame)
		} else {
			err = d.dst.fr.WriteData(id, it.end, it.data)
		}
		if err != nil {
			break
		}
	}
	d.dst.wmu.Unlock()
	if ended {
		ss.observeEnd(s)
	}
	if err != nil && d.toUp {
		ss.upstreamFailed(s.up, err)
	}
	// A client that cannot be written to shows in the client's reader, which ends the session.
	return nil
}

// credit gives n bytes back to d.src's windows: the connection's, and s's stream's when s is
// set and src may still send on it, once enough have been passed on to be worth a
// WINDOW_UPDATE (written at the next flush). mu is held.
func (ss *session) credit(d dir, s *stream, n int64) {
	if n <= 0 {
		return
	}
	src := d.src
	src.recvUnacked += n
	if src.recvUnacked >= connWindow/4 {
		src.updates = append(src.updates, windowUpdate{0, uint32(src.recvUnacked)})
		src.recvWindow += src.recvUnacked
		src.recvUnacked = 0
	}
	if s == nil {
		return
	}
	h := d.half(s)
	if h.done {
		return
	}
	h.unacked += n
	if h.unacked >= streamWindow/4 {
		src.updates = append(src.updates, windowUpdate{d.srcID(s), uint32(h.unacked)})
		h.recv += h.unacked
		h.unacked = 0
	}
}

// removeIfDone forgets s once both its directions have ended; it says whether it did. mu is
// held.
func (ss *session) removeIfDone(s *stream) bool {
	if s.removed || !s.toUp.sentEnd || !s.toDown.sentEnd {
		return false
	}
	ss.removeLocked(s)
	return true
}

// endLocked is removeIfDone followed by the observer's End; called with mu held, it releases
// it.
func (ss *session) endLocked(s *stream) {
	ended := ss.removeIfDone(s)
	ss.mu.Unlock()
	if ended {
		ss.observeEnd(s)
	}
}

// removeLocked forgets s; what it still held in its queues goes back to the connections'
// windows. mu is held.
func (ss *session) removeLocked(s *stream) {
	s.removed = true
	if ss.streams[s.downID] == s {
		delete(ss.streams, s.downID)
	}
	if s.up == nil {
		return
	}
	if s.up.streams[s.upID] == s {
		delete(s.up.streams, s.upID)
	}
	ss.credit(dir{src: ss.down}, nil, s.toUp.pendLen)
	ss.credit(dir{src: s.up.ep}, nil, s.toDown.pendLen)
	s.toUp.pend, s.toDown.pend = nil, nil
	if s.up.gone && len(s.up.streams) == 0 {
		ss.closeUpstreamLocked(s.up)
	}
}

func (ss *session) observeEnd(s *stream) {
	if ss.srv.Observer != nil {
		ss.srv.Observer.End(s.token, s.code)
	}
}

// reset ends s after a RST_STREAM from one side and passes it on to the other.
func (ss *session) reset(s *stream, code http2.ErrCode, fromClient bool) {
	if s == nil {
		return
	}
	ss.mu.Lock()
	if s.removed {
		ss.mu.Unlock()
		return
	}
	if !s.toDown.done {
		s.code = resetCode(code)
	}
	ss.removeLocked(s)
	up := s.up
	ss.mu.Unlock()
	switch {
	case !fromClient:
		ss.rstClient(s.downID, code)
	case up != nil:
		up.ep.writeRST(s.upID, code)
	}
	ss.observeEnd(s)
}

// resetAndTell resets s on both sides after an error found in what one side sent.
func (ss *session) resetAndTell(s *stream, code http2.ErrCode, fromClient bool) {
	if s == nil {
		return
	}
	ss.mu.Lock()
	if s.removed {
		ss.mu.Unlock()
		return
	}
	if !s.toDown.done {
		s.code = resetCode(code)
	}
	ss.removeLocked(s)
	up := s.up
	ss.mu.Unlock()
	ss.rstClient(s.downID, code)
	if up != nil {
		up.ep.writeRST(s.upID, http2.ErrCodeCancel)
	}
	ss.observeEnd(s)
}

// resetCode is the gRPC code a client sees for a stream reset with code.
func resetCode(code http2.ErrCode) codes.Code {
	switch code {
	case http2.ErrCodeCancel:
		return codes.Canceled
	case http2.ErrCodeRefusedStream:
		return codes.Unavailable
	case http2.ErrCodeEnhanceYourCalm:
		return codes.ResourceExhausted
	}
	return codes.Internal
}

// upstreamFailed ends u: its calls end with Unavailable, and the client's next call connects
// anew.
func (ss *session) upstreamFailed(u *upstream, err error) {
	ss.mu.Lock()
	if ss.ups[u.target] == u {
		delete(ss.ups, u.target)
	}
	u.gone = true
	var ended, answered []*stream
	for _, s := range u.streams {
		if s.toDown.done {
			// Its whole answer came: it still goes out, as far as the client reads.
			answered = append(answered, s)
		} else {
			ended = append(ended, s)
		}
	}
	for _, s := range answered {
		ss.stopUpLocked(s)
		if ss.removeIfDone(s) {
			defer ss.observeEnd(s)
		}
	}
	ss.closeUpstreamLocked(u)
	ss.mu.Unlock()
	msg := fmt.Sprintf("connection to %s ended: %v", u.target.Name, err)
	for _, s := range ended {
		ss.failStream(s, codes.Unavailable, msg)
	}
}

// failStream ends s toward the client with a gRPC status, dropping what it still held.
func (ss *session) failStream(s *stream, code codes.Code, msg string) {
	ss.mu.Lock()
	if s.removed {
		ss.mu.Unlock()
		return
	}
	trailersOnly := !s.headersSent
	answered := s.toDown.sentEnd
	s.code = code
	ss.removeLocked(s)
	if answered {
		ss.mu.Unlock()
		ss.observeEnd(s)
		return
	}
	ss.down.wmu.Lock()
	maxFrame := ss.down.peerMaxFrame
	ss.mu.Unlock()
	_ = ss.down.writeHeaders(s.downID, grpcStatus(code, msg, trailersOnly), true, maxFrame)
	ss.down.wmu.Unlock()
	ss.observeEnd(s)
}

// upstreamGoAway takes u out of use; its calls the server did not take are refused to the
// client, whose gRPC library retries them (on a new connection).
func (ss *session) upstreamGoAway(u *upstream, last uint32) {
	ss.mu.Lock()
	if ss.ups[u.target] == u {
		delete(ss.ups, u.target)
	}
	u.gone = true
	var refused []*stream
	for id, s := range u.streams {
		if id > last {
			refused = append(refused, s)
		}
	}
	ss.mu.Unlock()
	// reset removes them; the connection closes with the last of its other calls
	// (removeLocked), or now when it has none.
	for _, s := range refused {
		ss.reset(s, http2.ErrCodeRefusedStream, false)
	}
	ss.mu.Lock()
	if len(u.streams) == 0 {
		ss.closeUpstreamLocked(u)
	}
	ss.mu.Unlock()
}

// closeUpstreamLocked closes u's connection and forgets it. mu is held.
func (ss *session) closeUpstreamLocked(u *upstream) {
	u.gone = true
	if ss.ups[u.target] == u {
		delete(ss.ups, u.target)
	}
	delete(ss.upConns, u)
	_ = u.ep.conn.Close()
}

// stopUpLocked stops passing the client's data to the server, which has answered and wants no
// more: what waits is dropped, what comes is dropped. mu is held.
func (ss *session) stopUpLocked(s *stream) {
	s.dropUp = true
	if s.up != nil {
		ss.credit(dir{src: ss.down}, nil, s.toUp.pendLen)
		if s.up.streams[s.upID] == s {
			delete(s.up.streams, s.upID)
		}
	}
	s.toUp.pend, s.toUp.pendLen = nil, 0
	s.toUp.sentEnd = true
}

// settings applies a peer's SETTINGS. u is the upstream e belongs to, nil for the client.
func (ss *session) settings(e *endpoint, u *upstream, f *http2.SettingsFrame) error {
	if f.IsAck() {
		return nil
	}
	var grow bool
	err := f.ForeachSetting(func(st http2.Setting) error {
		if err := st.Valid(); err != nil {
			code := http2.ErrCodeProtocol
			var ce http2.ConnectionError
			if errors.As(err, &ce) {
				code = http2.ErrCode(ce)
			}
			return connError{code, fmt.Sprintf("setting %v: %v", st, err)}
		}
		switch st.ID {
		case http2.SettingInitialWindowSize:
			ss.mu.Lock()
			delta := int64(st.Val) - e.peerInitWindow
			e.peerInitWindow = int64(st.Val)
			for _, s := range ss.streamsToward(e, u) {
				h := ss.halfToward(s, u)
				h.send += delta
				if h.send > math.MaxInt32 {
					ss.mu.Unlock()
					return connError{http2.ErrCodeFlowControl, "window above 2^31-1"}
				}
			}
			ss.mu.Unlock()
			grow = grow || delta > 0
		case http2.SettingMaxConcurrentStreams:
			if u != nil {
				ss.mu.Lock()
				u.maxStreams = st.Val
				ss.mu.Unlock()
			}
		case http2.SettingMaxFrameSize:
			ss.mu.Lock()
			e.peerMaxFrame = st.Val
			ss.mu.Unlock()
		case http2.SettingHeaderTableSize:
			e.wmu.Lock()
			e.henc.SetMaxDynamicTableSize(st.Val)
			e.wmu.Unlock()
		}
		return nil
	})
	if err != nil {
		return err
	}
	e.wmu.Lock()
	err = e.fr.WriteSettingsAck()
	e.wmu.Unlock()
	if err != nil {
		return err
	}
	if grow {
		ss.sendPending(e, u, 0)
	}
	return nil
}

// windowUpdate applies a peer's WINDOW_UPDATE and sends what waited for it.
func (ss *session) windowUpdate(e *endpoint, u *upstream, f *http2.WindowUpdateFrame) error {
	ss.mu.Lock()
	if f.StreamID == 0 {
		e.sendWindow += int64(f.Increment)
		if e.sendWindow > math.MaxInt32 {
			ss.mu.Unlock()
			return connError{http2.ErrCodeFlowControl, "connection window above 2^31-1"}
		}
		ss.mu.Unlock()
		ss.sendPending(e, u, 0)
		return nil
	}
	s := ss.streams[f.StreamID]
	if u != nil {
		s = u.streams[f.StreamID]
	}
	if s == nil {
		ss.mu.Unlock()
		return nil
	}
	h := ss.halfToward(s, u)
	h.send += int64(f.Increment)
	if h.send > math.MaxInt32 {
		ss.mu.Unlock()
		ss.resetAndTell(s, http2.ErrCodeFlowControl, u == nil)
		return nil
	}
	ss.mu.Unlock()
	ss.sendPending(e, u, f.StreamID)
	return nil
}

// sendPending sends what waits for e's windows: on the stream id (e's own id), or on every
// stream when id is 0.
func (ss *session) sendPending(e *endpoint, u *upstream, id uint32) {
	ss.mu.Lock()
	var ids []*stream
	if id != 0 {
		if s := ss.lookupToward(u, id); s != nil {
			ids = append(ids, s)
		}
	} else {
		ids = ss.streamsToward(e, u)
	}
	ss.mu.Unlock()
	for _, s := range ids {
		ss.mu.Lock()
		if s.removed {
			ss.mu.Unlock()
			continue
		}
		d := dir{dst: e, toUp: u != nil}
		if u != nil {
			d.src = ss.down
		} else if s.up != nil {
			d.src = s.up.ep
		} else {
			ss.mu.Unlock()
			continue
		}
		out := ss.takeLocked(d, s)
		_ = ss.writeLocked(d, s, out) // a broken connection shows in its reader
	}
}

func (ss *session) lookupToward(u *upstream, id uint32) *stream {
	if u != nil {
		return u.streams[id]
	}
	return ss.streams[id]
}

// streamsToward lists the streams whose data goes to e (the client when u is nil). mu is held.
func (ss *session) streamsToward(e *endpoint, u *upstream) []*stream {
	m := ss.streams
	if u != nil {
		m = u.streams
	}
	out := make([]*stream, 0, len(m))
	for _, s := range m {
		out = append(out, s)
	}
	return out
}

func (ss *session) halfToward(s *stream, u *upstream) *half {
	if u != nil {
		return &s.toUp
	}
	return &s.toDown
}

// drain starts the session's end for Shutdown: the client is told to open no more calls, the
// long-lived ones end with Unavailable, and the connection closes once the last call ended.
func (ss *session) drain() {
	ss.mu.Lock()
	ss.draining = true
	if !ss.started {
		// Not past the preface yet: there is nothing to tell it.
		ss.mu.Unlock()
		_ = ss.down.conn.Close()
		return
	}
	last := ss.lastID
	var long []*stream
	for _, s := range ss.streams {
		if ss.srv.LongLived != nil && ss.srv.LongLived(s.path) {
			long = append(long, s)
		}
	}
	ss.mu.Unlock()
	ss.down.goAway(last, http2.ErrCodeNo)
	for _, s := range long {
		ss.failStream(s, codes.Unavailable, ss.srv.ShutdownMessage)
		if s.up != nil {
			s.up.ep.writeRST(s.upID, http2.ErrCodeCancel)
		}
	}
	ss.flushAll()
	ss.closeIfDrained()
}

// closeIfDrained closes the client's connection once a draining session has no call left; its
// reader then ends the session. Called after a flush, so the last answers are out.
func (ss *session) closeIfDrained() {
	ss.mu.Lock()
	done := ss.draining && len(ss.streams) == 0
	ss.mu.Unlock()
	if done {
		_ = ss.down.conn.Close()
	}
}

// close ends the session: every upstream connection closes, and the calls still open end.
func (ss *session) close() {
	_ = ss.down.conn.Close()
	ss.mu.Lock()
	ss.closed = true
	var open []*stream
	for _, s := range ss.streams {
		open = append(open, s)
		s.code = codes.Canceled
		ss.removeLocked(s)
	}
	for u := range ss.upConns {
		ss.closeUpstreamLocked(u)
	}
	ss.mu.Unlock()
	ss.upReaders.Wait()
	for _, s := range open {
		ss.observeEnd(s)
	}
}

func headerValue(fields []hpack.HeaderField, name string) string {
	for _, f := range fields {
		if f.Name == name {
			return f.Value
		}
	}
	return ""
}

func cloneItem(it item) item {
	if it.data != nil {
		it.data = append([]byte(nil), it.data...)
	}
	if it.headers != nil {
		it.headers = append([]hpack.HeaderField(nil), it.headers...)
	}
	return it
}
