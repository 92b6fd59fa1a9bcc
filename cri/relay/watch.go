package relay

// Time limits: a connection's idle timeout and keepalive, a call's deadline and the time its
// request may take to arrive.

import (
	"fmt"
	"time"

	"golang.org/x/net/http2"
	"google.golang.org/grpc/codes"
)

// watchState is the watch's view of the connection; only the watch's timer touches it, and it
// runs once at a time.
type watchState struct {
	timer  *time.Timer
	frames uint64    // the session's frames when the watch last saw it move
	seen   time.Time // when it did
	pinged time.Time // when the watch sent a PING not answered yet; zero when none
}

// watchPeriod is how often the watch looks at the connection: often enough that each limit
// holds within a quarter of itself.
func (l *Limits) watchPeriod() time.Duration {
	return max(min(l.IdleTimeout, l.KeepaliveTime, l.KeepaliveTimeout, l.WindowTimeout)/4, 5*time.Millisecond)
}

// startWatch starts the session's watch once its SETTINGS went out.
func (ss *session) startWatch() {
	ss.watch.seen = time.Now()
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if !ss.closed {
		ss.watch.timer = time.AfterFunc(ss.srv.lim.watchPeriod(), ss.look)
	}
}

// look is one look of the watch: a client silent for KeepaliveTime gets a PING, one that does
// not answer within KeepaliveTimeout is closed, and so is a connection without a call for
// IdleTimeout (GOAWAY first); otherwise the watch looks again later.
func (ss *session) look() {
	lim, w, now := &ss.srv.lim, &ss.watch, time.Now()
	if n := ss.frames.Load(); n != w.frames {
		w.frames, w.seen, w.pinged = n, now, time.Time{}
	}
	switch {
	case !w.pinged.IsZero() && now.Sub(w.pinged) >= lim.KeepaliveTimeout:
		ss.report(refusal{ReasonKeepalive, fmt.Sprintf("sent nothing for %s and did not answer a PING", now.Sub(w.seen).Round(time.Millisecond)), "closed the connection"})
		ss.down.out.close() // at once: the writer may be stuck on a client that does not read
		return
	case w.pinged.IsZero() && now.Sub(w.seen) >= lim.KeepaliveTime:
		ss.down.out.put(event{kind: evPing, ping: [8]byte{'p', 'o', 'd', 'g', 'a', 't', 'e'}, held: pingSize})
		ss.down.out.kick()
		w.pinged = now
	}
	ss.mu.Lock()
	idle := len(ss.streams) == 0 && !ss.draining && !ss.closed && now.Sub(ss.idleSince) >= lim.IdleTimeout
	if idle {
		ss.draining = true // a call that comes now is refused: the GOAWAY says so
	}
	last, closed := ss.lastID, ss.closed
	stuck := ss.stuckLocked(now)
	ss.mu.Unlock()
	for _, s := range stuck {
		ss.report(refusal{ReasonWindowTimeout, fmt.Sprintf("left the answer of %s waiting on a shut flow-control window for %s", clip(s.path), lim.WindowTimeout), "RST_STREAM CANCEL"})
		ss.resetStream(s, http2.ErrCodeCancel, true, true, http2.ErrCodeCancel)
	}
	switch {
	case closed:
	case idle:
		ss.report(refusal{ReasonIdle, fmt.Sprintf("had no call open for %s", lim.IdleTimeout), "GOAWAY, closed the connection"})
		ss.down.out.put(event{kind: evGoAway, id: last, code: http2.ErrCodeNo, held: goAwaySize})
		ss.down.out.closeAfterFlush(closeGrace)
	default:
		ss.mu.Lock()
		if !ss.closed {
			w.timer.Reset(lim.watchPeriod())
		}
		ss.mu.Unlock()
	}
}

// stuckLocked lists the calls whose answer has waited on the client's shut window, without a
// byte leaving, for WindowTimeout (the client's sender says since when). mu is held.
func (ss *session) stuckLocked(now time.Time) []*stream {
	var stuck []*stream
	for _, s := range ss.streams {
		if s.ans.to == nil {
			continue
		}
		if d, ok := s.ans.to.waitingSince.since(now); ok && d >= ss.srv.lim.WindowTimeout {
			stuck = append(stuck, s)
		}
	}
	return stuck
}

// clock is a call's time limit, from when its headers arrived: its grpc-timeout when it has
// one, else RequestTimeout.
type clock struct {
	s          *stream
	arrived    time.Time
	timeout    time.Duration
	hasTimeout bool
}

// startClocks starts the clocks of the calls begun in the frames just read whose requests
// have not arrived whole with them: a kubelet's request comes whole with its headers, and
// costs no timer. A call whose request is whole needs none of the relay's: a call answered in
// the process has the deadline in its handler's context, and the server of a call passed
// through keeps its grpc-timeout, which the relay passed on with the headers at once.
func (ss *session) startClocks() {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	for i, c := range ss.clocks {
		ss.clocks[i] = clock{}
		s := c.s
		if s.removed || s.req.done {
			continue
		}
		limit, deadline := ss.srv.lim.RequestTimeout, false
		if c.hasTimeout {
			limit, deadline = c.timeout, true
		}
		s.timer = time.AfterFunc(time.Until(c.arrived.Add(limit)), func() { ss.expire(s, deadline) })
	}
	ss.clocks = ss.clocks[:0]
}

// expire ends s when its time ran out: at its deadline, a call whose request did not arrive
// whole is reset (CANCEL, DeadlineExceeded to the observer), as is a call passed through (its
// server's answer has not come); a call answered in the process keeps its handler, whose
// context has the deadline. After RequestTimeout, a call without a deadline whose request
// did not arrive whole is reset.
func (ss *session) expire(s *stream, deadline bool) {
	ss.mu.Lock()
	_, inProcess := s.kind.(*unaryCall)
	switch {
	case s.removed,
		deadline && inProcess && s.req.done,
		!deadline && s.req.done:
		ss.mu.Unlock()
		return
	}
	whole := s.req.done
	s.expired = deadline
	ss.mu.Unlock()
	// Told before the client is, so that what it learns is already counted.
	switch {
	case whole:
	case deadline:
		ss.report(refusal{ReasonDeadline, fmt.Sprintf("had not sent the whole request of %s at its grpc-timeout", clip(s.path)), "RST_STREAM CANCEL"})
	default:
		ss.report(refusal{ReasonRequestTimeout, fmt.Sprintf("had not sent the whole request of %s after %s", clip(s.path), ss.srv.lim.RequestTimeout), "RST_STREAM CANCEL"})
	}
	ss.resetStream(s, http2.ErrCodeCancel, true, true, http2.ErrCodeCancel)
}

// deadlineCode is the code a call reset by expire ends with.
func deadlineCode(s *stream, code codes.Code) codes.Code {
	if s.expired {
		return codes.DeadlineExceeded
	}
	return code
}
