package e2e

import (
	"context"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/podgate/podgate/test/rig"
)

// TestContainerdRestartUnderLoad restarts containerd while 64 clients call podgate without
// pause: while containerd is down every failed call is Unavailable, no call hangs, and once
// containerd's socket is back every client succeeds again within a second; /readyz follows.
func TestContainerdRestartUnderLoad(t *testing.T) {
	const (
		clients  = 64
		longest  = 3 * time.Second // no call may take longer: down means an answer at once
		recovery = time.Second
	)
	n := startNode(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	sock := n.rig.Endpoint[len("unix://"):]

	var (
		mu      sync.Mutex
		bad     []string                     // failures other than Unavailable, and slow calls
		firstOK = make([]time.Time, clients) // per client: its first success after the stop
		stopped atomic.Pointer[time.Time]    // when containerd was gone
		calls   atomic.Int64
		failed  atomic.Int64
		wg      sync.WaitGroup
	)
	for i := range clients {
		c := rig.Connect(t, n.podgate.Endpoint)
		wg.Go(func() {
			for ctx.Err() == nil {
				start := time.Now()
				callCtx, done := context.WithTimeout(ctx, 30*time.Second)
				_, err := c.Runtime.Version(callCtx, "v1")
				done()
				took := time.Since(start)
				calls.Add(1)
				if ctx.Err() != nil {
					return
				}
				mu.Lock()
				switch {
				case took > longest:
					bad = append(bad, "a call took "+took.String()+": "+errString(err))
				case err != nil && status.Code(err) != codes.Unavailable:
					bad = append(bad, err.Error())
				case err != nil:
					failed.Add(1)
				case firstOK[i].IsZero() && stopped.Load() != nil && start.After(*stopped.Load()):
					firstOK[i] = time.Now()
				}
				mu.Unlock()
			}
		})
	}
	waitWithin(t, 30*time.Second, "calls flowing", func() bool { return calls.Load() > clients*10 })

	if err := n.rig.StopContainerd(ctx); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	stopped.Store(&now)
	waitWithin(t, 30*time.Second, "calls failing with containerd down", func() bool { return failed.Load() > clients })
	if code, _ := get(t, n.podgate.MetricsURL+"/readyz"); code != http.StatusServiceUnavailable {
		t.Errorf("readyz with containerd down: %d, want 503", code)
	}
	if err := n.rig.RestartContainerd(ctx); err != nil {
		t.Fatal(err)
	}
	// containerd cannot answer before its socket exists: recovery counts from the socket's
	// creation.
	fi, err := os.Stat(sock)
	if err != nil {
		t.Fatal(err)
	}
	back := fi.ModTime()
	waitWithin(t, 30*time.Second, "every client succeeding again", func() bool {
		mu.Lock()
		defer mu.Unlock()
		for _, ok := range firstOK {
			if ok.IsZero() {
				return false
			}
		}
		return true
	})
	readyAfter := time.Since(back)
	if code, body := get(t, n.podgate.MetricsURL+"/readyz"); code != http.StatusOK {
		t.Errorf("readyz once every client succeeds again: %d %s", code, body)
	}
	cancel()
	wg.Wait()

	var worst time.Duration
	for _, ok := range firstOK {
		worst = max(worst, ok.Sub(back))
	}
	t.Logf("%d calls, %d Unavailable while containerd was down; last client back %s after containerd's socket, readyz checked %s after", calls.Load(), failed.Load(), worst, readyAfter)
	if worst > recovery {
		t.Errorf("a client succeeded only %s after containerd's socket was back, want < %s", worst, recovery)
	}
	for _, b := range bad {
		t.Error(b)
	}
}

func errString(err error) string {
	if err == nil {
		return "ok"
	}
	return err.Error()
}
