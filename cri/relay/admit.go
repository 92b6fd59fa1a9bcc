package relay

// A client's header blocks: the new call they open, and whether the relay admits it (its
// stream ID, the session's stream cap, the memory budget, a POST with a path), or the
// trailers that end a call's request; and the RFC 9113 §5.1 states of the client's streams
// that decide which late frames are errors and which are ignored.

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// clientHeaders starts a call, or forwards the client's trailers.
func (ss *session) clientHeaders(f *http2.MetaHeadersFrame) error {
	id := f.StreamID
	ss.mu.Lock()
	if s := ss.streams[id]; s != nil {
		a := ss.clientTrailersLocked(s, f)
		ss.mu.Unlock()
		ss.after(ss.down, a)
		return nil
	}
	if id <= ss.lastID && !ss.wasReset(id) && ss.wasClosed(id) {
		// RFC 9113 §5.1, closed: a frame after both ends' END_STREAM is a connection error of
		// type STREAM_CLOSED (after a reset, it is one the client may have sent before it knew).
		ss.mu.Unlock()
		return connError{http2.ErrCodeStreamClosed, fmt.Sprintf("HEADERS on closed stream %d", id)}
	}
	open, full, err := ss.admitLocked(id)
	ss.mu.Unlock()
	switch {
	case !open:
		return err
	case full:
		ss.rstClient(id, http2.ErrCodeRefusedStream)
		return nil
	}
	path := f.PseudoValue("path")
	switch method := f.PseudoValue("method"); {
	case f.Truncated:
		ss.report(refusal{ReasonHeaderList, fmt.Sprintf("sent a header block over SETTINGS_MAX_HEADER_LIST_SIZE (%d bytes decoded)", ss.srv.lim.MaxHeaderList), "RST_STREAM PROTOCOL_ERROR"})
		ss.rstClient(id, http2.ErrCodeProtocol)
		return nil
	case method != "POST":
		ss.notPost(f, method)
		return nil
	case path == "":
		ss.rstClient(id, http2.ErrCodeProtocol)
		return nil
	}
	arrived := time.Now()
	s := ss.newClientStream(id, path, f.StreamEnded())
	if !ss.admitBytes(s, f) {
		return nil
	}
	return ss.start(s, f, arrived)
}

// admitLocked says whether the client's header block on id opens a new stream, and whether
// that is refused because the session is full or draining; a block that opens none is a
// connection error, or left alone when podgate reset the stream lately. mu is held.
func (ss *session) admitLocked(id uint32) (open, full bool, err error) {
	switch {
	case id%2 == 1 && id <= ss.lastID && ss.wasReset(id):
		return false, false, nil // trailers the client sent before it learnt of podgate's reset
	case id%2 == 0 || id <= ss.lastID:
		return false, false, connError{http2.ErrCodeProtocol, fmt.Sprintf("stream %d is not a new client stream", id)}
	}
	ss.lastID = id
	return true, len(ss.streams) >= MaxStreams || ss.draining, nil
}

// streamCost is what the relay holds for an open call besides its header block (the stream,
// its kind, the maps that find it, the header block's metadata), as measured
// (TestHeaderOnlyStreamsChargedWhatTheyHold: about 1.5 KiB), with room to spare: a call whose request never comes is
// charged what it holds.
const streamCost = 2048

// admitBytes counts the call's header block and streamCost against the budget; a call over the
// budget is refused before it is read (REFUSED_STREAM: the client may retry it).
func (ss *session) admitBytes(s *stream, f *http2.MetaHeadersFrame) bool {
	n := headerListSize(f.Fields) + streamCost
	ss.mu.Lock()
	reason := ss.chargeLocked(s, n)
	held := ss.held.Load()
	ss.mu.Unlock()
	if reason == "" {
		return true
	}
	ss.report(refusal{reason, fmt.Sprintf("opened a call of %s while its connection held %d bytes and all of them %d", clip(s.path), held, ss.srv.held.Load()), "RST_STREAM REFUSED_STREAM"})
	ss.rstClient(s.downID, http2.ErrCodeRefusedStream)
	return false
}

// grpcTimeout is a header block's grpc-timeout; false without one, or with one that does not
// parse (whose call podgate answers, or its server).
func grpcTimeout(fields []hpack.HeaderField) (time.Duration, bool) {
	v := headerValue(fields, "grpc-timeout")
	if v == "" {
		return 0, false
	}
	d, err := parseTimeout(v)
	return d, err == nil
}

