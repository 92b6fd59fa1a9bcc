package relay

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"k8s.io/klog/v2"
)

// MaxStreams is how many calls one client connection may have open at once: podgate
// advertises it in SETTINGS_MAX_CONCURRENT_STREAMS and refuses a call over it with
// REFUSED_STREAM.
const MaxStreams = 1000

const (
	// streamWindow is the receive window podgate gives every stream, on both sides: the most of
	// one call's bytes it holds when the side they go to reads slower than the side they come
	// from. A CRI answer up to this size arrives without waiting for a window update.
	streamWindow = 4 << 20
	// connWindow is the receive window of each connection, all its streams together.
	connWindow = 64 << 20
	// initialWindow is HTTP/2's window before a SETTINGS frame says otherwise.
	initialWindow = 65535
	// maxHeaderList bounds a header block podgate decodes from a server (its
	// SETTINGS_MAX_HEADER_LIST_SIZE); a client's is Limits.MaxHeaderList.
	maxHeaderList = 1 << 20
	// maxFrame is the largest frame podgate reads (HTTP/2's default SETTINGS_MAX_FRAME_SIZE,
	// which it does not raise), so a frame it forwards fits any peer's.
	maxFrame = 16384
	// prefaceTimeout bounds the wait for a new client's HTTP/2 preface.
	prefaceTimeout = 20 * time.Second
	// readBuffer is each connection's own read buffer: two 16 KiB frames per read, what an idle
	// connection holds.
	readBuffer = 32 << 10
	// bigReadBuffer is the buffer a connection to a target reads into while a large answer
	// streams in: the frames of several of the target's writes whole in it, so that they leave
	// in one write (readBuf); taken from a pool and given back once all is read.
	bigReadBuffer = 128 << 10
)

// Target is a server podgate forwards calls to: the runtime, or its own gRPC server for the
// calls it intercepts.
type Target struct {
	// Name says which server it is, in errors ("runtime", "image").
	Name string
	// Dial connects to it. The relay makes one connection per client connection, so that a
	// client that stops reading holds up only its own calls.
	Dial func(ctx context.Context) (net.Conn, error)
	// Unavailable, when set, says why calls cannot be forwarded now (the runtime is down): the
	// call fails at once with that message rather than waiting for a dial.
	Unavailable func() error
	// Unary, when set, answers the target's calls in this process instead: the relay takes
	// the request's one message, runs Unary in a goroutine of its own with the call's
	// deadline (and its cancellation when the client resets it), and sends the answer within
	// the client's windows. Dial is not used then.
	Unary func(ctx context.Context, call *UnaryCall) *UnaryAnswer
	// Refuse, when set, answers every call of the target at once with its error's status,
	// from the call's headers, as a gRPC server answers a method it does not know: a streaming
	// client is not waited for, and nothing is dialled. It comes before Unary and Dial.
	Refuse func(path string) error
	// MaxMessage bounds a request message Unary takes, and an answer message Forward takes
	// from the target (default 4 MiB, gRPC's); a larger one is answered ResourceExhausted.
	MaxMessage int
}

func (t *Target) maxMessage() int {
	if t.MaxMessage > 0 {
		return t.MaxMessage
	}
	return 4 << 20
}

// Call is what the relay tells its observer about one call.
type Call struct {
	Path   string
	Target *Target
	// Header is the request's header fields, as the client sent them; not to be changed.
	Header []hpack.HeaderField
	// set holds the fields Set replaces or adds.
	set []hpack.HeaderField
}

// SetMetadata makes the call reach its target with md's keys set to md's values, in place of
// the client's fields of those names (a trace context of the observer's own, say), encoded as a
// gRPC client encodes outgoing metadata: keys in lower case, every value, binary ("-bin")
// values in base64; keys gRPC sets itself are left as the client sent them.
func (c *Call) SetMetadata(md metadata.MD) {
	c.set = append(c.set, metadataFields(md)...)
}

