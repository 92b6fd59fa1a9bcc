package relay

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"strconv"
	"strings"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// UnaryCall is a unary call that a Target answers in the relay's own process (Target.Unary).
type UnaryCall struct {
	// Path is the call's method, "/service/Method".
	Path string
	// Header holds the request's header fields as grpc-go's server hands them to a handler:
	// pseudo-headers (":authority") included, binary ("-bin") values decoded.
	Header metadata.MD
	// Message is the request message, without gRPC's 5-byte prefix.
	Message []byte

	ss     *session            // the client connection it came on (Forward)
	fields []hpack.HeaderField // its header block, as the client sent it
}

// UnaryAnswer is a Target's answer to a UnaryCall.
type UnaryAnswer struct {
	// Header and Trailer are sent with the answer, as grpc.SetHeader and grpc.SetTrailer would.
	Header, Trailer metadata.MD
	// Message is the answer's message, without gRPC's prefix; ignored when Err is set.
	Message []byte
	// Err is the call's status (status.FromError), nil for OK.
	Err error
}

// unaryCall is the kind of a stream a Target answers in the process: the request as it
// arrives, then the handler's run.
type unaryCall struct {
	relayed // its answer goes to the client as a server's would
	target  *Target
	header  metadata.MD
	fields  []hpack.HeaderField
	// deadline is the client's grpc-timeout, zero without one.
	deadline    time.Time
	contentType string
	buf         []byte
	// charged is what the request is charged for: its bytes as they come, and once its length
	// prefix has come, the whole message it announces, for which buf is made at once.
	charged int64
	cancel  context.CancelFunc
}

// startUnary begins a call that t answers in the process; called from clientHeaders for a new
// stream not yet registered.
func (ss *session) startUnary(s *stream, f *http2.MetaHeadersFrame, t *Target) {
	u := &unaryCall{target: t, contentType: "application/grpc"}
	for _, hf := range f.Fields {
		switch {
		case hf.Name == "grpc-timeout":
			d, err := parseTimeout(hf.Value)
			if err != nil {
				ss.answerLocal(s, codes.Internal, err.Error())
				return
			}
			u.deadline = time.Now().Add(d)
		case hf.Name == "content-type" && strings.HasPrefix(hf.Value, "application/grpc"):
			u.contentType = hf.Value
		}
	}
	md, err := (&Call{Header: f.Fields}).Metadata()
	if err != nil {
		ss.answerLocal(s, codes.Internal, err.Error())
		return
	}
	u.header, u.fields = md, f.Fields
	s.kind = u
	ss.mu.Lock()
	a := ss.openUnaryLocked(s, u)
	ss.mu.Unlock()
	ss.after(ss.down, a)
}

// openUnaryLocked registers s, answered in the process by u, and runs the handler when the
// request is already whole. mu is held.
func (ss *session) openUnaryLocked(s *stream, u *unaryCall) after {
	if ss.closed {
		ss.removeLocked(s, noRST, noRST)
		return after{ended: s}
	}
	s.ans.to = s.sendOn(1, ss.down.out, s.downID, creditTo{}, true)
	ss.down.out.put(event{kind: evOpen, st: s.ans.to})
	ss.streams[s.downID] = s
	if s.req.done {
		return ss.dispatchLocked(s, u)
	}
	return after{}
}

// unaryRequestLocked takes the request's bytes of a call answered in the process: they are
// consumed as they come (their window goes back at once). mu is held.
//
// What it holds counts against the budget: once the length prefix has come, the whole message
// it announces, for which the buffer is made at once (a buffer grown by appending would hold
// up to twice its bytes, and leave its old arrays to the collector). A request over the budget,
// or whose length prefix says more than the message limit, is answered ResourceExhausted at
// once, not at its end.
func (ss *session) unaryRequestLocked(s *stream, u *unaryCall, p []byte, end bool) after {
	var a after
	a.kick(s.req.from.give(s.req.fromID, s.req.recv, int64(len(p))))
	limit := u.target.maxMessage()
	had := len(u.buf)
	var n uint32
	if had < 5 && had+len(p) >= 5 {
		var prefix [5]byte
		copy(prefix[copy(prefix[:], u.buf):], p)
		if n = binary.BigEndian.Uint32(prefix[1:5]); int64(n) > int64(limit) {
			return ss.refuseLocked(s, a, codes.ResourceExhausted, fmt.Sprintf("received message larger than max (%d vs. %d)", n, limit),
				refusal{ReasonMessageTooLarge, fmt.Sprintf("announced a message of %d bytes for %s", n, clip(s.path)), "answered ResourceExhausted"})
		}
	}
	want := int64(had + len(p))
	if n > 0 {
		want = max(want, 5+int64(n))
	}
	if more := want - u.charged; more > 0 {
		if reason := ss.chargeLocked(s, more); reason != "" {
			return ss.refuseLocked(s, a, codes.ResourceExhausted, fmt.Sprintf("podgate holds too much for its clients' requests (%s)", reason),
				refusal{reason, fmt.Sprintf("sent %d bytes of a request of %s announcing %d while its connection held %d bytes", had+len(p), clip(s.path), want, ss.held.Load()), "answered ResourceExhausted"})
		}
		u.charged = want
	}
	if len(u.buf)+len(p) > 5+limit {
		return ss.refuseLocked(s, a, codes.ResourceExhausted, fmt.Sprintf("received message larger than max (%d)", limit),
			refusal{ReasonMessageTooLarge, fmt.Sprintf("sent more than %d bytes for %s", limit, clip(s.path)), "answered ResourceExhausted"})
	}
	if n > 0 && cap(u.buf) < int(want) {
		u.buf = append(make([]byte, 0, want), u.buf...)
	}
	u.buf = append(u.buf, p...)
	if end {
		b := ss.dispatchLocked(s, u)
		b.merge(a)
		return b
	}
	return a
}

