package main

// The stress test of the write path (issue 47): many calls at once through the server to a
// runtime that answers bytes the client can check (package stresscall), from clients that read
// in small chunks, pause, use small windows, reset their calls, let deadlines cut them and
// break their connections off; every answer that comes whole, its header and trailer metadata
// (up to 40 KB: CONTINUATION frames), is checked byte for byte, and the runtime checks every
// request.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/podgate/podgate/test/hostile/stresscall"
)

// stressAction is what a client does to its calls beside making them.
type stressAction int

const (
	actNone     stressAction = iota
	actReset                 // cancels the call after up to 50 ms: RST_STREAM CANCEL
	actDeadline              // gives the call a deadline of up to 200 ms
	actBreakOff              // closes its connection after up to 50 ms
)

// stressClient is one client connection of the stress test: how it reads, its windows, what
// it does to its calls, how many calls it makes at once, and its largest answer.
type stressClient struct {
	name      string
	shape     readShape
	window    int32 // static stream and connection windows; 0: grpc-go's, which grow (BDP)
	action    stressAction
	workers   int
	maxAnswer int
}

// stressClients are the stress test's connections. A unix socket's receive buffer does not
// bound what its peer may write (the sender's buffer does), so the clients read in small
// chunks and pause rather than shrink SO_RCVBUF, to make the server's writes partial.
var stressClients = []stressClient{
	{name: "plain", workers: 4, maxAnswer: 8 << 20},
	{name: "static 64 KiB windows", window: 64 << 10, workers: 3, maxAnswer: 8 << 20},
	{name: "13-byte reads", shape: readShape{chunk: 13}, workers: 2, maxAnswer: 1 << 20},
	{name: "4 KiB reads", shape: readShape{chunk: 4096}, workers: 3, maxAnswer: 4 << 20},
	{name: "a 50 ms pause every 256 KiB", shape: readShape{pauseEvery: 256 << 10, pause: 50 * time.Millisecond}, workers: 3, maxAnswer: 8 << 20},
	{name: "a 500 ms pause every 2 MiB", shape: readShape{pauseEvery: 2 << 20, pause: 500 * time.Millisecond}, workers: 2, maxAnswer: 8 << 20},
	{name: "resets", action: actReset, workers: 3, maxAnswer: 8 << 20},
	{name: "resets, 4 KiB reads", shape: readShape{chunk: 4096}, action: actReset, workers: 2, maxAnswer: 8 << 20},
	{name: "deadlines", action: actDeadline, workers: 2, maxAnswer: 8 << 20},
	{name: "abrupt closes", action: actBreakOff, workers: 1, maxAnswer: 8 << 20},
	{name: "abrupt closes, pausing", shape: readShape{pauseEvery: 64 << 10, pause: 20 * time.Millisecond}, action: actBreakOff, workers: 1, maxAnswer: 8 << 20},
}

// stressCallTimeout bounds a call that nothing cuts: the slowest client's largest answer takes
// a few seconds.
const stressCallTimeout = time.Minute

// stressStats is what the stress test saw.
type stressStats struct {
	calls, whole, cut, checked atomic.Int64
	mu                         sync.Mutex
	mismatches, unexpected     int
	samples                    []string // the first of each
	cuts                       map[string]int
}

func (s *stressStats) fail(mismatch bool, client string, spec stresscall.Spec, what string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if mismatch {
		s.mismatches++
	} else {
		s.unexpected++
	}
	if len(s.samples) < 5 {
		s.samples = append(s.samples, fmt.Sprintf("%s, %+v: %s", client, spec, what))
	}
}

func (s *stressStats) cutBy(how string) {
	s.cut.Add(1)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cuts[how]++
}

func (s *stressStats) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	cuts := make([]string, 0, len(s.cuts))
	for how, n := range s.cuts {
		cuts = append(cuts, fmt.Sprintf("%d %s", n, how))
	}
	sort.Strings(cuts)
	out := fmt.Sprintf("%d calls on %d connections: %d whole (%.0f MB checked byte for byte), %d cut as their clients asked (%s); %d mismatches, %d unexpected errors",
		s.calls.Load(), len(stressClients), s.whole.Load(), float64(s.checked.Load())/1e6, s.cut.Load(), strings.Join(cuts, ", "), s.mismatches, s.unexpected)
	if len(s.samples) > 0 {
		out += ": " + strings.Join(s.samples, "; ")
	}
	return out
}