// Metadata is the call's header fields as the incoming metadata a gRPC server hands a handler:
// pseudo-headers (":authority") included, binary ("-bin") values decoded; a binary value that
// does not decode is an error, as on a gRPC server.
func (c *Call) Metadata() (metadata.MD, error) {
	md := make(metadata.MD, len(c.Header))
	for _, f := range c.Header {
		v, err := metadataValue(f)
		if err != nil {
			return nil, err
		}
		md[f.Name] = append(md[f.Name], v)
	}
	return md, nil
}

// metadataValue is a header field's value as gRPC metadata holds it: a binary ("-bin") one
// decoded.
func metadataValue(f hpack.HeaderField) (string, error) {
	if !strings.HasSuffix(f.Name, "-bin") {
		return f.Value, nil
	}
	b, err := decodeBinary(f.Value)
	if err != nil {
		return "", fmt.Errorf("malformed binary metadata %q in header %q", f.Value, f.Name)
	}
	return string(b), nil
}

// forwarded is the header block the call goes to its target with.
func (c *Call) forwarded() []hpack.HeaderField {
	if len(c.set) == 0 {
		return c.Header
	}
	out := make([]hpack.HeaderField, 0, len(c.Header)+len(c.set))
	for _, f := range c.Header {
		if !slices.ContainsFunc(c.set, func(s hpack.HeaderField) bool { return s.Name == f.Name }) {
			out = append(out, f)
		}
	}
	return append(out, c.set...)
}

// Observer sees every call the relay forwards (metrics, tracing).
type Observer interface {
	// Begin is called when a call's headers arrive, before it goes on; its result is handed
	// to End.
	Begin(c *Call) any
	// End is called once when the call ends, with its gRPC code.
	End(token any, code codes.Code)
}

// Server forwards HTTP/2 streams to Targets frame by frame: a DATA frame the runtime sends is
// on its way to the client before the runtime's next frame arrives, so a large answer costs one
// more hop's latency, not one more transfer of the whole message.
type Server struct {
	// Route returns where the call to path goes; nil answers it Unimplemented.
	Route func(path string) *Target
	// Observer, if set, sees every call.
	Observer Observer
	// LongLived says which calls Shutdown ends at once (Unavailable) instead of letting them
	// finish: streams, which end only when their client or server ends them.
	LongLived func(path string) bool
	// ShutdownMessage is the message of the Unavailable status those calls end with.
	ShutdownMessage string
	// Limits bound what clients can make the relay hold, and for how long.
	Limits Limits
	// Logger logs the clients that go over the limits or break HTTP/2, a line per connection
	// and at most one a second per reason; klog's global logger when unset.
	Logger klog.Logger
	// Refused, when set, is told each time the relay refuses a call or ends a connection of a
	// client, with the reason (one of Reasons): a metric's count.
	Refused func(reason string)

	initOnce sync.Once
	lim      Limits       // Limits with the defaults
	held     atomic.Int64 // bytes every session holds (Limits.TotalBytes)
	logs     logLimiter

	// lastUpstreamStreamID is the highest stream id a connection to a target takes before new
	// calls go on a fresh one; 0 is HTTP/2's own, 2^31−1. Tests set it small.
	lastUpstreamStreamID uint32

	mu   sync.Mutex
	open int // client connections accepted and not yet ended (Limits.MaxConnections)
	// lastShedLook is when shedStuck last looked for stuck connections, leaving what those
	// being closed held then.
	lastShedLook time.Time
	leaving      int64
	relooking    bool // a look is due once answers that wait now may count as stuck
	sessions     map[*session]struct{}
	listeners    map[net.Listener]struct{}
	stopping     bool
	quit         chan struct{} // closed by Shutdown: Serve's waits end
	conns        sync.WaitGroup
	handlers     sync.WaitGroup // the Unary targets' calls under way
}

