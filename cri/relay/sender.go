package relay

// The outgoing side of a connection, and its one owner.
//
// Every frame a connection sends — DATA, HEADERS, trailers, WINDOW_UPDATE, SETTINGS and its
// acknowledgement, PING and its answer, RST_STREAM, GOAWAY — is decided and written by the
// owner of its sender, and the state that decides it (the peer's windows and settings, the
// streams' queues and turns, HPACK's encoder, the batch being written) is touched by the owner
// alone. The owner is whoever holds the sender's token (busy): a goroutine that handed the
// sender something and found the token free writes at once, without waiting for the socket
// (the usual case: no goroutine to wake), and hands the token to the sender's writer goroutine
// when the socket takes no more; that goroutine is the only one that ever waits for the peer.
// Everyone else only enqueues (put), under mu, which is never held for more than an append.

import (
	"bytes"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"golang.org/x/sys/unix"
)

// maxResponses is how many frames that answer the peer (PING's and SETTINGS' acknowledgements,
// refusals) may wait to be written before the connection's reader stops reading until they
// are: a peer that sends without reading cannot make them pile up (grpc-go's
// maxQueuedTransportResponseFrames).
const maxResponses = 50

// closeGrace bounds how long a connection's last frames (a GOAWAY) may take to leave before it
// is closed anyway.
const closeGrace = time.Second

// errWouldBlock is a write the socket did not take without waiting.
var errWouldBlock = errors.New("the socket takes no more without waiting")

// senderHooks is what a sender tells its session. The owner calls them, never under a lock.
type senderHooks struct {
	// timeout bounds each write to the peer that makes no progress; 0 for none.
	timeout time.Duration
	// hold counts n more (or, negative, fewer) bytes held for the connection: everything
	// queued for it until it is written.
	hold func(n int64)
	// ended says the end of st's stream went out.
	ended func(st *sendStream)
	// reset says the sender reset st's stream with code on its peer (a header block over the
	// peer's limit, a window past 2^31-1): the other side is told.
	reset func(st *sendStream, code http2.ErrCode)
	// broke says the peer broke HTTP/2's rules (a window past 2^31-1): the connection ends.
	broke func(code http2.ErrCode, reason string)
	// stalled says a write made no progress within timeout; the connection closes.
	stalled func()
}

// sender is one connection's outgoing side.
type sender struct {
	conn  net.Conn
	raw   syscall.RawConn // nil without a file descriptor: the writer goroutine writes then
	hooks senderHooks
	// tryFn and waitFn are tryWritev and waitWritev, made into func values once: RawConn.Write
	// keeps no closure of a write then.
	tryFn, waitFn func(fd uintptr) bool

	mu     sync.Mutex // guards inbox and dead
	inbox  []event
	dead   bool         // ended: what is put now is dropped
	queued atomic.Int32 // len(inbox), read without mu

	busy      atomic.Bool  // the owner's token
	responses atomic.Int32 // frames answering the peer not yet written (maxResponses)
	// sentStream says the owner wrote DATA or a header block since the peer's reader last
	// looked (pingPolicy).
	sentStream atomic.Bool
	// held is what the sender holds, and since when none of it left: the shedding picks the
	// connections that are stuck, not those that hold the most (Server.shedStuck).
	held  atomic.Int64
	since atomic.Int64 // unix nanoseconds

	wake     chan struct{} // the token handed to the writer goroutine
	handoffs atomic.Uint64 // how often it was: the writes that had to wait
	progress chan struct{} // a write ended: the reader's throttle looks again
	quit     chan struct{} // closed by close
	done     chan struct{} // closed once the sender ended and the connection is closed
	start    sync.Once
	closer   sync.Once
	soon     sync.Once // closeAfterFlush

	o owner // the owner's alone
}

