package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/podgate/podgate/test/harness"
)

// podgateRig starts podgate and the fake runtime, built once, with podgate's default limits;
// it skips the test when not root or when they cannot be built.
func podgateRig(t *testing.T) *harness.Podgate {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	r := programs(t)
	f, err := r.startFake()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.stop)
	pg, err := r.startPodgate(ctx, f, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := pg.Stop(30 * time.Second); err != nil {
			t.Error(err)
		}
	})
	return pg
}

// TestOneProcessHoldingConnections is issue 38's row with podgate's default limits: one
// process opens 64 PodResources connections (half-open, idle, Watch) and holds them for 15 s;
// it keeps its quota (a quarter of the socket), the half-open and idle ones are closed by the
// header timeout, and another process's List and Watch calls, each on a connection of its
// own, are answered (at least 9 of 10 each). podgate's log names the holding process.
func TestOneProcessHoldingConnections(t *testing.T) {
	pg := podgateRig(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r, err := holdAndCall(ctx, pg.PodResourcesSocket)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("holder pid %d: %s", r.pid, r)
	if held := r.held[0] + r.held[1] + r.held[2]; held > 16 {
		t.Errorf("the holding process kept %d connections, want at most its quota of 16", held)
	}
	if r.lists < 9 || r.watches < 9 {
		t.Errorf("the other process had List %d/10 and Watch %d/10 answered, want at least 9 of each", r.lists, r.watches)
	}
	if r.closed[0] != r.held[0] || r.closed[1] != r.held[1] {
		t.Errorf("podgate closed %d of %d half-open and %d of %d idle connections within %s, want all (headerTimeout 10s)",
			r.closed[0], r.held[0], r.closed[1], r.held[1], holdFor)
	}
	log := pg.Log.String()
	if want := fmt.Sprintf(`pid=%d uid=0 reason="connections_per_process"`, r.pid); !strings.Contains(log, want) ||
		!strings.Contains(log, fmt.Sprintf("holderPid=%d", r.pid)) {
		t.Errorf("podgate's log does not name the holding process (%s):\n%s", want, refusalLines(log))
	}
	if !strings.Contains(log, fmt.Sprintf(`pid=%d uid=0 reason="header_timeout"`, r.pid)) {
		t.Errorf("podgate's log does not tell of the half-open connections closed:\n%s", refusalLines(log))
	}
}

// TestForkedProcessesFlooding is issue 38's other row with podgate's default limits: 30
// processes of one user call List as fast as they can for 3 s; together they get about their
// user's rate (200/s, burst 200), not 30 times a process's, and the log says so.
func TestForkedProcessesFlooding(t *testing.T) {
	pg := podgateRig(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r, err := forkFlood(ctx, pg.PodResourcesSocket)
	if err != nil {
		t.Fatal(err)
	}
	t.Log(r)
	// The user's bucket: its burst, then 200 a second for as long as the processes ran
	// (which includes their start), with 10% for the timing.
	if most := int(1.1 * (200 + 200*r.took.Seconds())); r.answered > most || r.answered < 200 {
		t.Errorf("%d processes of one user had %d calls answered in %s, want from 200 to %d (the user's rate)", forks, r.answered, r.took, most)
	}
	if r.other > 0 {
		t.Errorf("%d calls failed other than ResourceExhausted", r.other)
	}
	if log := pg.Log.String(); !strings.Contains(log, `uid=0 reason="rate_limit_per_user"`) {
		t.Errorf("podgate's log does not tell of the user's rate limit:\n%s", refusalLines(log))
	}
}

// refusalLines are the log's refusal lines.
func refusalLines(log string) string {
	var out []string
	for line := range strings.SplitSeq(log, "\n") {
		if strings.Contains(line, "Refused a PodResources client") {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}
