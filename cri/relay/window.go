package relay

import "golang.org/x/net/http2"

// maxWindow is the largest a flow-control window may be (RFC 9113 §6.9.1).
const maxWindow = 1<<31 - 1

// window is one HTTP/2 flow-control window (RFC 9113 §6.9): the bytes one side may still
// send on a stream or on a connection. The relay keeps one for each side of each direction
// of every stream and connection; its rules (and the errors their breaking ends in) live here
// once, rather than in each handler of a frame that moves a window.
//
// The methods that check a rule answer http2.ErrCodeNo when it holds, and otherwise the code
// the stream or the connection the window belongs to ends with.
type window struct {
	n int64 // what may still be sent; negative after SETTINGS shrank it (§6.9.2)
	// unacked is, on a receiving window, what was received and passed on but not yet given
	// back to the peer: it goes back in batches, not a WINDOW_UPDATE per DATA frame.
	unacked int64
}

func newWindow(n int64) window { return window{n: n} }

// size is what may still be sent; it may be negative.
func (w *window) size() int64 { return w.n }

// receive counts a DATA frame of n bytes (padding included) the peer sent within the window:
// a FLOW_CONTROL_ERROR when it sent more than the window allowed (§6.9.1).
func (w *window) receive(n int64) http2.ErrCode {
	w.n -= n
	if w.n < 0 {
		return http2.ErrCodeFlowControl
	}
	return http2.ErrCodeNo
}

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

// credit gives n received bytes back to the peer once they have been passed on. They are
// batched: once at least batch bytes wait, credit opens the window by them and returns the
// increment of the WINDOW_UPDATE that tells the peer; it returns 0 until then.
func (w *window) credit(n, batch int64) uint32 {
	w.unacked += n
	if w.unacked < batch {
		return 0
	}
	inc := w.unacked
	w.n += inc
	w.unacked = 0
	return uint32(inc)
}
