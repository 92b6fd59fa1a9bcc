package main

// Issue 47's rows: the faults of the relay's outgoing side, each as a client that meets it.
// F1, a grpc-go client with static windows, sends nothing while it reads a large answer;
// F2, a kubelet-like client reads its lists beside ~250 connections whose parked answers fill
// the budget; F3, Version beside a slowly read large answer on the same connection; F4,
// 1,000 connections that never read, flooding PINGs or calls refused with a 60 KB quote
// (flood.go). F5, a write deadline left behind, is a relay test (cri/relay). And the stress
// test of the write path, every answer checked byte for byte (stress.go).

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// results keeps what an attack measured on each server, for its check.
type results[T any] struct {
	mu sync.Mutex
	m  map[string]T
}

func (r *results[T]) set(server string, v T) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m == nil {
		r.m = map[string]T{}
	}
	r.m[server] = v
}

func (r *results[T]) get(server string) (T, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	v, ok := r.m[server]
	return v, ok
}

// faultAttacks are issue 47's rows, and the write path's stress test run for stressFor.
func faultAttacks(stressFor time.Duration) []attack {
	return []attack{f1StaticWindows(), f2Parked(), f3Slow(), f3Kubelet(), f4Pings(), f4Quotes(), f4Pipelined(), stressAttack(stressFor)}
}

// F1: a client whose windows are so large it never sends a WINDOW_UPDATE.

const (
	f1Calls    = 2
	f1Rate     = 8 << 20
	f1Deadline = 30 * time.Second
)

func f1StaticWindows() attack {
	var got results[int]
	return attack{
		name: fmt.Sprintf("F1: a grpc-go client with static 1 GiB windows reading at 8 MiB/s: %d ListContainers (21 MB) at once, within %s", f1Calls, f1Deadline),
		fake: []string{"-containers", bigRuntime, "-lists-once"},
		on: func(ctx context.Context, t target) (string, func()) {
			did, answered := staticWindows(ctx, t.sock)
			got.set(t.server, answered)
			return did, func() {}
		},
		check: func(outcome) error {
			if n, _ := got.get("podgate"); n < f1Calls {
				return fmt.Errorf("%d of %d lists answered within %s", n, f1Calls, f1Deadline)
			}
			return nil
		},
	}
}

// staticWindows calls ListContainers f1Calls times at once on one connection of a grpc-go
// client with static 1 GiB windows, reading at f1Rate: it sends no WINDOW_UPDATE before it has
// taken a quarter of a window (256 MiB), and no BDP PING. The calls' answers, 84 MB together,
// need every window the server's side gives back written to the runtime while the client is
// silent.
func staticWindows(ctx context.Context, sock string) (string, int) {
	d := &dialer{sock: sock, shape: readShape{rate: f1Rate}}
	conn, err := d.client(grpc.WithStaticStreamWindowSize(1<<30), grpc.WithStaticConnWindowSize(1<<30))
	if err != nil {
		return err.Error(), 0
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, f1Deadline)
	defer cancel()
	start := time.Now()
	var answered atomic.Int64
	var last atomic.Int64 // ns after start the last answer came
	codesSeen := map[codes.Code]int{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range f1Calls {
		wg.Go(func() {
			_, err := runtimeapi.NewRuntimeServiceClient(conn).ListContainers(ctx, &runtimeapi.ListContainersRequest{})
			mu.Lock()
			codesSeen[status.Code(err)]++
			mu.Unlock()
			if err == nil {
				answered.Add(1)
				last.Store(int64(time.Since(start)))
			}
		})
	}
	wg.Wait()
	took := "none"
	if answered.Load() > 0 {
		took = fmt.Sprintf("the last after %.1f s", time.Duration(last.Load()).Seconds())
	}
	return fmt.Sprintf("%d/%d answered (%s); %s; %d connection(s)", answered.Load(), f1Calls, took,
		codeSummary(codesSeen), d.dials.Load()), int(answered.Load())
}

// codeSummary says how many calls ended with each code.
func codeSummary(m map[codes.Code]int) string {
	counts := map[string]int{}
	for c, n := range m {
		counts[c.String()] += n
	}
	return summary(counts)
}

// F3: a small call beside a large answer on the same connection.

// versionEvery is how often the F3 clients call Version: as the issue measured it.
const versionEvery = 250 * time.Millisecond

// latencies are the Version calls a client made, their answers' latencies (of those answered)
// and the lists answered.
type latencies struct {
	calls, lists, listsAnswered int
	answered                    []time.Duration
}

// max is the longest latency of an answered call, 0 for none.
func (l latencies) max() time.Duration {
	if len(l.answered) == 0 {
		return 0
	}
	return slices.Max(l.answered)
}

// quantile is the q-quantile of the answered calls' latencies (nearest rank).
func (l latencies) quantile(q float64) time.Duration {
	if len(l.answered) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(l.answered))
	return s[max(int(math.Ceil(q*float64(len(s))))-1, 0)]
}