// refuseLocked answers s with a status before its request ended and resets it (NO_ERROR), as
// gRPC's server does: what the client still sends on it is dropped, and the bytes s held go
// back. r is reported. mu is held.
func (ss *session) refuseLocked(s *stream, a after, code codes.Code, msg string, r refusal) after {
	b := ss.answerLocalLocked(s, code, msg)
	b.merge(a)
	if !s.removed {
		s.ans.closed = true // the status goes out: the reset comes after it
		ss.removeLocked(s, rst(http2.ErrCodeNo), noRST)
		ss.noteResetLocked(s.downID)
		b.ended = s
	}
	b.note = &r
	return b
}

// dispatchLocked readies the target's handler to run on the whole request, in a goroutine of
// its own once mu is let go, and to answer the client when it returns. mu is held.
func (ss *session) dispatchLocked(s *stream, u *unaryCall) after {
	ss.wholeLocked(s)
	s.req.closed = true
	var ctx context.Context
	var cancel context.CancelFunc
	if u.deadline.IsZero() {
		ctx, cancel = context.WithCancel(ss.ctx)
	} else {
		ctx, cancel = context.WithDeadline(ss.ctx, u.deadline)
	}
	u.cancel = cancel
	msg, err := u.message()
	call := &UnaryCall{Path: s.path, Header: u.header, Message: msg, ss: ss, fields: u.fields}
	u.buf = nil
	return after{handler: func() {
		defer cancel()
		var a *UnaryAnswer
		if err != nil {
			a = &UnaryAnswer{Err: err}
		} else {
			a = u.target.Unary(ctx, call)
		}
		ss.answerUnary(s, u, a)
	}}
}

// message is the request's one message, or the status a gRPC server answers a bad one with.
func (u *unaryCall) message() ([]byte, error) {
	switch {
	case len(u.buf) < 5:
		return nil, status.Error(codes.Internal, "the request has no message")
	case u.buf[0] != 0:
		return nil, status.Error(codes.Unimplemented, "compressed requests are not supported")
	}
	n := binary.BigEndian.Uint32(u.buf[1:5])
	switch {
	case int64(n) > int64(u.target.maxMessage()):
		return nil, status.Errorf(codes.ResourceExhausted, "received message larger than max (%d vs. %d)", n, u.target.maxMessage())
	case int(n) != len(u.buf)-5:
		return nil, status.Errorf(codes.Internal, "the request's message is %d bytes, its prefix says %d", len(u.buf)-5, n)
	}
	return u.buf[5:], nil
}

// answerUnary sends a's answer on s, within the client's windows, unless the client reset the
// call or left meanwhile.
func (ss *session) answerUnary(s *stream, u *unaryCall, a *UnaryAnswer) {
	ss.setCode(s, status.Code(a.Err)) // the observer's; a reset after this wins
	if a.Err != nil {
		st := status.Convert(a.Err)
		fields := append(answerHeaders(u.contentType, a.Header), statusFields(st)...)
		fields = append(fields, metadataFields(a.Trailer)...)
		ss.send(s, &s.ans, item{headers: fields, end: true})
		return
	}
	msg := make([]byte, 5+len(a.Message))
	binary.BigEndian.PutUint32(msg[1:5], uint32(len(a.Message)))
	copy(msg[5:], a.Message)
	ss.send(s, &s.ans, item{headers: answerHeaders(u.contentType, a.Header)}, item{data: msg},
		item{headers: append(statusFields(status.New(codes.OK, "")), metadataFields(a.Trailer)...), end: true})
}

// setCode sets the code s ends with, unless s has ended already.
func (ss *session) setCode(s *stream, code codes.Code) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if !s.removed {
		s.code = code
	}
}

func answerHeaders(contentType string, md metadata.MD) []hpack.HeaderField {
	return append([]hpack.HeaderField{{Name: ":status", Value: "200"}, {Name: "content-type", Value: contentType}}, metadataFields(md)...)
}

