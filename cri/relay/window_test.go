package relay

import (
	"net"
	"testing"

	"golang.org/x/net/http2"
)

// TestWindow holds the window arithmetic of RFC 9113 §6.9 step by step: each case starts
// from a window of start, applies its steps in order, and checks each step's code and the
// size after it.
func TestWindow(t *testing.T) {
	type step struct {
		op   string // receive, spend, update, credit
		n    int64  // bytes, increment or delta
		want http2.ErrCode
		size int64 // after the step
		inc  uint32
	}
	const ok = http2.ErrCodeNo
	cases := []struct {
		name  string
		start int64
		steps []step
	}{
		{"a peer's first window is 65535 (§6.9.2)", initialWindow, []step{
			{op: "receive", n: 65535, want: ok, size: 0},
		}},
		{"DATA within the window", 100, []step{
			{op: "receive", n: 40, want: ok, size: 60},
			{op: "receive", n: 60, want: ok, size: 0},
		}},
		{"DATA past the window is a FLOW_CONTROL_ERROR (§6.9.1)", 100, []step{
			{op: "receive", n: 101, want: http2.ErrCodeFlowControl, size: -1},
		}},
		{"DATA after the window ran out", 0, []step{
			{op: "receive", n: 1, want: http2.ErrCodeFlowControl, size: -1},
		}},
		{"an empty DATA frame on an empty window", 0, []step{
			{op: "receive", n: 0, want: ok, size: 0},
		}},
		{"sending spends", initialWindow, []step{
			{op: "spend", n: 65535, size: 0},
		}},
		{"WINDOW_UPDATE adds its increment", 0, []step{
			{op: "update", n: 1000, want: ok, size: 1000},
			{op: "update", n: 24, want: ok, size: 1024},
		}},
		{"WINDOW_UPDATE of 0 is a PROTOCOL_ERROR (§6.9)", 10, []step{
			{op: "update", n: 0, want: http2.ErrCodeProtocol, size: 10},
		}},
		{"WINDOW_UPDATE up to 2^31-1", initialWindow, []step{
			{op: "update", n: maxWindow - initialWindow, want: ok, size: maxWindow},
		}},
		{"WINDOW_UPDATE past 2^31-1 is a FLOW_CONTROL_ERROR (§6.9.1)", initialWindow, []step{
			{op: "update", n: maxWindow - initialWindow + 1, want: http2.ErrCodeFlowControl, size: maxWindow + 1},
		}},
		{"the largest increment on a full window overflows", maxWindow, []step{
			{op: "update", n: maxWindow, want: http2.ErrCodeFlowControl, size: 2 * maxWindow},
		}},
		{"WINDOW_UPDATE on a negative window", -100, []step{
			{op: "update", n: 50, want: ok, size: -50},
			{op: "update", n: 51, want: ok, size: 1},
		}},
		{"credit waits for a batch", 1000, []step{
			{op: "receive", n: 300, want: ok, size: 700},
			{op: "credit", n: 100, size: 700},
			{op: "credit", n: 149, size: 700},
			{op: "credit", n: 1, size: 950, inc: 250},
			{op: "credit", n: 50, size: 950},
		}},
		{"credit gives back a batch and more at once", 1000, []step{
			{op: "receive", n: 1000, want: ok, size: 0},
			{op: "credit", n: 999, size: 999, inc: 999},
		}},
	}
	const batch = 250
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			// Receiving and giving back are the receiving window's (recvWindow), spending
			// and updates the sending one's (window).
			w, r := newWindow(c.start), newRecvWindow(c.start)
			for i, st := range c.steps {
				var code http2.ErrCode
				var inc uint32
				size := w.size
				switch st.op {
				case "receive":
					if !r.receive(st.n) {
						code = http2.ErrCodeFlowControl
					}
					size = r.n.Load
				case "spend":
					w.spend(st.n)
				case "update":
					code = w.update(uint32(st.n))
				case "credit":
					inc = r.credit(st.n, batch)
					size = r.n.Load
				default:
					t.Fatalf("unknown op %q", st.op)
				}
				if code != st.want || size() != st.size || inc != st.inc {
					t.Errorf("step %d (%s %d): code %v, size %d, increment %d; want %v, %d, %d", i, st.op, st.n, code, size(), inc, st.want, st.size, st.inc)
				}
			}
		})
	}
}

// TestStreamWindowFollowsSettings: a stream's window toward a peer follows every change of
// the peer's SETTINGS_INITIAL_WINDOW_SIZE (RFC 9113 §6.9.2), up or down, below zero too, and a
// change or a WINDOW_UPDATE that takes one past 2^31-1 is a FLOW_CONTROL_ERROR: of the stream
// (reset, the session told) or of the connection (the session told to end it).
func TestStreamWindowFollowsSettings(t *testing.T) {
	c1, c2 := net.Pipe()
	defer c1.Close()
	defer c2.Close()
	s := newSender(c1, senderHooks{hold: func(int64) {}})
	st := &sendStream{id: 1, out: s, wire: true}
	s.open(st)
	set := func(v uint32) {
		s.settings([]http2.Setting{{ID: http2.SettingInitialWindowSize, Val: v}})
	}
	want := func(step string, size int64) {
		t.Helper()
		if got := st.sendSize(&s.o); got != size {
			t.Errorf("%s: window %d, want %d", step, got, size)
		}
	}
	notes := func() []note {
		n := s.o.notes
		s.o.notes = nil
		return n
	}
	want("opened", initialWindow)
	set(streamWindow)
	want("a larger SETTINGS_INITIAL_WINDOW_SIZE", streamWindow)
	st.window.spend(streamWindow - 100)
	set(1000)
	want("spent, then a smaller one", 100-(streamWindow-1000))
	s.peerWindow(1, 1<<20)
	want("a WINDOW_UPDATE on a negative window", 100-(streamWindow-1000)+1<<20)
	if n := notes(); len(n) != 0 {
		t.Fatalf("notes %+v", n)
	}
	s.peerWindow(1, uint32(maxWindow-st.sendSize(&s.o)+1))
	if n := notes(); len(n) != 1 || !n[0].reset || n[0].code != http2.ErrCodeFlowControl || n[0].st != st {
		t.Errorf("a WINDOW_UPDATE past 2^31-1: %+v, want the stream reset with FLOW_CONTROL_ERROR", n)
	}
	set(0)
	s2 := &sendStream{id: 3, out: s, wire: true}
	s.open(s2)
	s.peerWindow(3, maxWindow-10)
	set(10)
	if n := notes(); len(n) != 0 {
		t.Errorf("a SETTINGS change to exactly 2^31-1: %+v", n)
	}
	set(11)
	if n := notes(); len(n) != 1 || n[0].reason == "" || n[0].code != http2.ErrCodeFlowControl {
		t.Errorf("a SETTINGS change past 2^31-1: %+v, want the connection ended with FLOW_CONTROL_ERROR", n)
	}
}
