package relay

// How a session ends: the GOAWAY that tells the client why, draining for Shutdown (no new
// calls, long-lived ones ended, the connection closed after the last), and the close that ends
// every call still open.

import (
	"errors"

	"golang.org/x/net/http2"
	"google.golang.org/grpc/codes"
)

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

// goAway tells the client the connection ends, and why.
func (ss *session) goAway(code http2.ErrCode) {
	ss.down.out.put(event{kind: evGoAway, id: ss.clientLastID(), code: code, held: goAwaySize})
	ss.down.out.kick()
}

// goAwaySize is a GOAWAY frame's size, what it is charged while it waits.
const goAwaySize = 17

// drain starts the session's end for Shutdown: the client is told to open no more calls, the
// long-lived ones end with Unavailable, and the connection closes once the last call ended.
func (ss *session) drain() {
	last, long, started := ss.beginDrain()
	if !started {
		// Not past the preface yet: there is nothing to tell it.
		ss.down.out.close()
		return
	}
	ss.down.out.put(event{kind: evGoAway, id: last, code: http2.ErrCodeNo, held: goAwaySize})
	ss.down.out.kick()
	for _, s := range long {
		ss.failStream(s, codes.Unavailable, ss.srv.ShutdownMessage, true)
	}
	ss.closeIfDrained()
}

// beginDrain marks the session draining and returns the client's last stream id and the
// long-lived calls, unless the client's preface has not come yet (started false).
func (ss *session) beginDrain() (last uint32, long []*stream, started bool) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	ss.draining = true
	if !ss.started {
		return 0, nil, false
	}
	for _, s := range ss.streams {
		if ss.srv.LongLived != nil && ss.srv.LongLived(s.path) {
			long = append(long, s)
		}
	}
	return ss.lastID, long, true
}

// closeIfDrained closes the client's connection once a draining session has no call left; its
// reader then ends the session. What the last calls' answers left goes first.
func (ss *session) closeIfDrained() {
	ss.mu.Lock()
	done := ss.draining && len(ss.streams) == 0
	ss.mu.Unlock()
	if done {
		ss.down.out.closeAfterFlush(closeGrace)
	}
}

// close ends the session: every upstream connection closes, and the calls still open end.
func (ss *session) close() {
	ss.down.out.shutdown() // a GOAWAY the reader put last leaves first, within closeGrace
	ss.mu.Lock()
	ss.closed = true
	if ss.watch.timer != nil {
		ss.watch.timer.Stop()
	}
	var open []*stream
	for _, s := range ss.streams {
		open = append(open, s)
		s.code = codes.Canceled
		ss.removeLocked(s, noRST, noRST)
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
