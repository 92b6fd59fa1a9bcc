package relay

// The upstream side of a session: a connection per Target, its frames, and what its end does to
// the calls on it.

import (
	"bufio"
	"errors"
	"fmt"
	"math"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

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

// lockUpstream returns the session's connection to t for a new call, with ss.mu held: the
// caller opens the call's stream on it before it lets mu go, so the stream id the call takes is
// one the connection still has, and the connection cannot end in between. HTTP/2 stream ids a
// client opens are odd and only grow, up to 2^31−1 (at 100 calls a second, about four months):
// a connection that has used its last one takes no new call and closes once its last call
// ended, and a fresh one is dialled, as grpc-go's client does. No call fails for it.
func (ss *session) lockUpstream(t *Target) (*upstream, error) {
	ss.mu.Lock()
	for {
		if u := ss.upstreamLocked(t); u != nil {
			return u, nil
		}
		ss.mu.Unlock()
		u, err := ss.dialUpstream(t)
		if err != nil {
			return nil, err
		}
		ss.mu.Lock()
		switch {
		case ss.closed:
			ss.mu.Unlock()
			u.ep.closeAfterFlush(closeGrace)
			return nil, errors.New("client connection ended")
		case ss.ups[t] != nil:
			// Another call connected meanwhile: this one goes there too.
			u.ep.closeAfterFlush(closeGrace)
			continue
		}
		ss.ups[t] = u
		ss.upConns[u] = struct{}{}
		ss.upReaders.Add(1)
		go ss.readUpstream(u)
		return u, nil
	}
}

// upstreamLocked is the connection to t new calls take, nil when there is none; one that has
// used its last stream id is retired. mu is held.
func (ss *session) upstreamLocked(t *Target) *upstream {
	u := ss.ups[t]
	if u == nil || u.nextID <= ss.srv.lastStreamID() {
		return u
	}
	delete(ss.ups, t)
	u.gone = true // removeLocked closes it with its last call
	if len(u.streams) == 0 {
		ss.closeUpstreamLocked(u)
	}
	return nil
}

// lastStreamID is the highest stream id a connection to a target takes.
func (s *Server) lastStreamID() uint32 {
	if s.lastUpstreamStreamID > 0 {
		return s.lastUpstreamStreamID
	}
	return math.MaxInt32 // 2^31−1, RFC 9113 §5.1.1
}

// dialUpstream connects to t and says the client preface and podgate's SETTINGS.
func (ss *session) dialUpstream(t *Target) (*upstream, error) {
	c, err := t.Dial(ss.ctx)
	if err != nil {
		return nil, err
	}
	br := bufio.NewReaderSize(c, readBuffer)
	// No write timeout: the runtime's gRPC server reads whatever its handlers do, and what
	// podgate sends it is bounded by its windows; its connection ends with the client's.
	u := &upstream{target: t, ep: newEndpoint(c, br, endpointHooks{hold: ss.hold, drained: ss.sendPending}), nextID: 1, streams: map[uint32]*stream{}}
	u.ep.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	u.ep.fr.MaxHeaderListSize = maxHeaderList
	err = u.ep.encode(func() error {
		if _, err := u.ep.out.Write([]byte(http2.ClientPreface)); err != nil {
			return err
		}
		return u.ep.writeSettings(
			http2.Setting{ID: http2.SettingEnablePush, Val: 0},
			http2.Setting{ID: http2.SettingInitialWindowSize, Val: streamWindow},
			http2.Setting{ID: http2.SettingMaxHeaderListSize, Val: maxHeaderList},
		)
	})
	if err != nil {
		u.ep.close()
		return nil, fmt.Errorf("connect to %s: %w", t.Name, err)
	}
	u.ep.flush()
	return u, nil
}

func (ss *session) streamByUp(u *upstream, id uint32) *stream {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return u.streams[id]
}

// readUpstream reads an upstream connection's frames until it ends.
func (ss *session) readUpstream(u *upstream) {
	defer ss.upReaders.Done()
	for {
		u.ep.throttle()
		f, err := u.ep.fr.ReadFrame()
		var se http2.StreamError
		switch {
		case errors.As(err, &se):
			ss.resetAndTell(ss.streamByUp(u, se.StreamID), se.Code)
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
	switch f := f.(type) {
	case *http2.MetaHeadersFrame:
		ss.mu.Lock()
		ss.unlock(ss.answerHeadersLocked(u.streams[f.StreamID], f))
	case *http2.DataFrame:
		ss.mu.Lock()
		t, err := ss.dataLocked(dir{src: u.ep}, u.streams[f.StreamID], f)
		ss.unlock(t)
		return err
	case *http2.SettingsFrame:
		return ss.settings(u.ep, u, f)
	case *http2.WindowUpdateFrame:
		return ss.windowUpdate(u.ep, u, f)
	case *http2.PingFrame:
		u.ep.pong(f)
	case *http2.RSTStreamFrame:
		ss.mu.Lock()
		ss.unlock(ss.upResetLocked(u.streams[f.StreamID], f.ErrCode))
	case *http2.GoAwayFrame:
		ss.upstreamGoAway(u, f.LastStreamID)
	case *http2.PushPromiseFrame:
		return connError{http2.ErrCodeProtocol, "PUSH_PROMISE after SETTINGS_ENABLE_PUSH=0"}
	}
	return nil
}

// answerHeadersLocked takes a header block of s's server (s nil when unknown): the answer's
// headers or its trailers. mu is held.
func (ss *session) answerHeadersLocked(s *stream, f *http2.MetaHeadersFrame) todo {
	if s == nil || s.toDown.done {
		return todo{}
	}
	end := f.StreamEnded()
	if s.headersSent && !end {
		return todo{reset: s, code: http2.ErrCodeProtocol}
	}
	s.headersSent = true
	if code, ok := grpcStatusCode(f.Fields); ok {
		s.code = code
	}
	s.toDown.done = end
	return s.kind.answer(ss, s, item{headers: f.Fields, end: end})
}

// upResetLocked takes the server's RST_STREAM of s (nil when unknown). mu is held.
func (ss *session) upResetLocked(s *stream, code http2.ErrCode) todo {
	if s == nil || !s.toDown.done {
		return todo{reset: s, code: code}
	}
	// The server answered whole and wants no more of the request (grpc-go resets with
	// NO_ERROR when a handler returns before the client's end): the answer goes out as it
	// came.
	ss.stopUpLocked(s)
	return ss.endLocked(s)
}

// upstreamFailed ends u: its calls end with Unavailable, and the client's next call connects
// anew.
func (ss *session) upstreamFailed(u *upstream, err error) {
	ss.mu.Lock()
	if ss.ups[u.target] == u {
		delete(ss.ups, u.target)
	}
	u.gone = true
	var ended, whole []*stream
	for _, s := range u.streams {
		if s.toDown.done {
			// Its whole answer came: it still goes out, as far as the client reads.
			whole = append(whole, s)
		} else {
			ended = append(ended, s)
		}
	}
	for _, s := range whole {
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

// failStream ends s with a gRPC status, dropping what it still held: the client is told
// unless its answer went out whole already.
func (ss *session) failStream(s *stream, code codes.Code, msg string) {
	ss.mu.Lock()
	ss.unlock(ss.failLocked(s, code, msg))
}

// failLocked is failStream under mu.
func (ss *session) failLocked(s *stream, code codes.Code, msg string) todo {
	if s.removed {
		return todo{}
	}
	trailersOnly, answered := !s.headersSent, s.toDown.sentEnd
	s.code = code
	ss.removeLocked(s)
	t := todo{ended: s}
	if s.kind.abort(status.Error(code, msg)) && !answered {
		t = t.frame(ss.down, s.downID, item{headers: grpcStatus(code, msg, trailersOnly), end: true})
	}
	return t
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
	u.ep.closeAfterFlush(closeGrace) // the resets and GOAWAY written last go first
}

// stopUpLocked stops passing the client's data to the server, which has answered and wants no
// more: what waits is dropped, what comes is dropped. mu is held.
func (ss *session) stopUpLocked(s *stream) {
	s.kind = s.kind.stop()
	if s.up != nil {
		ss.credit(s.req, nil, s.toUp.q.drop())
		if s.up.streams[s.upID] == s {
			delete(s.up.streams, s.upID)
		}
	}
	s.toUp.sentEnd = true
}
