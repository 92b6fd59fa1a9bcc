package relay

// What the owner keeps of its peer — the windows it gives and its SETTINGS — and the credit a
// sender gives back to the connection a way's bytes came from.

import (
	"golang.org/x/net/http2"
)

// peerWindow applies the peer's WINDOW_UPDATE of the connection (id 0) or a stream.
func (s *sender) peerWindow(id uint32, inc uint32) {
	o := &s.o
	if id == 0 {
		if code := o.window.update(inc); code != http2.ErrCodeNo {
			s.broke(code, "connection window above 2^31-1")
			return
		}
		s.wakeWaiting()
		return
	}
	st := o.streams[id]
	if st == nil {
		return // ended, or never opened: nothing waits for it
	}
	if code := st.window.update(inc); code != http2.ErrCodeNo || st.sendSize(o) > maxWindow {
		s.fail(st, http2.ErrCodeFlowControl)
		return
	}
	o.sendMost = max(o.sendMost, st.window.size()-st.base)
	if !st.q.empty() {
		s.ready(st)
	}
}

// wakeWaiting puts the streams that wait for a window back on the ring: they look again.
func (s *sender) wakeWaiting() {
	o := &s.o
	for _, st := range o.waiting {
		st.waits = false
		if !st.q.empty() {
			s.ready(st)
		}
	}
	clear(o.waiting)
	o.waiting = o.waiting[:0]
}

// settings applies the peer's settings that concern what podgate sends (the reader applied the
// others): a change of SETTINGS_INITIAL_WINDOW_SIZE moves every stream's window (RFC 9113
// §6.9.2) without touching one, through initWindow.
func (s *sender) settings(settings []http2.Setting) {
	o := &s.o
	var grow bool
	for _, st := range settings {
		switch st.ID {
		case http2.SettingInitialWindowSize:
			delta := int64(st.Val) - o.initWindow
			o.initWindow = int64(st.Val)
			if o.sendMost+o.initWindow > maxWindow && s.windowOver() {
				s.broke(http2.ErrCodeFlowControl, "window above 2^31-1")
				return
			}
			grow = grow || delta > 0
		case http2.SettingHeaderTableSize:
			o.henc.SetMaxDynamicTableSize(st.Val)
		case http2.SettingMaxHeaderListSize:
			o.maxHeaderList = st.Val
		}
	}
	if grow {
		s.wakeWaiting()
	}
}

// windowOver says whether a stream's window is above 2^31-1.
func (s *sender) windowOver() bool {
	for _, st := range s.o.streams {
		if st.sendSize(&s.o) > maxWindow {
			return true
		}
	}
	return false
}

// creditTo is where a stream's bytes came from: a connection (nil for a handler, whose bytes
// no window counts), the stream's id there and its window.
type creditTo struct {
	c  *conn
	id uint32
	w  *recvWindow
}

// give gives n bytes that left back to their connection's windows; it returns the sender
// whose WINDOW_UPDATEs it put, for the caller to kick, or nil.
func (ct creditTo) give(n int64) *sender {
	if ct.c == nil {
		return nil
	}
	return ct.c.give(ct.id, ct.w, n)
}

// drop gives n bytes that will never leave back to their connection's window (the stream's no
// longer counts). It may be called under locks: the WINDOW_UPDATE goes out through the
// connection's writer goroutine unless an owner is at work.
func (ct creditTo) drop(n int64) {
	if ct.c != nil && n > 0 {
		if k := ct.c.give(0, nil, n); k != nil {
			k.kickSoon()
		}
	}
}
