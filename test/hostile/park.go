package main

// F2 (issue 47): a kubelet-like client reads its lists beside ~250 connections of another
// process whose answers wait, parked on windows they never open, with the process's budget
// nearly full. The parking process is this program run again (parkEnv), so that podgate's log
// can tell it from the kubelet-like client by pid.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

const (
	// parkEnv, in a child's environment, names the socket on which it parks answers.
	parkEnv = "HOSTILE_PARK"
	// parkPath is the call whose answer the parked connections leave waiting: with
	// parkSandboxes sandboxes, about 1 MiB.
	parkPath      = "/runtime.v1.RuntimeService/ListPodSandbox"
	parkSandboxes = "2150"
	// f2Target is what the parked answers fill of podgate's budget (256 MiB by default): 253.5
	// MiB, as the issue measured it.
	f2Target = 256<<20 - 5<<19
	// f2Lists is how many times the kubelet-like client lists its containers, one after the
	// other, each within f2ListDeadline.
	f2Lists        = 40
	f2ListDeadline = 30 * time.Second
	// f2First is how many connections park first, to learn what each holds.
	f2First = 16
)

func init() {
	if sock := os.Getenv(parkEnv); sock != "" {
		os.Exit(parkAnswers(sock))
	}
}

// parkAnswers is the parking process: told "park N" on its standard input, it opens N more
// connections, each with SETTINGS_INITIAL_WINDOW_SIZE 0 and one call of parkPath whose answer
// it never opens a window for, and says "parked TOTAL" once each answer has begun. Whenever a
// parked call or its connection ends (reset by a window timeout, shed), it parks another in its
// place, on a new connection if need be. At the end of its input it closes them all and says
// "reparked N": how many it parked again.
func parkAnswers(sock string) int {
	p := &parker{sock: sock, stop: make(chan struct{})}
	in := bufio.NewScanner(os.Stdin)
	total := 0
	for in.Scan() {
		var n int
		if _, err := fmt.Sscanf(in.Text(), "park %d", &n); err != nil {
			fmt.Fprintln(os.Stderr, "park:", err)
			return 1
		}
		var wg sync.WaitGroup
		for range n {
			ready := make(chan struct{})
			p.wg.Go(func() { p.hold(ready) })
			wg.Go(func() { <-ready })
		}
		wg.Wait()
		total += n
		fmt.Printf("parked %d\n", total)
	}
	close(p.stop)
	p.wg.Wait()
	fmt.Printf("reparked %d\n", p.reparked.Load())
	return 0
}

type parker struct {
	sock     string
	stop     chan struct{}
	wg       sync.WaitGroup
	reparked atomic.Int64
}

func (p *parker) stopped() bool {
	select {
	case <-p.stop:
		return true
	default:
		return false
	}
}

// hold keeps one answer parked until stop; ready is closed once the first one has begun (or
// could not be parked).
func (p *parker) hold(ready chan struct{}) {
	var once sync.Once
	defer once.Do(func() { close(ready) })
	first := true
	for !p.stopped() {
		dialed := time.Now()
		h, err := dialH2(context.Background(), p.sock)
		if err != nil {
			return
		}
		if err := h.write(func() error { return h.fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0}) }); err != nil {
			h.close()
			return
		}
		for id := uint32(1); !h.isClosed() && !p.stopped(); id += 2 {
			if !first {
				p.reparked.Add(1)
			}
			first = false
			parked := time.Now()
			if h.call(id, parkPath) != nil {
				break
			}
			h.waitBegun(id, 10*time.Second) // or ended
			once.Do(func() { close(ready) })
			for !p.stopped() {
				if how, _ := h.waitEnd(id, time.Second); how != "" {
					break
				}
			}
			// The attacker's own pace: at most one call a connection each 100 ms.
			time.Sleep(time.Until(parked.Add(100 * time.Millisecond)))
		}
		h.close()
		// The attacker's own pace: at most one connection a slot each 100 ms.
		time.Sleep(time.Until(dialed.Add(100 * time.Millisecond)))
	}
}

// f2Result is what the F2 row saw on one server.
type f2Result struct {
	answered, dials int64
	holder          int // the parking process's pid
}

func f2Parked() attack {
	var got results[f2Result]
	return attack{
		name: fmt.Sprintf("F2: another process's ~250 connections park ~1 MiB answers to fill the budget to 253.5 MiB; a kubelet-like client lists its containers (21 MB) %d times on one connection", f2Lists),
		fake: []string{"-containers", bigRuntime, "-lists-once", "-sandboxes", parkSandboxes},
		on: func(ctx context.Context, t target) (string, func()) {
			did, r := parkAndList(ctx, t)
			got.set(t.server, r)
			return did, func() {}
		},
		check: func(o outcome) error {
			r, _ := got.get("podgate")
			var errs []error
			if r.answered*100 < f2Lists*95 {
				errs = append(errs, fmt.Errorf("the kubelet-like client's lists: %d/%d answered, fewer than 95 %%", r.answered, f2Lists))
			}
			if r.dials != 1 {
				errs = append(errs, fmt.Errorf("the kubelet-like client dialled %d connections, not one", r.dials))
			}
			if lines := refusalsNaming(o.log, o.attackerPID); len(lines) > 0 {
				errs = append(errs, fmt.Errorf("podgate's refusals name the kubelet-like client (pid %d), not the parking process (pid %d): %q", o.attackerPID, r.holder, lines[0]))
			}
			return errors.Join(errs...)
		},
	}
}

