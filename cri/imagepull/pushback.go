package imagepull

// What a failed pull says of its registry: whether the registry pushed back (429 Too Many
// Requests, or 503 Service Unavailable with a Retry-After), read from the runtime's error text.

import (
	"errors"
	"net/http"
	"regexp"
	"strconv"
	"time"

	"google.golang.org/grpc/status"
)

// pushBack is a registry's refusal of a pull that asks the node to slow down.
type pushBack struct {
	// code is the HTTP status: 429 or 503.
	code int
	// retryAfter is how long the registry asked the node to wait; 0 when it did not say.
	retryAfter time.Duration
}

// statusText is containerd's text of a registry's unexpected answer: the request's URL, then
// its HTTP status. Its forms, all of which reach the kubelet inside the CRI's "failed to pull
// and unpack image" error:
//
//   - containerd 2.x (remotes/errors.ErrUnexpectedStatus), a HEAD or a GET of a manifest or a
//     blob, or of the token endpoint: `unexpected status from HEAD request to <url>: 429 Too
//     Many Requests`; for a GET whose body is the registry's error list, the list follows on
//     a line of its own (`…: 429 Too Many Requests\ntoomanyrequests: You have reached …`);
//   - containerd 1.x and clients of its older fetcher: `unexpected status code <url>: 429 Too
//     Many Requests - Server message: toomanyrequests: …`.
var statusText = regexp.MustCompile(`unexpected status (?:code|from [A-Z]+ request to) \S+: (\d{3}) `)

// retryAfterText is a wait the registry asked for, as far as the error text shows it: the
// runtime does not quote response headers, but some registries repeat Retry-After in their
// message, GHCR as a Go duration (`toomanyrequests: retry-after: 333.939671ms, allowed:
// 44000/minute`), others as the header's seconds (`Retry-After: 30`).
var retryAfterText = regexp.MustCompile(`(?i)retry-after:?\s*((?:\d+(?:\.\d+)?(?:ns|us|µs|μs|ms|s|m|h))+|\d+)\b`)

// pushBackOf reads err, a failed pull's error (the runtime's gRPC status, passed through
// unchanged), for a registry's push-back: an HTTP 429, or a 503 with a Retry-After. A 503
// without one is a registry that is down rather than one asking the node to slow down, and
// fails as any other error. Only the first status in the text counts: it is the answer that
// failed the pull.
func pushBackOf(err error) (pushBack, bool) {
	if err == nil {
		return pushBack{}, false
	}
	msg := err.Error()
	var s interface{ GRPCStatus() *status.Status }
	if errors.As(err, &s) {
		msg = s.GRPCStatus().Message()
	}
	m := statusText.FindStringSubmatchIndex(msg)
	if m == nil {
		return pushBack{}, false
	}
	code, _ := strconv.Atoi(msg[m[2]:m[3]]) // three digits
	pb := pushBack{code: code, retryAfter: retryAfterIn(msg[m[1]:])}
	switch {
	case code == http.StatusTooManyRequests:
		return pb, true
	case code == http.StatusServiceUnavailable && pb.retryAfter > 0:
		return pb, true
	}
	return pushBack{}, false
}

// retryAfterIn reads the first Retry-After in the registry's message; 0 when there is none.
func retryAfterIn(msg string) time.Duration {
	m := retryAfterText.FindStringSubmatch(msg)
	if m == nil {
		return 0
	}
	if secs, err := strconv.Atoi(m[1]); err == nil {
		return time.Duration(secs) * time.Second
	}
	d, err := time.ParseDuration(m[1])
	if err != nil || d < 0 {
		return 0
	}
	// A registry counting in microseconds asks for at least that: round up to a whole
	// millisecond, what a timer on this node can honour.
	return max(d, time.Millisecond)
}