func (l latencies) String() string {
	return fmt.Sprintf("Version %d/%d answered, p50 %s, p99 %s, max %s; lists %d/%d",
		len(l.answered), l.calls, l.quantile(0.5).Round(time.Millisecond), l.quantile(0.99).Round(time.Millisecond),
		l.max().Round(time.Millisecond), l.listsAnswered, l.lists)
}

// sideBySide is one grpc-go client reading at rate that calls ListContainers lists times in a
// row and, on the same connection, Version every versionEvery, each within deadline, one after
// the other, until the lists are done.
func sideBySide(ctx context.Context, sock string, rate, lists int, deadline time.Duration) (latencies, error) {
	d := &dialer{sock: sock, shape: readShape{rate: rate}}
	conn, err := d.client()
	if err != nil {
		return latencies{}, err
	}
	defer conn.Close()
	client := runtimeapi.NewRuntimeServiceClient(conn)
	// The connection is up before the lists begin.
	if _, err := client.Version(ctx, &runtimeapi.VersionRequest{}); err != nil {
		return latencies{}, fmt.Errorf("first Version: %w", err)
	}
	l := latencies{lists: lists}
	listed := make(chan struct{})
	listsAnswered := 0 // the lists' goroutine's until listed is closed
	go func() {
		defer close(listed)
		for range lists {
			if _, err := client.ListContainers(ctx, &runtimeapi.ListContainersRequest{}); err == nil {
				listsAnswered++
			}
		}
	}()
	tick := time.NewTicker(versionEvery)
	defer tick.Stop()
	for {
		select {
		case <-listed:
			l.listsAnswered = listsAnswered
			return l, nil
		case <-tick.C:
		}
		cctx, cancel := context.WithTimeout(ctx, deadline)
		start := time.Now()
		_, err := client.Version(cctx, &runtimeapi.VersionRequest{})
		took := time.Since(start)
		cancel()
		l.calls++
		if err == nil {
			l.answered = append(l.answered, took)
		}
	}
}

// f3Slow: Version beside one ListContainers (21 MB) read at 1 MiB/s, the measure; the
// latencies unbounded (30 s), so that they are measured rather than cut.
func f3Slow() attack {
	var got results[latencies]
	return attack{
		name:     "F3: Version every 250 ms beside a ListContainers (21 MB) read at 1 MiB/s, on the same connection",
		fake:     []string{"-containers", bigRuntime, "-lists-once"},
		anchored: true,
		on: func(ctx context.Context, t target) (string, func()) {
			l, err := sideBySide(ctx, t.sock, 1<<20, 1, 30*time.Second)
			if err != nil {
				return err.Error(), func() {}
			}
			got.set(t.server, l)
			return l.String(), func() {}
		},
		check: func(outcome) error {
			pg, ok1 := got.get("podgate")
			anchor, ok2 := got.get("grpc-go")
			switch {
			case !ok1 || !ok2:
				return errors.New("not measured on both servers")
			case len(pg.answered) < pg.calls:
				return fmt.Errorf("the Version calls: %d/%d answered within 30 s", len(pg.answered), pg.calls)
			case pg.max() > 2*anchor.max():
				return fmt.Errorf("the longest Version call took %s, over twice grpc-go's (%s)", pg.max().Round(time.Millisecond), anchor.max().Round(time.Millisecond))
			}
			return nil
		},
	}
}

// f3KubeletDeadline is the deadline of the kubelet-like client's Version calls: the
// kubelet-shaped client's of every row (startKubelet).
const f3KubeletDeadline = time.Second

// f3Kubelet: a kubelet-like client reading at 4 MiB/s lists its containers three times (21 MB
// each) and calls Version beside them on the same connection.
func f3Kubelet() attack {
	var got results[latencies]
	return attack{
		name: "F3: a kubelet-like client reading at 4 MiB/s: ListContainers (21 MB) × 3, and Version every 250 ms (1 s deadline) on the same connection",
		fake: []string{"-containers", bigRuntime, "-lists-once"},
		on: func(ctx context.Context, t target) (string, func()) {
			l, err := sideBySide(ctx, t.sock, 4<<20, 3, f3KubeletDeadline)
			if err != nil {
				return err.Error(), func() {}
			}
			got.set(t.server, l)
			return l.String(), func() {}
		},
		check: func(outcome) error {
			l, _ := got.get("podgate")
			if l.calls == 0 || len(l.answered) < l.calls || l.listsAnswered < l.lists {
				return fmt.Errorf("the Version calls: %d/%d answered within %s; lists %d/%d", len(l.answered), l.calls, f3KubeletDeadline, l.listsAnswered, l.lists)
			}
			return nil
		},
	}
}
