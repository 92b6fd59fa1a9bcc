package relay

import (
	"sync/atomic"

	"golang.org/x/net/http2"
)

// maxWindow is the largest a flow-control window may be (RFC 9113 §6.9.1).
const maxWindow = 1<<31 - 1

// window is one HTTP/2 flow-control window of what podgate sends (RFC 9113 §6.9): the bytes it
// may still send to a peer on a stream or on a connection. Only the owner of the connection's
// outgoing side (sender) touches it; its rules (and the errors their breaking ends in) live here
// once, rather than in each handler of a frame that moves a window.
//
// The methods that check a rule answer http2.ErrCodeNo when it holds, and otherwise the code
// the stream or the connection the window belongs to ends with.
type window struct {
	n int64 // what may still be sent; negative after SETTINGS shrank it (§6.9.2)
}

func newWindow(n int64) window { return window{n: n} }

// size is what may still be sent; it may be negative.
func (w *window) size() int64 { return w.n }

// spend counts n bytes sent to the peer; the sender checked they fit.
func (w *window) spend(n int64) { w.n -= n }

// update applies a WINDOW_UPDATE's increment: 0 is a PROTOCOL_ERROR (§6.9), and a window
// past 2^31-1 a FLOW_CONTROL_ERROR (§6.9.1), of the stream or the connection as the frame's.
func (w *window) update(inc uint32) http2.ErrCode {
	if inc == 0 {
		return http2.ErrCodeProtocol
	}
	w.n += int64(inc)
	if w.n > maxWindow {
		return http2.ErrCodeFlowControl
	}
	return http2.ErrCodeNo
}

// recvWindow is the window of what a peer may still send podgate, on a stream or on a
// connection. The peer's reader counts what arrives (receive); whoever passes the bytes on
// gives them back (credit) — the sender of another connection as they leave it, or a reader
// that consumed or dropped them — so it is atomic.
type recvWindow struct {
	n atomic.Int64
	// unacked is what was passed on and not yet given back to the peer: it goes back in
	// batches, not a WINDOW_UPDATE per DATA frame.
	unacked atomic.Int64
	// shut says the peer ended its side (END_STREAM): nothing more is given back.
	shut atomic.Bool
}

func newRecvWindow(n int64) *recvWindow {
	w := new(recvWindow)
	w.n.Store(n)
	return w
}

// receive counts a DATA frame of n bytes (padding included) the peer sent; it says whether it
// was within the window (§6.9.1: otherwise a FLOW_CONTROL_ERROR).
func (w *recvWindow) receive(n int64) bool { return w.n.Add(-n) >= 0 }

// credit gives n bytes back once they have been passed on. Once at least batch bytes wait, it
// opens the window by them and returns the increment of the WINDOW_UPDATE that tells the peer,
// before the peer can know of it; it returns 0 until then, and once the peer ended its side.
func (w *recvWindow) credit(n, batch int64) uint32 {
	if n <= 0 || w.shut.Load() || w.unacked.Add(n) < batch {
		return 0
	}
	inc := w.unacked.Swap(0)
	if inc <= 0 {
		return 0
	}
	w.n.Add(inc)
	return uint32(inc)
}
