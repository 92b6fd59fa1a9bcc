package e2e

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/podgate/podgate/test/rig"
)

// loadSlice is how long one path takes the load before the next path's turn.
const loadSlice = 500 * time.Millisecond

// load is a set of concurrent clients per path, each client on its own connection, connected
// once and reused by every run, and the call they make (Version unless set otherwise).
type load struct {
	clients map[string][]*rig.Client
	call    func(ctx context.Context, c *rig.Client) error
}

// callVersion is a load's default call: the small unary call.
func callVersion(ctx context.Context, c *rig.Client) error {
	_, err := c.Runtime.Version(ctx, "v1")
	return err
}

// loadResult is what one path served in a run of the load.
type loadResult struct {
	calls   int64
	elapsed time.Duration
	// cpu is the user and system CPU time the path's process spent meanwhile, when known.
	cpu time.Duration
}

func (r loadResult) rate() float64 { return float64(r.calls) / r.elapsed.Seconds() }

func (r loadResult) cpuPerCall() float64 { return float64(r.cpu.Microseconds()) / float64(r.calls) }

// newLoad connects clients clients to each of endpoints (path → CRI endpoint).
func newLoad(b *testing.B, endpoints map[string]string, clients int) *load {
	b.Helper()
	l := &load{clients: map[string][]*rig.Client{}, call: callVersion}
	for path, endpoint := range endpoints {
		for range clients {
			l.clients[path] = append(l.clients[path], rig.Connect(b, endpoint))
		}
	}
	return l
}

// run puts the clients of paths to work (l.call), one path at a time for slice, rounds
// times, rotating which path goes first in each round. For the paths in pids it also reads
// the CPU time of that process around each of its slices.
func (l *load) run(b *testing.B, paths []string, pids map[string]int, slice time.Duration, rounds int) map[string]loadResult {
	b.Helper()
	results := map[string]loadResult{}
	for round := range rounds {
		for k := range paths {
			path := paths[(round+k)%len(paths)]
			r := results[path]
			pid, known := pids[path]
			var cpu0 time.Duration
			if known {
				cpu0 = cpuTime(b, pid)
			}
			calls, elapsed := repeatCalls(b, l.clients[path], slice, l.call)
			r.calls += calls
			r.elapsed += elapsed
			if known {
				r.cpu += cpuTime(b, pid) - cpu0
			}
			results[path] = r
		}
	}
	return results
}

// repeatCalls has every client make call again and again for about d, and returns how many
// calls succeeded and how long that took. The clients stop starting calls after d rather
// than cancelling the calls in flight, so every call counts and none fails (a cancelled call
// would also make cri-client log an error into the benchmark's output).
func repeatCalls(b *testing.B, clients []*rig.Client, d time.Duration, call func(context.Context, *rig.Client) error) (int64, time.Duration) {
	b.Helper()
	var calls, failed atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	end := start.Add(d)
	for _, c := range clients {
		wg.Go(func() {
			for time.Now().Before(end) {
				if err := call(b.Context(), c); err != nil {
					failed.Add(1)
					continue
				}
				calls.Add(1)
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if n := failed.Load(); n > 0 {
		b.Errorf("%d of %d calls failed", n, n+calls.Load())
	}
	return calls.Load(), elapsed
}
