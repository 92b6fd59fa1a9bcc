package main

// The table of make attacks and what TestAttacks checks: each attack measured on fresh
// processes, podgate's and the grpc-go server's, and what podgate must hold.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/podgate/podgate/test/harness"
)

// runAttacks runs every attack against podgate and against the grpc-go server, each on fresh
// processes, and prints the table; the last column says whether podgate held what TestAttacks
// checks of the attack (verdict).
func runAttacks(ctx context.Context, r *rig, silence, stressFor time.Duration, only string) {
	fmt.Println("| what one local client does | server | RSS MB before → after (peak) | goroutines after | kubelet's Version answered | what the server did | podgate's refusal log lines | CPU | held MB | check |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|---|")
	for _, a := range attacks(silence, stressFor) {
		if !strings.Contains(a.name, only) {
			continue
		}
		// As TestAttacks does: an anchored attack's check compares podgate with grpc-go, which
		// goes first; any other's reads what the attack saw of podgate, so that it is checked
		// before grpc-go is attacked.
		servers := []string{"podgate", "grpc-go"}
		switch {
		case a.podResources:
			servers = servers[:1]
		case a.anchored:
			servers = []string{"grpc-go", "podgate"}
		}
		rows := map[string]string{}
		for _, server := range servers {
			o, err := measure(ctx, r, a, server)
			switch {
			case err != nil:
				rows[server] = "error: " + err.Error() + " | —"
			case server != "podgate":
				rows[server] = o.row(a) + " | —"
			default:
				held := "holds"
				if errs := verdict(a, o); len(errs) > 0 {
					held = "**fails**: " + strings.ReplaceAll(errors.Join(errs...).Error(), "\n", " ")
				}
				rows[server] = o.row(a) + " | " + held
			}
		}
		for _, server := range []string{"podgate", "grpc-go"} {
			if row, ok := rows[server]; ok {
				fmt.Printf("| %s | %s | %s |\n", a.name, server, row)
			}
		}
	}
}

// outcome is what one attack did to one server.
type outcome struct {
	before, after    memory
	goroutines       string
	kubelet          probed // what the kubelet-shaped client saw
	did              string
	log              string // podgate's
	cpu              time.Duration
	held             string // podgate_cri_budget_held_bytes at the attack's end
	podgate          bool
	pid, attackerPID int
}

// peakRSS bounds podgate's resident memory in every attack, with default limits: the
// criSocketLimits.totalBytes budget (256 MiB) and what Go's allocator and collector add.
const peakRSS = 384 << 20

