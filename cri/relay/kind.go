package relay

// The kinds of stream the relay carries.

import (
	"golang.org/x/net/http2/hpack"
)

// streamKind is what differs between the kinds of stream: where a call's request goes and
// where its answer comes from. The flow functions hand a stream's frames to its kind, so that
// none of them tests which kind of stream it holds. The kinds are an interface rather than a
// struct of handlers because each is already a type with state of its own (the request's
// bytes, the handler's wait), and an interface value of an empty struct costs the passthrough
// nothing.
type streamKind interface {
	// data takes bytes of s coming its way w from a connection: it returns the stream at the
	// sender they go on to (the caller lends them), or nil when the kind took them itself. mu
	// is held.
	data(ss *session, s *stream, w *way, p []byte, end bool) (*sendStream, after)
	// headers takes a header block of s coming its way w from a connection (the request's
	// trailers; the answer's headers or trailers). mu is held.
	headers(ss *session, s *stream, w *way, fields []hpack.HeaderField, end bool) after
	// stop is the kind s becomes when its server answered whole and reset the request: the
	// answer still goes out, what comes for the server does not. mu is held.
	stop() streamKind
	// removed is told that s is forgotten. mu is held.
	removed()
	// abort tells whoever waits for s's answer that s ended without it, with err (a gRPC
	// status); it says whether that is the client, for the caller to tell on the client's
	// stream. mu is held.
	abort(err error) (client bool)
}

// relayed is what the kinds do unless they do otherwise: pass each way on to its sender, and
// nothing more when the stream ends. The kinds embed it.
type relayed struct{}

func (relayed) data(_ *session, _ *stream, w *way, _ []byte, _ bool) (*sendStream, after) {
	return w.to, after{}
}

func (relayed) headers(ss *session, _ *stream, w *way, fields []hpack.HeaderField, end bool) after {
	return ss.headersLocked(w, fields, end)
}

func (relayed) removed()         {}
func (relayed) abort(error) bool { return true }

// passthrough is a call the relay passes between the client and a server, both ways, frame by
// frame: the relay's usual call.
type passthrough struct{ relayed }

func (passthrough) stop() streamKind { return answered{} }

// answered is a call whose answer is settled while the client may still send: the relay
// answered it itself (a status), or its server answered whole and reset the request. What the
// client still sends is dropped, and its window given back at once, as a server does.
type answered struct{ relayed }

func (answered) data(ss *session, s *stream, w *way, p []byte, end bool) (*sendStream, after) {
	if w != &s.req {
		return w.to, after{}
	}
	return nil, ss.dropLocked(s, int64(len(p)), end)
}

func (answered) headers(ss *session, s *stream, w *way, fields []hpack.HeaderField, end bool) after {
	if w != &s.req {
		return ss.headersLocked(w, fields, end)
	}
	return ss.dropLocked(s, 0, end)
}

func (answered) stop() streamKind { return answered{} }

// data takes the request's bytes of a call answered in the process, and runs the handler
// once they are all there.
func (u *unaryCall) data(ss *session, s *stream, _ *way, p []byte, end bool) (*sendStream, after) {
	return nil, ss.unaryRequestLocked(s, u, p, end)
}

func (u *unaryCall) headers(ss *session, s *stream, _ *way, _ []hpack.HeaderField, end bool) after {
	return ss.unaryRequestLocked(s, u, nil, end)
}

func (u *unaryCall) stop() streamKind { return u }
func (u *unaryCall) removed() {
	if u.cancel != nil {
		u.cancel() // the handler's call ends with it
	}
}

// data takes the answer of a forwarded call for the handler that waits for it.
func (fw *forwarded) data(ss *session, s *stream, _ *way, p []byte, end bool) (*sendStream, after) {
	return nil, ss.collectLocked(s, fw, item{data: p, end: end})
}

func (fw *forwarded) headers(ss *session, s *stream, _ *way, fields []hpack.HeaderField, end bool) after {
	return ss.collectLocked(s, fw, item{headers: fields, end: end})
}

func (fw *forwarded) stop() streamKind { return fw }

// abort ends the handler's wait: a forwarded call has no client stream of its own.
func (fw *forwarded) abort(err error) bool {
	fw.end(err)
	return false
}