// owner is what only the owner of a sender touches.
type owner struct {
	b    batch
	fr   *http2.Framer // encodes into b
	henc *hpack.Encoder
	hbuf bytes.Buffer
	// The peer's connection window and settings.
	window        window
	initWindow    int64 // SETTINGS_INITIAL_WINDOW_SIZE
	maxHeaderList uint32
	// sendMost bounds from above how far a stream's window went past the
	// SETTINGS_INITIAL_WINDOW_SIZE it began with: a change of that setting looks for a
	// window over 2^31-1 only when this says there may be one.
	sendMost int64
	streams  map[uint32]*sendStream
	// ring is the streams whose turn it is, in order (from head); waiting those with bytes
	// queued that wait for a window.
	ring    []*sendStream
	head    int
	waiting []*sendStream
	held    int64 // bytes charged for what the queues and b hold
	closing bool  // an evClose came: the connection closes once b is written
	ended   bool
	iovs    []unix.Iovec
	wn      int     // what the last writev wrote
	werr    error   // and its error
	spare   []event // the inbox's other array
	notes   []note
	kicks   []*sender // senders given credit by the last write
}

// note is a hook the owner calls once its step is done.
type note struct {
	st     *sendStream
	code   http2.ErrCode
	reset  bool   // hooks.reset, else hooks.ended (st) or hooks.broke
	reason string // hooks.broke
}

func newSender(c net.Conn, hooks senderHooks) *sender {
	s := &sender{conn: c, hooks: hooks, wake: make(chan struct{}, 1), progress: make(chan struct{}, 1),
		quit: make(chan struct{}), done: make(chan struct{})}
	if sc, ok := c.(syscall.Conn); ok {
		s.raw, _ = sc.SyscallConn()
	}
	s.tryFn, s.waitFn = s.tryWritev, s.waitWritev
	o := &s.o
	o.b.tail = -1
	o.fr = http2.NewFramer(&o.b, nil)
	o.henc = hpack.NewEncoder(&o.hbuf)
	o.window = newWindow(initialWindow)
	o.initWindow = initialWindow
	o.streams = map[uint32]*sendStream{}
	return s
}

// put enqueues ev for the owner; it never waits, and may be called under the session's mu. The
// caller kicks the sender once it holds no lock. On an ended sender ev is dropped.
func (s *sender) put(ev event) {
	s.mu.Lock()
	if s.dead {
		s.mu.Unlock()
		ev.discard()
		return
	}
	if ev.response {
		s.responses.Add(1)
	}
	s.inbox = append(s.inbox, ev)
	s.queued.Store(int32(len(s.inbox)))
	s.mu.Unlock()
	s.charge(ev.held)
}

// charge counts n more bytes held for the connection.
func (s *sender) charge(n int64) {
	if n == 0 {
		return
	}
	if s.held.Add(n) == n {
		s.since.Store(time.Now().UnixNano()) // it begins to hold
	}
	s.hooks.hold(n)
}

// stuckFor is how long the sender has held bytes without any leaving, 0 when it holds none.
func (s *sender) stuckFor(now time.Time) time.Duration {
	if s.held.Load() <= 0 {
		return 0
	}
	return now.Sub(time.Unix(0, s.since.Load()))
}

// kick makes what was put leave: the caller becomes the owner if nobody is, and writes as far
// as the socket takes without waiting. It must hold no lock: the owner calls the hooks.
func (s *sender) kick() {
	if s.busy.CompareAndSwap(false, true) {
		s.run(false)
	}
}

// run is the owner's loop: take what was put, choose what goes next, write it, until nothing
// is left (the token let go), or — for a caller that is not the writer goroutine (g) — until
// the socket takes no more without waiting (the token handed to the writer goroutine).
func (s *sender) run(g bool) {
	for {
		if s.quitting() {
			s.end()
			return
		}
		s.apply()
		if g {
			s.fill(slowBatch)
		} else {
			s.fill(maxBatch)
		}
		// The hooks of what this batch ends are called once its bytes left: nothing the session
		// does for them (a stream forgotten, the observer's End) comes before the answer.
		var buf [4]note
		notes := append(buf[:0], s.o.notes...)
		clear(s.o.notes)
		s.o.notes = s.o.notes[:0]
		if !s.o.b.empty() {
			owner := s.write(g)
			s.notify(notes)
			if !owner {
				return
			}
			continue
		}
		s.notify(notes)
		if s.o.closing {
			s.end()
			return
		}
		if !s.release() {
			return
		}
	}
}

// release lets the token go; it says whether the caller took it back because more came
// meanwhile.
func (s *sender) release() bool {
	s.busy.Store(false)
	if s.queued.Load() == 0 && !s.quitting() {
		return false
	}
	return s.busy.CompareAndSwap(false, true)
}