// statusFields are the trailers that carry st.
func statusFields(st *status.Status) []hpack.HeaderField {
	f := []hpack.HeaderField{{Name: "grpc-status", Value: strconv.Itoa(int(st.Code()))}}
	if st.Message() != "" {
		f = append(f, hpack.HeaderField{Name: "grpc-message", Value: encodeGrpcMessage(st.Message())})
	}
	if p := st.Proto(); len(p.GetDetails()) > 0 {
		if b, err := proto.Marshal(p); err == nil {
			f = append(f, hpack.HeaderField{Name: "grpc-status-details-bin", Value: base64.RawStdEncoding.EncodeToString(b)})
		}
	}
	return f
}

// grpcStatus is a gRPC status as a header block: a whole trailers-only response, or the
// trailers after a response's headers.
func grpcStatus(code codes.Code, msg string, trailersOnly bool) []hpack.HeaderField {
	var f []hpack.HeaderField
	if trailersOnly {
		f = answerHeaders("application/grpc", nil)
	}
	return append(f, statusFields(status.New(code, msg))...)
}

// encodeGrpcMessage percent-encodes msg as gRPC's grpc-message header wants it.
func encodeGrpcMessage(msg string) string {
	const hex = "0123456789ABCDEF"
	var b []byte
	for i := 0; i < len(msg); i++ {
		c := msg[i]
		if c >= ' ' && c <= '~' && c != '%' {
			if b != nil {
				b = append(b, c)
			}
			continue
		}
		if b == nil {
			b = append(make([]byte, 0, len(msg)+16), msg[:i]...)
		}
		b = append(b, '%', hex[c>>4], hex[c&15])
	}
	if b == nil {
		return msg
	}
	return string(b)
}

// maxQuote is the most of a client's string (a path, a header value) that podgate quotes back
// in a status or a log line: a client cannot make it write its 64 KiB path into every refusal.
const maxQuote = 256

// Clip is v, a string a client sent, as a refusal quotes it: at most 256 bytes of it, with a note
// of how long it was.
func Clip(v string) string { return clip(v) }

// clip is Clip.
func clip(v string) string {
	if len(v) <= maxQuote {
		return v
	}
	return fmt.Sprintf("%s… (%d bytes)", strings.ToValidUTF8(v[:maxQuote], ""), len(v))
}

// metadataFields are md's header fields, binary values encoded; pseudo-headers and the
// headers gRPC sets itself are left out.
func metadataFields(md metadata.MD) []hpack.HeaderField {
	var f []hpack.HeaderField
	for k, vs := range md {
		k = strings.ToLower(k)
		if GRPCSetsItself(k) {
			continue
		}
		for _, v := range vs {
			if strings.HasSuffix(k, "-bin") {
				v = base64.RawStdEncoding.EncodeToString([]byte(v))
			}
			f = append(f, hpack.HeaderField{Name: k, Value: v})
		}
	}
	return f
}

// GRPCSetsItself says whether a gRPC peer sets header name itself (a pseudo-header, the
// content type, the timeout, the status…), so that it is not the caller's metadata to pass on.
// name is lower case.
func GRPCSetsItself(name string) bool {
	return strings.HasPrefix(name, ":") || reservedHeader[name]
}

var reservedHeader = map[string]bool{
	"content-type": true, "user-agent": true, "te": true, "grpc-timeout": true,
	"grpc-encoding": true, "grpc-accept-encoding": true, "grpc-message-type": true,
	"grpc-status": true, "grpc-message": true, "grpc-status-details-bin": true,
}

// decodeBinary decodes a "-bin" header's value, padded or not, as gRPC sends it.
func decodeBinary(v string) ([]byte, error) {
	if len(v)%4 == 0 {
		return base64.StdEncoding.DecodeString(v)
	}
	return base64.RawStdEncoding.DecodeString(v)
}

// parseTimeout parses grpc-timeout: at most 8 digits and a unit (H, M, S, m, u, n).
func parseTimeout(v string) (time.Duration, error) {
	if len(v) < 2 || len(v) > 9 {
		return 0, fmt.Errorf("malformed grpc-timeout %q", v)
	}
	n, err := strconv.ParseInt(v[:len(v)-1], 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("malformed grpc-timeout %q", v)
	}
	unit := map[byte]time.Duration{'H': time.Hour, 'M': time.Minute, 'S': time.Second, 'm': time.Millisecond, 'u': time.Microsecond, 'n': time.Nanosecond}[v[len(v)-1]]
	if unit == 0 {
		return 0, fmt.Errorf("malformed grpc-timeout %q", v)
	}
	if n > int64(time.Duration(1<<63-1)/unit) {
		return time.Duration(1<<63 - 1), nil
	}
	return time.Duration(n) * unit, nil
}