// verdict is what podgate's outcome o of a breaks, of what every attack must hold (peak RSS
// within peakRSS, the kubelet-shaped client's Version answered throughout, a log line naming
// the attacking process where podgate refused it) and of a's own check.
func verdict(a attack, o outcome) []error {
	var errs []error
	if peak := o.after.hwm * 1e6; peak > peakRSS {
		errs = append(errs, fmt.Errorf("podgate's RSS peaked at %.0f MB, over %d MiB", o.after.hwm, peakRSS>>20))
	}
	if k := o.kubelet; k.answered != k.calls || k.calls == 0 {
		err := fmt.Errorf("the kubelet's Version: %d of %d answered within %s", k.answered, k.calls, kubeletDeadline)
		if k.failed != nil {
			err = fmt.Errorf("%w; the first that failed: %w", err, k.failed)
		}
		errs = append(errs, err)
	}
	if a.offends && len(refusalsNaming(o.log, o.attackerPID)) == 0 {
		errs = append(errs, fmt.Errorf("no refusal log line names the attacking process (pid %d):\n%s", o.attackerPID, refusalLog(o.log)))
	}
	if a.check != nil {
		if err := a.check(o); err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

// refusalLog is podgate's refusal lines.
func refusalLog(log string) string {
	var b strings.Builder
	for line := range strings.Lines(log) {
		if strings.Contains(line, "A CRI client misbehaved") || strings.Contains(line, "Refused a PodResources client") {
			b.WriteString(line)
		}
	}
	return b.String()
}

// refusalLines are podgate's log lines for a client it refused or cut off, on either socket.
func (o outcome) refusalLines() int {
	return strings.Count(o.log, "Refused a PodResources client") + strings.Count(o.log, "A CRI client misbehaved")
}

func (o outcome) row(a attack) string {
	logLines, cpu := "—", o.cpu.Round(time.Millisecond).String()
	if o.podgate {
		logLines = fmt.Sprint(o.refusalLines())
	}
	if a.frames > 0 {
		cpu = fmt.Sprintf("%.1f µs/frame", float64(o.cpu.Microseconds())/float64(a.frames))
	}
	return fmt.Sprintf("%.0f → %.0f (%.0f) | %s | %d/%d (slowest %s) | %s | %s | %s | %s", o.before.rss, o.after.rss, o.after.hwm, o.goroutines, o.kubelet.answered, o.kubelet.calls, o.kubelet.slowest.Round(time.Millisecond), o.did, logLines, cpu, o.held)
}

func measure(ctx context.Context, r *rig, a attack, server string) (outcome, error) {
	f, err := r.startFake(a.fake...)
	if err != nil {
		return outcome{}, err
	}
	defer f.stop()
	o := outcome{goroutines: "—", held: "—", attackerPID: os.Getpid()}
	pid, sock, criSock := f.cmd.Process.Pid, f.sock, f.sock
	var pg *harness.Podgate
	if server == "podgate" {
		if pg, err = r.startPodgate(ctx, f, a.config); err != nil {
			return outcome{}, err
		}
		defer func() { _, _ = pg.Stop(30 * time.Second) }()
		pid, sock, criSock = pg.PID(), pg.Socket, pg.Socket
		if a.podResources {
			sock = pg.PodResourcesSocket
		}
		o.podgate = true
	}
	o.pid = pid
	k, err := startKubelet(criSock)
	if err != nil {
		return outcome{}, err
	}
	// The kubelet-shaped client is answered before the attack, and again while the attack's
	// connections are still held.
	if err := k.waitCalls(3); err != nil {
		k.finish()
		return outcome{}, err
	}
	o.before = readMemory(pid)
	cpuBefore := readCPU(pid)
	actx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	var did string
	var cleanup func()
	if a.on != nil {
		did, cleanup = a.on(actx, target{server: server, sock: sock, pid: pid, pg: pg})
	} else {
		did, cleanup = a.run(actx, sock)
	}
	cancel()
	err = k.waitCalls(k.calls.Load() + 3)
	o.did = did
	o.cpu = readCPU(pid) - cpuBefore
	o.after = readMemory(pid)
	if pg != nil {
		o.goroutines = metricLine(ctx, pg, "go_goroutines")
		if held, err := strconv.ParseFloat(metricLine(ctx, pg, "podgate_cri_budget_held_bytes"), 64); err == nil {
			o.held = fmt.Sprintf("%.1f", held/1e6)
		}
	}
	cleanup()
	o.kubelet = k.finish()
	if pg != nil {
		o.log = pg.Log.String()
	}
	return o, err
}

// waitCalls waits until the client has made n calls, at most 30 s beyond the deadline of a
// call in flight (it calls every 100 ms, each with kubeletDeadline).
func (k *kubelet) waitCalls(n int64) error {
	deadline := time.Now().Add(30*time.Second + kubeletDeadline)
	for k.calls.Load() < n {
		if time.Now().After(deadline) {
			return fmt.Errorf("the kubelet-shaped client made %d calls in 30 s, not %d", k.calls.Load(), n)
		}
		time.Sleep(20 * time.Millisecond) // polls a counter the client's ticker advances
	}
	return nil
}

func metricLine(ctx context.Context, pg *harness.Podgate, name string) string {
	page, err := pg.Metrics(ctx)
	if err != nil {
		return "?"
	}
	m := regexp.MustCompile(`(?m)^` + name + ` (\S+)$`).FindStringSubmatch(page)
	if m == nil {
		return "?"
	}
	return m[1]
}

// refusalsNaming are podgate's refusal lines that name process pid.
func refusalsNaming(log string, pid int) []string {
	re := regexp.MustCompile(`\bpid=` + strconv.Itoa(pid) + `\b`)
	var lines []string
	for line := range strings.Lines(refusalLog(log)) {
		if re.MatchString(line) {
			lines = append(lines, line)
		}
	}
	return lines
}