// parkAndList runs the parking process against t until the budget holds f2Target (podgate;
// against grpc-go, as many connections as would), then the kubelet-like client's lists.
func parkAndList(ctx context.Context, t target) (string, f2Result) {
	var r f2Result
	size, err := answerSize(ctx, t.sock)
	if err != nil {
		return "the answer to park: " + err.Error(), r
	}
	cmd := exec.CommandContext(ctx, os.Args[0])
	cmd.Env = append(os.Environ(), parkEnv+"="+t.sock)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return err.Error(), r
	}
	outPipe, err := cmd.StdoutPipe()
	if err != nil {
		return err.Error(), r
	}
	if err := cmd.Start(); err != nil {
		return err.Error(), r
	}
	defer cmd.Wait() //nolint:errcheck // its output says how it went
	r.holder = cmd.Process.Pid
	out := bufio.NewReader(outPipe)
	parked, held, err := fillBudget(ctx, t, in, out, size)
	if err != nil {
		_ = in.Close()
		return err.Error(), r
	}
	d := &dialer{sock: t.sock}
	conn, err := d.client()
	if err != nil {
		_ = in.Close()
		return err.Error(), r
	}
	ends := map[codes.Code]int{}
	for range f2Lists {
		cctx, cancel := context.WithTimeout(ctx, f2ListDeadline)
		_, err := runtimeapi.NewRuntimeServiceClient(conn).ListContainers(cctx, &runtimeapi.ListContainersRequest{})
		cancel()
		ends[status.Code(err)]++
	}
	_ = conn.Close()
	r.answered, r.dials = int64(ends[codes.OK]), d.dials.Load()
	_ = in.Close()
	var reparked int
	_ = scanLine(out, "reparked %d", &reparked)
	return fmt.Sprintf("holder pid %d: %d connections parked (%.0f KB each), %s; the kubelet-like client: %d/%d lists answered (%s), %d connection(s) dialled; the holder parked %d again",
		r.holder, parked, float64(size)/1e3, held, r.answered, f2Lists, codeSummary(ends), r.dials, reparked), r
}

// answerSize is the size of parkPath's answer on the wire (the message and its prefix).
func answerSize(ctx context.Context, sock string) (int, error) {
	conn, err := (&dialer{sock: sock}).client()
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	resp, err := runtimeapi.NewRuntimeServiceClient(conn).ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
	if err != nil {
		return 0, err
	}
	return proto.Size(resp) + 5, nil
}

// fillBudget has the parking process park answers until podgate's budget holds f2Target:
// f2First connections, then as many more as what those hold says fit. Against the grpc-go
// server, which counts nothing, as many as f2Target holds answers of size bytes. It returns
// how many it parked and what podgate held then.
func fillBudget(ctx context.Context, t target, in io.Writer, out *bufio.Reader, size int) (int, string, error) {
	park := func(n int) (int, error) {
		var total int
		if _, err := fmt.Fprintf(in, "park %d\n", n); err != nil {
			return 0, err
		}
		return total, scanLine(out, "parked %d", &total)
	}
	if t.pg == nil {
		total, err := park(f2Target / size)
		return total, "grpc-go counts nothing", err
	}
	held := func() float64 {
		v, _ := strconv.ParseFloat(metricLine(ctx, t.pg, "podgate_cri_budget_held_bytes"), 64)
		return v
	}
	if _, err := park(f2First); err != nil {
		return 0, "", err
	}
	first := waitHeld(held, float64(f2First*size))
	each := first / f2First
	if each < float64(size)/2 {
		return 0, "", fmt.Errorf("podgate held %.0f bytes for %d parked answers of %d bytes", first, f2First, size)
	}
	total, err := park(int((f2Target - first) / each))
	if err != nil {
		return 0, "", err
	}
	now := waitHeld(held, f2Target-each)
	return total, fmt.Sprintf("podgate held %.1f MiB", now/(1<<20)), nil
}

// waitHeld waits, at most 20 s, until held says at least want, and returns what it says then.
func waitHeld(held func() float64, want float64) float64 {
	deadline := time.Now().Add(20 * time.Second)
	for {
		v := held()
		if v >= want || time.Now().After(deadline) {
			return v
		}
		time.Sleep(50 * time.Millisecond) // polls podgate's metric, which the parked answers raise
	}
}