func stressAttack(d time.Duration) attack {
	var got results[*stressStats]
	return attack{
		name: fmt.Sprintf("write path stress: %d connections (small reads, pauses, small windows, resets, deadlines, abrupt closes) make calls of 0 B–8 MiB answers, 0–40 KB trailers, for %s; every answer checked byte for byte", len(stressClients), d),
		fake: []string{"-stress"},
		on: func(ctx context.Context, t target) (string, func()) {
			st := stress(ctx, t.sock, d)
			got.set(t.server, st)
			return st.String(), func() {}
		},
		check: func(outcome) error {
			st, ok := got.get("podgate")
			switch {
			case !ok:
				return errors.New("not run")
			case st.mismatches > 0 || st.unexpected > 0:
				return fmt.Errorf("%d mismatches, %d unexpected errors: %s", st.mismatches, st.unexpected, strings.Join(st.samples, "; "))
			case st.whole.Load() < 100:
				return fmt.Errorf("only %d calls came whole", st.whole.Load())
			}
			return nil
		},
	}
}

// stress runs every stress client against sock for d; each call under way then is finished.
func stress(ctx context.Context, sock string, d time.Duration) *stressStats {
	st := &stressStats{cuts: map[string]int{}}
	end := time.Now().Add(d)
	var wg sync.WaitGroup
	for i, c := range stressClients {
		dl := &dialer{sock: sock, shape: c.shape}
		var opts []grpc.DialOption
		if c.window > 0 {
			opts = append(opts, grpc.WithStaticStreamWindowSize(c.window), grpc.WithStaticConnWindowSize(c.window))
		}
		conn, err := dl.client(opts...)
		if err != nil {
			st.fail(false, c.name, stresscall.Spec{}, err.Error())
			continue
		}
		var workers sync.WaitGroup
		for w := range c.workers {
			workers.Go(func() {
				rng := rand.New(rand.NewPCG(uint64(i), uint64(w)))
				for time.Now().Before(end) && ctx.Err() == nil {
					stressCall(ctx, conn, dl, c, randomSpec(rng, c.maxAnswer), rng, st)
				}
			})
		}
		wg.Go(func() {
			workers.Wait()
			_ = conn.Close()
		})
	}
	wg.Wait()
	return st
}

// randomSpec is a call of sizes spread evenly over their orders of magnitude: answers of 0
// bytes to most, trailers up to 40 KB (12 KB often: a long status), headers up to 8 KB,
// requests up to 256 KiB.
func randomSpec(rng *rand.Rand, most int) stresscall.Spec {
	spread := func(most int) int {
		bits := rng.IntN(bitLen(most) + 1)
		if bits == 0 {
			return 0
		}
		return min(1<<(bits-1)+rng.IntN(1<<(bits-1)), most)
	}
	s := stresscall.Spec{Seed: rng.Uint64(), Answer: spread(most), Messages: 1 + rng.IntN(4),
		Header: spread(8 << 10), Trailer: spread(40 << 10), Payload: spread(256 << 10), Request: spread(4 << 10)}
	if rng.IntN(4) == 0 {
		s.Trailer = 12 << 10
	}
	return s
}

func bitLen(n int) int {
	b := 0
	for ; n > 0; n >>= 1 {
		b++
	}
	return b
}

