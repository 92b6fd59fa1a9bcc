package relay

// The upstream side of a session: a connection per Target, its frames, and what its end does to
// the calls on it.

import (
	"errors"
	"fmt"
	"math"

	"golang.org/x/net/http2"
	"google.golang.org/grpc/codes"
)

// upstream is one connection to a Target.
type upstream struct {
	target  *Target
	c       *conn
	nextID  uint32
	streams map[uint32]*stream // by upstream stream id
	// gone is set when the connection takes no new calls (GOAWAY, or it ended).
	gone bool
	// maxStreams is the server's SETTINGS_MAX_CONCURRENT_STREAMS, 0 while it set none.
	maxStreams uint32
}

// onUpstream runs open, under mu, with the session's connection to t for a new call: open
// opens the call's stream on it before mu is let go, so the stream id the call takes is one the
// connection still has, and the connection cannot end in between. HTTP/2 stream ids a client
// opens are odd and only grow, up to 2^31−1 (at 100 calls a second, about four months): a
// connection that has used its last one takes no new call and closes once its last call
// ended, and a fresh one is dialled, as grpc-go's client does. No call fails for it.
func (ss *session) onUpstream(t *Target, open func(up *upstream)) error {
	for {
		if ss.openOnUpstream(t, open) {
			return nil
		}
		u, err := ss.dialUpstream(t)
		if err != nil {
			return err
		}
		if err := ss.addUpstream(t, u); err != nil {
			return err
		}
	}
}

// openOnUpstream runs open with the connection to t new calls take, if there is one.
func (ss *session) openOnUpstream(t *Target, open func(up *upstream)) bool {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	u := ss.upstreamLocked(t)
	if u != nil {
		open(u)
	}
	return u != nil
}

// addUpstream makes u, just dialled, the connection to t, unless another call connected
// meanwhile (u closes; the call takes that one) or the session ended.
func (ss *session) addUpstream(t *Target, u *upstream) error {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	switch {
	case ss.closed:
		u.c.out.closeAfterFlush(closeGrace)
		return errors.New("client connection ended")
	case ss.ups[t] != nil:
		u.c.out.closeAfterFlush(closeGrace)
		return nil
	}
	ss.ups[t] = u
	ss.upConns[u] = struct{}{}
	ss.upReaders.Add(1)
	go ss.readUpstream(u)
	return nil
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
	nc, err := t.Dial(ss.ctx)
	if err != nil {
		return nil, err
	}
	u := &upstream{target: t, nextID: 1, streams: map[uint32]*stream{}}
	u.c = newConn(nc, maxHeaderList, true, ss.hooks(u))
	u.c.out.put(event{kind: evPreface, ack: true, settings: []http2.Setting{
		{ID: http2.SettingEnablePush, Val: 0},
		{ID: http2.SettingInitialWindowSize, Val: streamWindow},
		{ID: http2.SettingMaxHeaderListSize, Val: maxHeaderList},
	}})
	u.c.out.kick()
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
	c := u.c
	defer c.flush()
	for {
		if !c.safe() {
			ss.flushRead(c)
			c.out.throttle()
		}
		f, d, isData, err := c.next()
		var se http2.StreamError
		switch {
		case errors.As(err, &se):
			ss.resetAndTell(ss.streamByUp(u, se.StreamID), se.Code)
			err = nil
		case err != nil:
		case isData:
			err = ss.data(c, u, d)
		default:
			err = ss.upstreamFrame(u, f)
		}
		if err != nil {
			c.flush()
			if code, ok := goAwayCode(err); ok {
				c.out.put(event{kind: evGoAway, code: code, held: goAwaySize})
				c.out.kick()
			}
			ss.upstreamFailed(u, err)
			ss.down.out.kick() // the calls' ends, to the client
			return
		}
	}
}