// Serve accepts client connections on l and serves each until Shutdown. It returns nil after
// Shutdown, and Accept's error otherwise; Accept's passing failures (out of file descriptors
// or memory, a connection aborted before it was accepted) are waited out, as net/http does.
func (s *Server) Serve(l net.Listener) error {
	s.mu.Lock()
	if s.stopping {
		s.mu.Unlock()
		_ = l.Close()
		return nil
	}
	if s.listeners == nil {
		s.listeners = map[net.Listener]struct{}{}
		s.quit = make(chan struct{})
	}
	s.listeners[l] = struct{}{}
	quit := s.quit
	s.mu.Unlock()
	var backoff time.Duration
	for {
		c, err := l.Accept()
		if err != nil {
			s.mu.Lock()
			stopping := s.stopping
			if stopping || !passing(err) {
				delete(s.listeners, l)
			}
			s.mu.Unlock()
			if stopping {
				return nil
			}
			if !passing(err) {
				return err
			}
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			select {
			case <-time.After(backoff):
			case <-quit:
			}
			continue
		}
		backoff = 0
		s.init()
		s.mu.Lock()
		if s.stopping {
			s.mu.Unlock()
			_ = c.Close()
			continue
		}
		if s.open >= s.lim.MaxConnections {
			s.mu.Unlock()
			s.reportRefusal(peerCred(c), new(sync.Once), refusal{ReasonConnectionCap, fmt.Sprintf("connected while %d connections were open", s.lim.MaxConnections), "closed the connection"})
			_ = c.Close()
			continue
		}
		s.open++
		s.conns.Add(1)
		s.mu.Unlock()
		go func() {
			defer s.conns.Done()
			// What a client did wrong is reported by ServeConn; what is left is its own
			// affair (a connection it broke), logged for the curious.
			if err := s.ServeConn(context.Background(), c); err != nil {
				s.logger().V(4).Info("CRI client connection ended", "err", err)
			}
			s.mu.Lock()
			s.open--
			s.mu.Unlock()
		}()
	}
}

// init settles the limits, once.
func (s *Server) init() {
	s.initOnce.Do(func() { s.lim = s.Limits.withDefaults() })
}

// passing says whether an Accept error goes away by itself.
func passing(err error) bool {
	for _, errno := range []syscall.Errno{syscall.EMFILE, syscall.ENFILE, syscall.ENOBUFS, syscall.ENOMEM, syscall.ECONNABORTED, syscall.EINTR} {
		if errors.Is(err, errno) {
			return true
		}
	}
	return false
}

// Shutdown stops accepting connections, tells every client to open no more calls (GOAWAY),
// ends the LongLived calls with Unavailable, and lets the others finish until ctx ends; then
// it closes what is left, which cancels the Unary targets' calls still under way. It returns
// once every connection has ended and every Unary call has returned, so that no handler's work
// outlives it.
func (s *Server) Shutdown(ctx context.Context) {
	s.mu.Lock()
	if !s.stopping && s.quit != nil {
		close(s.quit)
	}
	s.stopping = true
	for l := range s.listeners {
		_ = l.Close()
	}
	sessions := make([]*session, 0, len(s.sessions))
	for ss := range s.sessions {
		sessions = append(sessions, ss)
	}
	s.mu.Unlock()
	var drains sync.WaitGroup
	defer drains.Wait()
	for _, ss := range sessions {
		// In goroutines: a client that does not read holds its own drain up, not Shutdown,
		// which closes its connection when ctx ends.
		drains.Go(ss.drain)
	}
	done := make(chan struct{})
	go func() {
		s.conns.Wait()
		close(done)
	}()
	defer s.handlers.Wait()
	select {
	case <-done:
		return
	case <-ctx.Done():
	}
	s.mu.Lock()
	for ss := range s.sessions {
		ss.down.out.close()
	}
	s.mu.Unlock()
	<-done
}

func (s *Server) addSession(ss *session) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopping {
		return false
	}
	if s.sessions == nil {
		s.sessions = map[*session]struct{}{}
	}
	s.sessions[ss] = struct{}{}
	return true
}

func (s *Server) removeSession(ss *session) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.sessions, ss)
}