// stressCall makes one call of spec on conn as client c does, and checks what comes.
func stressCall(ctx context.Context, conn *grpc.ClientConn, dl *dialer, c stressClient, spec stresscall.Spec, rng *rand.Rand, st *stressStats) {
	st.calls.Add(1)
	ctx, cancel := context.WithTimeout(ctx, stressCallTimeout)
	defer cancel()
	switch c.action {
	case actReset:
		t := time.AfterFunc(time.Duration(rng.IntN(50))*time.Millisecond, cancel)
		defer t.Stop()
	case actDeadline:
		var cut context.CancelFunc
		ctx, cut = context.WithTimeout(ctx, time.Duration(1+rng.IntN(200))*time.Millisecond)
		defer cut()
	case actBreakOff:
		t := time.AfterFunc(time.Duration(rng.IntN(50))*time.Millisecond, dl.breakOff)
		defer t.Stop()
	}
	if spec.Request > 0 {
		ctx = metadata.AppendToOutgoingContext(ctx, stresscall.RequestKey, spec.RequestValue())
	}
	answer, header, trailer, err := invokeStress(ctx, conn, spec, c.action == actBreakOff)
	if err != nil {
		if how, ok := cutAsAsked(c.action, err); ok {
			st.cutBy(how)
			return
		}
		st.fail(status.Code(err) == codes.DataLoss, c.name, spec, err.Error())
		return
	}
	st.whole.Add(1)
	if what := checkAnswer(spec, answer, header, trailer); what != "" {
		st.fail(true, c.name, spec, what)
		return
	}
	st.checked.Add(int64(len(answer) + spec.Header + spec.Trailer))
}

// invokeStress makes the call and returns its answer's messages joined, its header and trailer.
// A client that breaks its connections off waits for the next one.
func invokeStress(ctx context.Context, conn *grpc.ClientConn, spec stresscall.Spec, waitForReady bool) ([]byte, metadata.MD, metadata.MD, error) {
	cs, err := conn.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true}, stresscall.Method, grpc.WaitForReady(waitForReady))
	if err != nil {
		return nil, nil, nil, err
	}
	if err := cs.SendMsg(&wrapperspb.BytesValue{Value: spec.Encode()}); err != nil && !errors.Is(err, io.EOF) {
		return nil, nil, nil, err
	}
	if err := cs.CloseSend(); err != nil {
		return nil, nil, nil, err
	}
	var answer []byte
	var messages int
	for {
		var m wrapperspb.BytesValue
		err := cs.RecvMsg(&m)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, nil, nil, err
		}
		answer = append(answer, m.GetValue()...)
		messages++
	}
	if messages != spec.Messages {
		return nil, nil, nil, status.Errorf(codes.DataLoss, "%d messages, want %d", messages, spec.Messages)
	}
	header, err := cs.Header()
	if err != nil {
		return nil, nil, nil, err
	}
	return answer, header, cs.Trailer(), nil
}

// cutAsAsked says whether err is what the client's action makes of a call, and names it.
func cutAsAsked(a stressAction, err error) (string, bool) {
	code := status.Code(err)
	switch {
	case a == actReset && code == codes.Canceled:
		return "reset", true
	case a == actDeadline && code == codes.DeadlineExceeded:
		return "past their deadline", true
	case a == actBreakOff && code == codes.Unavailable:
		return "on a connection broken off", true
	}
	return "", false
}

// checkAnswer says how an answer that came whole differs from what its spec makes, "" when it
// does not.
func checkAnswer(spec stresscall.Spec, answer []byte, header, trailer metadata.MD) string {
	if at := stresscall.Differs(answer, spec.AnswerBytes()); at >= 0 {
		return fmt.Sprintf("answer of %d bytes (want %d) differs at byte %d", len(answer), spec.Answer, at)
	}
	for _, md := range []struct {
		what, key, want string
		got             metadata.MD
	}{{"header", stresscall.HeaderKey, spec.HeaderValue(), header}, {"trailer", stresscall.TrailerKey, spec.TrailerValue(), trailer}} {
		got := md.got.Get(md.key)
		switch {
		case md.want == "" && len(got) == 0:
		case len(got) != 1:
			return fmt.Sprintf("%s %s: %d values", md.what, md.key, len(got))
		case got[0] != md.want:
			return fmt.Sprintf("%s %s of %d bytes (want %d) differs at byte %d", md.what, md.key, len(got[0]), len(md.want), stresscall.Differs([]byte(got[0]), []byte(md.want)))
		}
	}
	return ""
}