func (ss *session) upstreamFrame(u *upstream, f http2.Frame) error {
	switch f := f.(type) {
	case *http2.MetaHeadersFrame:
		ss.mu.Lock()
		a := ss.answerHeadersLocked(u.streams[f.StreamID], f)
		ss.mu.Unlock()
		ss.after(u.c, a)
	case *http2.SettingsFrame:
		return ss.peerSettings(u.c, u, f)
	case *http2.WindowUpdateFrame:
		u.c.out.put(event{kind: evWindow, id: f.StreamID, inc: f.Increment})
		u.c.touch(u.c.out)
	case *http2.PingFrame:
		ss.pong(u.c, f)
	case *http2.RSTStreamFrame:
		ss.mu.Lock()
		a := ss.upResetLocked(u.streams[f.StreamID], f.ErrCode)
		ss.mu.Unlock()
		ss.after(u.c, a)
	case *http2.GoAwayFrame:
		ss.upstreamGoAway(u, f.LastStreamID)
	case *http2.PushPromiseFrame:
		return connError{http2.ErrCodeProtocol, "PUSH_PROMISE after SETTINGS_ENABLE_PUSH=0"}
	}
	return nil
}

// answerHeadersLocked takes a header block of s's server (s nil when unknown): the answer's
// headers or its trailers. mu is held.
func (ss *session) answerHeadersLocked(s *stream, f *http2.MetaHeadersFrame) after {
	if s == nil || s.ans.done {
		return after{}
	}
	end := f.StreamEnded()
	if s.headersSent && !end {
		return after{reset: s, code: http2.ErrCodeProtocol}
	}
	s.headersSent = true
	if code, ok := grpcStatusCode(f.Fields); ok {
		s.code = code
	}
	if end {
		s.ans.done = true
		s.ans.recv.shut.Store(true)
	}
	return s.kind.headers(ss, s, &s.ans, f.Fields, end)
}

// upResetLocked takes the server's RST_STREAM of s (nil when unknown). mu is held.
func (ss *session) upResetLocked(s *stream, code http2.ErrCode) after {
	if s == nil || !s.ans.done {
		return after{reset: s, code: code}
	}
	// The server answered whole and wants no more of the request (grpc-go resets with
	// NO_ERROR when a handler returns before the client's end): the answer goes out as it
	// came.
	ss.stopUpLocked(s)
	var a after
	ss.endLocked(s, &a)
	return a
}

// upstreamFailed ends u: its calls end with Unavailable, and the client's next call connects
// anew.
func (ss *session) upstreamFailed(u *upstream, err error) {
	ss.mu.Lock()
	if ss.ups[u.target] == u {
		delete(ss.ups, u.target)
	}
	u.gone = true
	var failed, ended []*stream
	for _, s := range u.streams {
		if !s.ans.done {
			failed = append(failed, s)
			continue
		}
		// Its whole answer came: it still goes out, as far as the client reads.
		ss.stopUpLocked(s)
		var a after
		ss.endLocked(s, &a)
		if a.ended != nil {
			ended = append(ended, s)
		}
	}
	ss.closeUpstreamLocked(u)
	ss.mu.Unlock()
	for _, s := range ended {
		ss.observeEnd(s)
	}
	msg := fmt.Sprintf("connection to %s ended: %v", u.target.Name, err)
	for _, s := range failed {
		ss.failStream(s, codes.Unavailable, msg, false)
	}
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
	defer ss.mu.Unlock()
	if len(u.streams) == 0 {
		ss.closeUpstreamLocked(u)
	}
}

// closeUpstreamLocked closes u's connection and forgets it. mu is held.
func (ss *session) closeUpstreamLocked(u *upstream) {
	u.gone = true
	if ss.ups[u.target] == u {
		delete(ss.ups, u.target)
	}
	delete(ss.upConns, u)
	u.c.out.closeAfterFlush(closeGrace) // the resets and GOAWAY put last go first
}

// stopUpLocked stops passing the client's data to the server, which has answered and wants no
// more: what waits is dropped, what comes is dropped. mu is held.
func (ss *session) stopUpLocked(s *stream) {
	s.kind = s.kind.stop()
	if s.up != nil {
		dropSend(s.req.to, false, noRST)
		if s.up.streams[s.upID] == s {
			delete(s.up.streams, s.upID)
		}
	}
	s.req.closed = true
}
