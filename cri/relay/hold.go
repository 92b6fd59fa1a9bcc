package relay

import (
	"fmt"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Report tells of what the call's client did that the Target refused (reason, one of Reasons),
// as the relay tells of its own refusals: counted (Server.Refused) and logged once per
// connection with the client's pid and uid, within the log's rate. did says what the client did,
// action what podgate did about it. A call not made by the relay reports nothing.
func (c *UnaryCall) Report(reason, did, action string) {
	if c.ss != nil {
		c.ss.report(refusal{reason, did, action})
	}
}

// Hold counts n more bytes against the budgets of the call's connection and of the process
// (Limits.ConnectionBytes, Limits.TotalBytes), beside the request's own bytes: what the Target
// will hold for the call besides them, such as the request decoded. It returns the function
// that gives them back, to be called once that memory is let go (more calls do nothing), or a
// ResourceExhausted status when the bytes do not fit, which counts as a refusal of the client
// (Server.Refused, the relay's log line) as a request over the budget does.
//
// The bytes stay counted until release is called, also when the client resets the call or its
// connection closes meanwhile: the handler still holds what they count. A call not made by the
// relay (no connection) holds nothing.
func (c *UnaryCall) Hold(n int64) (release func(), err error) {
	ss := c.ss
	if ss == nil || n <= 0 {
		return func() {}, nil
	}
	// A stand-in stream of the connection's: what it holds is the call's extra, apart from the
	// call's own stream, which its end (removeLocked) gives back on its own.
	h := &stream{path: c.Path}
	ss.mu.Lock()
	held := ss.held.Load()
	reason := ss.chargeLocked(h, n)
	ss.mu.Unlock()
	if reason != "" {
		ss.report(refusal{reason, fmt.Sprintf("sent a request of %s for which podgate would hold %d bytes more while its connection held %d bytes", c.Path, n, held), "answered ResourceExhausted"})
		return nil, status.Errorf(codes.ResourceExhausted, "podgate holds too much for its clients' requests (%s): this one would take %d bytes more", reason, n)
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			ss.mu.Lock()
			ss.releaseLocked(h, h.held)
			ss.mu.Unlock()
		})
	}, nil
}
