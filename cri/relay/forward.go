package relay

// A call that a Unary target's handler sends on to another target (the runtime), on the
// client's own connection to it: the one its passed-through calls take.

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// forwarded is the kind of a forwarded call's stream, and its answer as it arrives, for the
// handler that waits for it.
type forwarded struct {
	relayed // its request goes to the server as a client's would
	done    chan struct{}
	once    sync.Once
	// limit bounds the answer's message.
	limit int
	// Under the session's mu until done is closed, the handler's after:
	header, trailer []hpack.HeaderField
	body            []byte
	err             error // set when the call failed below gRPC (reset, connection lost)
}

// end ends the call with err (nil: the answer came whole); the first end counts.
func (fw *forwarded) end(err error) {
	fw.once.Do(func() {
		fw.err = err
		close(fw.done)
	})
}

// Forward sends the call on to t with msg as its message, on the client connection's own
// connection to t (the one its passed-through calls take), and returns t's answer: its header
// and trailer metadata, its message, its status. The call goes with the client's header fields,
// md's keys set in place of the client's (as Call.SetMetadata does) and the time left of ctx as
// its grpc-timeout; ctx's end resets it (Canceled or DeadlineExceeded). An answer message
// larger than t.MaxMessage is refused (ResourceExhausted).
func (c *UnaryCall) Forward(ctx context.Context, t *Target, md metadata.MD, msg []byte) *UnaryAnswer {
	ss := c.ss
	switch {
	case ss == nil:
		return &UnaryAnswer{Err: status.Error(codes.Internal, "relay: Forward of a call the relay did not dispatch")}
	case ctx.Err() != nil:
		return &UnaryAnswer{Err: status.FromContextError(ctx.Err()).Err()}
	case uint64(len(msg)) > math.MaxUint32:
		return &UnaryAnswer{Err: status.Errorf(codes.ResourceExhausted, "a request of %d bytes", len(msg))}
	}
	if t.Unavailable != nil {
		if err := t.Unavailable(); err != nil {
			return &UnaryAnswer{Err: status.Error(codes.Unavailable, status.Convert(err).Message())}
		}
	}
	fields := c.forwardFields(ctx, md)
	fw := &forwarded{done: make(chan struct{}), limit: t.maxMessage()}
	s := &stream{path: c.Path, kind: fw}
	var opened error
	err := ss.onUpstream(t, func(up *upstream) {
		opened = ss.openForwardLocked(s, up, fields)
	})
	if err == nil {
		err = opened
	}
	if err != nil {
		return &UnaryAnswer{Err: status.Error(codes.Unavailable, status.Convert(err).Message())}
	}
	framed := make([]byte, 5+len(msg))
	binary.BigEndian.PutUint32(framed[1:5], uint32(len(msg)))
	copy(framed[5:], msg)
	ss.send(s, &s.req, item{data: framed, end: true})

	select {
	case <-fw.done:
	case <-ctx.Done():
		ss.resetStream(s, http2.ErrCodeCancel, false, true, http2.ErrCodeCancel)
		return &UnaryAnswer{Err: status.FromContextError(ctx.Err()).Err()}
	}
	return fw.result()
}

// openForwardLocked opens s, a forwarded call, on up and puts its header block. mu is held.
func (ss *session) openForwardLocked(s *stream, up *upstream, fields []hpack.HeaderField) error {
	t := up.target
	switch {
	case ss.closed:
		return status.Error(codes.Unavailable, "client connection ended")
	case up.gone:
		return status.Errorf(codes.Unavailable, "connection to %s ended", t.Name)
	case up.maxStreams > 0 && uint32(len(up.streams)) >= up.maxStreams:
		return status.Errorf(codes.Unavailable, "%s allows %d calls at once on a connection", t.Name, up.maxStreams)
	}
	s.up, s.upID = up, up.nextID
	up.nextID += 2
	// The handler sends the request whole; the answer comes to it (to nil).
	s.req = way{to: s.sendOn(0, up.c.out, s.upID, creditTo{}, false)}
	s.ans = way{from: up.c, fromID: s.upID, recv: s.recvWin(1, streamWindow)}
	up.streams[s.upID] = s
	up.c.out.put(event{kind: evHeaders, st: s.req.to, fields: fields, held: headerListSize(fields)})
	return nil
}

// forwardFields is the header block a forwarded call goes with: the client's, md set in it,
// the deadline ctx's, and no compression accepted (the answer is read here, not passed on).
func (c *UnaryCall) forwardFields(ctx context.Context, md metadata.MD) []hpack.HeaderField {
	call := &Call{Header: c.fields}
	call.SetMetadata(md)
	fields := slices.DeleteFunc(slices.Clone(call.forwarded()), func(f hpack.HeaderField) bool {
		return f.Name == "grpc-timeout" || f.Name == "grpc-accept-encoding"
	})
	if dl, ok := ctx.Deadline(); ok {
		fields = append(fields, hpack.HeaderField{Name: "grpc-timeout", Value: encodeTimeout(time.Until(dl))})
	}
	return fields
}