// ServeConn serves one client connection until it ends or ctx ends. What the client did wrong
// (a limit it went over, a frame that breaks HTTP/2) is reported (Logger, Refused) before it
// returns; its error is the connection's end, nil when the client or Shutdown closed it.
func (s *Server) ServeConn(ctx context.Context, c net.Conn) error {
	defer c.Close()
	s.init()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ss := &session{srv: s, ctx: ctx, streams: map[uint32]*stream{}, ups: map[*Target]*upstream{}, upConns: map[*upstream]struct{}{}}
	ss.down = newConn(c, s.lim.MaxHeaderList, false, ss.hooks(nil))
	defer ss.down.out.close() // the sender's end, on every way out
	ss.peer = peerCred(c)
	if !s.addSession(ss) {
		return nil
	}
	defer s.removeSession(ss)
	stop := context.AfterFunc(ctx, ss.down.out.close)
	defer stop()
	err := ss.serve()
	ss.ended(err)
	if errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}

// hooks is what the senders of the session's connections tell it: of the client's (u nil),
// whose writes WriteTimeout bounds, or of u's, whose writes nothing bounds (the runtime reads
// whatever its handlers do, and what podgate sends it is bounded by its windows).
func (ss *session) hooks(u *upstream) senderHooks {
	h := senderHooks{hold: ss.hold, ended: ss.wayEnded, reset: ss.streamReset}
	if u != nil {
		h.broke = func(code http2.ErrCode, _ string) {
			// Its reader finds the connection closed: the calls on it end (upstreamFailed).
			u.c.out.put(event{kind: evGoAway, code: code, held: goAwaySize})
			u.c.out.closeAfterFlush(closeGrace)
		}
		return h
	}
	h.timeout, h.stalled = ss.srv.lim.WriteTimeout, ss.stalled
	h.broke = func(code http2.ErrCode, reason string) {
		ss.report(refusal{ReasonProtocol, reason, fmt.Sprintf("GOAWAY %v, closed the connection", code)})
		ss.goAway(code)
		ss.down.out.closeAfterFlush(closeGrace)
	}
	return h
}

// serve reads the client's preface, sends podgate's SETTINGS and serves the connection until it
// ends.
func (ss *session) serve() error {
	c, lim := ss.down.nc, &ss.srv.lim
	// A client says the preface at once; one that does not holds no goroutine for long.
	_ = c.SetReadDeadline(time.Now().Add(prefaceTimeout))
	preface := make([]byte, len(http2.ClientPreface))
	if _, err := io.ReadFull(ss.down.rb, preface); err != nil {
		return prefaceError{fmt.Errorf("read client preface: %w", err)}
	}
	if string(preface) != http2.ClientPreface {
		return prefaceError{errors.New("not an HTTP/2 client preface")}
	}
	_ = c.SetReadDeadline(time.Time{})
	// SETTINGS first, before a GOAWAY of a Shutdown that began meanwhile (drain writes it
	// only once started is set, and after these).
	ss.mu.Lock()
	if ss.draining {
		ss.mu.Unlock()
		return nil
	}
	ss.started = true
	ss.idleSince = time.Now()
	ss.down.out.put(event{kind: evPreface, settings: []http2.Setting{
		{ID: http2.SettingMaxConcurrentStreams, Val: MaxStreams},
		{ID: http2.SettingInitialWindowSize, Val: streamWindow},
		{ID: http2.SettingMaxHeaderListSize, Val: lim.MaxHeaderList},
	}})
	ss.mu.Unlock()
	ss.down.out.kick()
	ss.startWatch()
	err := ss.readClient()
	ss.close()
	return err
}

// prefaceError is a client's connection that did not begin with HTTP/2's preface.
type prefaceError struct{ error }

func (e prefaceError) Unwrap() error { return e.error }

// ended reports what the client did when its connection ended with err: a preface that did
// not come, a frame that broke HTTP/2.
func (ss *session) ended(err error) {
	var pe prefaceError
	switch code, goAway := goAwayCode(err); {
	case err == nil || errors.Is(err, net.ErrClosed):
	case errors.As(err, &pe):
		if !errors.Is(err, io.EOF) {
			ss.report(refusal{ReasonPreface, pe.Error(), "closed the connection"})
		}
	case goAway:
		ss.report(refusal{ReasonProtocol, err.Error(), fmt.Sprintf("GOAWAY %v, closed the connection", code)})
	}
}