// notPost answers a request whose method is not POST as gRPC's server does: HTTP 405 with
// Internal (415 with InvalidArgument when it is not gRPC's content type at all), and a
// RST_STREAM NO_ERROR after it when the client has not ended the request.
func (ss *session) notPost(f *http2.MetaHeadersFrame, method string) {
	ct := headerValue(f.Fields, "content-type")
	httpStatus, code := "405", codes.Internal
	msg := fmt.Sprintf("Received a HEADERS frame with :method %q which should be POST", clip(method))
	if ct != "application/grpc" && !strings.HasPrefix(ct, "application/grpc+") && !strings.HasPrefix(ct, "application/grpc;") {
		httpStatus, code = "415", codes.InvalidArgument
		msg = fmt.Sprintf("invalid gRPC request content-type %q", clip(ct))
		ct = "application/grpc"
	}
	fields := []hpack.HeaderField{{Name: ":status", Value: httpStatus}, {Name: "content-type", Value: ct}}
	fields = append(fields, statusFields(status.New(code, msg))...)
	id := f.StreamID
	st := newSendStream(ss.down.out, id, nil, creditTo{}, true)
	ss.mu.Lock()
	ss.down.out.put(event{kind: evHeaders, st: st, fields: fields, end: true, response: true, held: headerListSize(fields)})
	if f.StreamEnded() {
		ss.noteClosedLocked(id)
	} else {
		ss.rstClientLocked(id, http2.ErrCodeNo)
	}
	ss.mu.Unlock()
	ss.down.touch(ss.down.out)
}

// clientTrailersLocked takes the client's trailers on s: they end its request. mu is held.
func (ss *session) clientTrailersLocked(s *stream, f *http2.MetaHeadersFrame) after {
	switch {
	case s.req.done:
		return after{reset: s, code: http2.ErrCodeStreamClosed} // half-closed (remote), §5.1
	case !f.StreamEnded():
		return after{reset: s, code: http2.ErrCodeProtocol}
	}
	ss.wholeLocked(s)
	s.req.recv.shut.Store(true)
	return s.kind.headers(ss, s, &s.req, f.Fields, true)
}

// newClientStream is a client's new call before it is routed.
func (ss *session) newClientStream(id uint32, path string, ended bool) *stream {
	s := &stream{downID: id, path: path}
	s.req = way{from: ss.down, fromID: id, recv: s.recvWin(0, streamWindow), done: ended}
	return s
}

// rstClient resets the client's stream id, which has no stream at the sender (a call refused
// before it began, or forgotten), and remembers it, so that the frames the client sent before
// it learnt of the reset are ignored, as HTTP/2 wants.
func (ss *session) rstClient(id uint32, code http2.ErrCode) {
	ss.mu.Lock()
	ss.rstClientLocked(id, code)
	ss.mu.Unlock()
	ss.down.touch(ss.down.out)
}

// rstClientLocked is rstClient under mu; the caller kicks the client's sender.
func (ss *session) rstClientLocked(id uint32, code http2.ErrCode) {
	ss.noteResetLocked(id)
	ss.down.out.put(event{kind: evRST, id: id, code: code, response: true, held: rstSize})
}

// noteReset remembers that podgate reset the client's stream id.
func (ss *session) noteReset(id uint32) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	ss.noteResetLocked(id)
}

// noteResetLocked is noteReset under mu.
func (ss *session) noteResetLocked(id uint32) {
	ss.resets[ss.nreset%len(ss.resets)] = id
	ss.nreset++
}

// noteClosedLocked remembers that the client's stream id closed after the client ended or
// reset it. mu is held.
func (ss *session) noteClosedLocked(id uint32) {
	ss.closedIDs[ss.nclosed%len(ss.closedIDs)] = id
	ss.nclosed++
}

// wasClosed says whether the client's stream id closed lately after the client ended or reset
// it. mu is held.
func (ss *session) wasClosed(id uint32) bool {
	return id != 0 && slices.Contains(ss.closedIDs[:], id)
}

// wasReset says whether podgate reset the client's stream id lately. mu is held.
func (ss *session) wasReset(id uint32) bool {
	return slices.Contains(ss.resets[:], id)
}