// collectLocked takes it, from the target, for the handler that waits for the answer; the
// bytes are taken at once, so their window goes back at once. mu is held.
func (ss *session) collectLocked(s *stream, fw *forwarded, it item) after {
	var a after
	a.kick(s.ans.from.give(s.ans.fromID, s.ans.recv, int64(len(it.data))))
	var fail error
	switch {
	case it.headers != nil && fw.header == nil:
		fw.header = it.headers
	case it.headers != nil:
		fw.trailer = it.headers
	case len(fw.body)+len(it.data) > 5+fw.limit:
		fail = status.Errorf(codes.ResourceExhausted, "received message larger than max (%d)", fw.limit)
	default:
		fw.body = append(fw.body, it.data...)
		if len(fw.body) >= 5 {
			// The prefix says how much comes: room for it at once, within the limit.
			n := min(int(binary.BigEndian.Uint32(fw.body[1:5])), fw.limit)
			if more := 5 + n - len(fw.body); more > 0 {
				fw.body = slices.Grow(fw.body, more)
			}
		}
	}
	if fail != nil {
		// The first end counts: the handler sees fail, and the server is told CANCEL.
		fw.end(fail)
		a.reset, a.code = s, http2.ErrCodeCancel
		return a
	}
	if !it.end {
		return a
	}
	s.ans.closed = true
	ss.endLocked(s, &a)
	a.ended = nil // a forwarded call has no observer of its own
	fw.end(nil)
	return a
}

// result reads the answer that came: a gRPC status, metadata, the message.
func (fw *forwarded) result() *UnaryAnswer {
	if fw.err != nil {
		return &UnaryAnswer{Err: fw.err}
	}
	header, trailer := fw.header, fw.trailer
	if trailer == nil {
		header, trailer = nil, header // a trailers-only answer
	}
	a := &UnaryAnswer{Header: answerMetadata(header), Trailer: answerMetadata(trailer)}
	for _, block := range [][]hpack.HeaderField{header, trailer} {
		if block == nil {
			continue
		}
		if v := headerValue(block, ":status"); v != "" && v != "200" {
			a.Err = status.Errorf(httpStatusCode(v), "unexpected HTTP status %s", v)
			return a
		}
	}
	st, err := trailerStatus(trailer)
	if err != nil {
		a.Err = err
		return a
	}
	if st.Code() != codes.OK {
		a.Err = st.Err()
		return a
	}
	switch b := fw.body; {
	case len(b) < 5:
		a.Err = status.Error(codes.Internal, "the answer has no message")
	case b[0] != 0:
		a.Err = status.Error(codes.Internal, "the answer is compressed; podgate asked for none")
	case int(binary.BigEndian.Uint32(b[1:5])) != len(b)-5:
		a.Err = status.Errorf(codes.Internal, "the answer's message is %d bytes, its prefix says %d", len(b)-5, binary.BigEndian.Uint32(b[1:5]))
	default:
		a.Message = b[5:]
	}
	return a
}

// trailerStatus is the status the trailers carry.
func trailerStatus(trailer []hpack.HeaderField) (*status.Status, error) {
	code, ok := grpcStatusCode(trailer)
	if !ok {
		return nil, status.Errorf(codes.Internal, "the answer ended without a valid grpc-status (%q)", headerValue(trailer, "grpc-status"))
	}
	if d := headerValue(trailer, "grpc-status-details-bin"); d != "" {
		b, err := decodeBinary(d)
		p := new(spb.Status)
		if err == nil && proto.Unmarshal(b, p) == nil && p.GetCode() == int32(code) {
			return status.FromProto(p), nil
		}
	}
	return status.New(code, decodeGrpcMessage(headerValue(trailer, "grpc-message"))), nil
}

// grpcStatusCode is the code a header block's grpc-status carries; false without a valid one.
func grpcStatusCode(block []hpack.HeaderField) (codes.Code, bool) {
	n, err := strconv.ParseUint(headerValue(block, "grpc-status"), 10, 32)
	return codes.Code(n), err == nil
}

// answerMetadata is an answer's header block as the metadata a gRPC client hands its caller:
// pseudo-headers and the headers gRPC sets itself left out, binary values decoded (one that
// does not decode is left out).
func answerMetadata(block []hpack.HeaderField) metadata.MD {
	if len(block) == 0 {
		return nil
	}
	md := metadata.MD{}
	for _, f := range block {
		if GRPCSetsItself(f.Name) {
			continue
		}
		if v, err := metadataValue(f); err == nil {
			md[f.Name] = append(md[f.Name], v)
		}
	}
	return md
}

// httpStatusCode is the gRPC code of an HTTP status other than 200, as gRPC maps it.
func httpStatusCode(v string) codes.Code {
	switch v {
	case "400":
		return codes.Internal
	case "401":
		return codes.Unauthenticated
	case "403":
		return codes.PermissionDenied
	case "404":
		return codes.Unimplemented
	case "429", "502", "503", "504":
		return codes.Unavailable
	}
	return codes.Unknown
}

// decodeGrpcMessage undoes grpc-message's percent-encoding; a malformed one is taken as it is.
func decodeGrpcMessage(v string) string {
	if !strings.Contains(v, "%") {
		return v
	}
	if s, err := url.PathUnescape(v); err == nil {
		return s
	}
	return v
}

// encodeTimeout is d as a grpc-timeout value: at most 8 digits, in the finest unit that holds
// it, rounded up.
func encodeTimeout(d time.Duration) string {
	if d <= 0 {
		return "0n"
	}
	const most = 1e8 - 1
	for _, u := range []struct {
		d    time.Duration
		unit string
	}{{time.Nanosecond, "n"}, {time.Microsecond, "u"}, {time.Millisecond, "m"}, {time.Second, "S"}, {time.Minute, "M"}, {time.Hour, "H"}} {
		n := d / u.d
		if d%u.d != 0 {
			n++
		}
		if n <= most || u.unit == "H" {
			return fmt.Sprintf("%d%s", min(n, most), u.unit)
		}
	}
	panic("unreachable")
}