func (s *sender) quitting() bool {
	select {
	case <-s.quit:
		return true
	default:
		return false
	}
}

// apply takes what was put, in order.
func (s *sender) apply() {
	if s.queued.Load() == 0 {
		return
	}
	s.mu.Lock()
	evs := s.inbox
	s.inbox = s.o.spare // the two take turns: putting appends to no new array
	s.queued.Store(0)
	s.mu.Unlock()
	for i := range evs {
		if s.o.closing {
			s.drop(&evs[i])
			continue
		}
		s.take(&evs[i])
	}
	clear(evs)
	s.o.spare = evs[:0]
}

// notify calls the hooks of notes, which the owner's steps left; the hooks touch nothing of the
// owner's.
func (s *sender) notify(notes []note) {
	for _, n := range notes {
		switch {
		case n.reason != "":
			s.hooks.broke(n.code, n.reason)
		case n.reset:
			s.hooks.reset(n.st, n.code)
		default:
			s.hooks.ended(n.st)
		}
	}
}

// deliver calls the hooks the owner's steps left, and kicks the senders that a write gave
// credit to.
func (s *sender) deliver() {
	o := &s.o
	for len(o.notes) > 0 {
		notes := o.notes
		o.notes = nil
		s.notify(notes)
	}
	for len(o.kicks) > 0 {
		k := o.kicks[len(o.kicks)-1]
		o.kicks = o.kicks[:len(o.kicks)-1]
		k.kick()
	}
}

// close closes the connection at once; the sender ends with it.
func (s *sender) close() {
	s.closer.Do(func() {
		close(s.quit)
		_ = s.conn.Close()
		s.startWriter()
	})
}

// kickSoon makes what was put leave without writing in the caller, which may hold locks: the
// writer goroutine does, unless an owner is at work (it takes what was put before it lets go).
func (s *sender) kickSoon() {
	if s.busy.CompareAndSwap(false, true) {
		s.handOff()
	}
}

// closeAfterFlush closes the connection once what was put before has been written, or after
// grace at most; it does not wait.
func (s *sender) closeAfterFlush(grace time.Duration) {
	select {
	case <-s.done:
		// Ended already (its peer broke it): nothing is left to write.
		_ = s.conn.Close()
		return
	default:
	}
	s.soon.Do(func() {
		s.put(event{kind: evClose})
		t := time.AfterFunc(grace, s.close)
		go func() {
			<-s.done
			t.Stop()
		}()
		s.kickSoon() // the caller may hold the session's mu, which the hooks take

	})
}

// shutdown is closeAfterFlush, waiting for the close.
func (s *sender) shutdown() {
	s.closeAfterFlush(closeGrace)
	<-s.done
}

// end ends the sender, by its owner: nothing more is written, what was queued is dropped and
// given back, the connection closes. The token is never let go: a dead sender has no owner.
func (s *sender) end() {
	s.shutDown(func() { _ = s.conn.Close() })
}

// endWriting is end for a connection its peer broke: its write side is shut, not the whole of
// it, so that its reader still reads what the peer sent before; closing it is the session's.
func (s *sender) endWriting() {
	s.shutDown(func() {
		if cw, ok := s.conn.(interface{ CloseWrite() error }); ok && cw.CloseWrite() == nil {
			return
		}
		_ = s.conn.Close()
	})
}

// shutDown is end's work, the connection shut by shut.
func (s *sender) shutDown(shut func()) {
	o := &s.o
	if o.ended {
		return
	}
	o.ended = true
	s.mu.Lock()
	s.dead = true
	evs := s.inbox
	s.inbox = nil
	s.queued.Store(0)
	s.mu.Unlock()
	for i := range evs {
		s.drop(&evs[i])
	}
	for _, st := range o.streams {
		s.forget(st)
	}
	for _, m := range o.b.marks[o.b.gone:] {
		if m.st != nil && m.n > 0 {
			m.st.credit.drop(m.n) // in the batch, never written
		}
	}
	o.b.reset()
	if o.held != 0 {
		s.charge(-o.held)
		o.held = 0
	}
	s.responses.Store(0)
	s.closer.Do(func() {
		close(s.quit)
		shut()
	})
	close(s.done)
	s.deliver() // the credit of what was dropped
}
