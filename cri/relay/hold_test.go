package relay

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestHold: what a Unary target holds besides a call's request (UnaryCall.Hold) counts against
// the connection's and the process's budgets while it is held, also after the client gave up
// the call; over a budget it is refused ResourceExhausted, reported as a refusal of the client;
// released (once, however often release is called), the budget has it all back.
func TestHold(t *testing.T) {
	type held struct {
		during, afterCancel int64
		err                 error
	}
	seen := make(chan held, 1)
	holding := make(chan struct{})
	var srv *Server
	tgt := &Target{Name: "handlers", Unary: func(ctx context.Context, call *UnaryCall) *UnaryAnswer {
		n, _ := strconv.ParseInt(string(call.Message), 10, 64)
		release, err := call.Hold(n)
		if err != nil {
			seen <- held{err: err}
			return &UnaryAnswer{Err: err}
		}
		h := held{during: srv.Held()}
		if call.Path == "/svc/HoldUntilCancelled" {
			close(holding)
			<-ctx.Done()
			h.afterCancel = srv.Held()
		}
		release()
		release()
		seen <- h
		return &UnaryAnswer{Message: []byte("ok")}
	}}
	var mu sync.Mutex
	var refused []string
	srv = &Server{Route: func(string) *Target { return tgt }, Limits: Limits{ConnectionBytes: 4 << 20, TotalBytes: 8 << 20},
		Refused: func(reason string) { mu.Lock(); refused = append(refused, reason); mu.Unlock() }}
	c := unaryClient(t, startRelay(t, shortDir(t), srv))

	in, out := []byte(strconv.Itoa(1<<20)), []byte(nil)
	if err := c.Invoke(t.Context(), "/svc/Hold", &in, &out); err != nil {
		t.Fatalf("holding 1 MiB under a 4 MiB budget: %v", err)
	}
	if h := <-seen; h.during < 1<<20 {
		t.Errorf("the relay held %d bytes while the handler held 1 MiB", h.during)
	}
	// The answer's bytes count until their write has returned, which may be a moment after
	// the client has them.
	waitUntil(t, "the relay holds nothing after the call", func() bool { return srv.Held() == 0 })

	in = []byte(strconv.Itoa(5 << 20))
	err := c.Invoke(t.Context(), "/svc/Hold", &in, &out)
	if st := status.Convert(err); st.Code() != codes.ResourceExhausted || !strings.Contains(st.Message(), ReasonConnectionBudget) {
		t.Errorf("holding 5 MiB under a 4 MiB budget: %v, want ResourceExhausted (%s)", err, ReasonConnectionBudget)
	}
	if h := <-seen; h.err == nil {
		t.Error("Hold of 5 MiB under a 4 MiB budget succeeded")
	}
	mu.Lock()
	if len(refused) != 1 || refused[0] != ReasonConnectionBudget {
		t.Errorf("refusals reported: %v, want [%s]", refused, ReasonConnectionBudget)
	}
	mu.Unlock()

	ctx, cancel := context.WithCancel(t.Context())
	in = []byte(strconv.Itoa(2 << 20))
	done := make(chan error, 1)
	go func() { done <- c.Invoke(ctx, "/svc/HoldUntilCancelled", &in, &out) }()
	<-holding
	cancel()
	if err := <-done; err == nil {
		t.Error("the cancelled call succeeded")
	}
	if h := <-seen; h.during < 2<<20 || h.afterCancel < 2<<20 {
		t.Errorf("the relay held %d bytes while the handler held 2 MiB, %d after the client cancelled", h.during, h.afterCancel)
	}
	waitUntil(t, "the held bytes given back", func() bool { return srv.Held() == 0 })
}
