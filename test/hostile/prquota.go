package main

// Issue 38's PodResources rows: one process that holds the socket's connections (half-open,
// idle, Watch) beside another process's calls, and forked processes that flood List. The
// processes that attack are this program run again, told what to do by the environment, so
// that each has a pid of its own as a real attacker would.

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	pb "github.com/podgate/podgate/podresources/api/v1alpha1"
)

// The environment of a child process: what it attacks and for how long.
const (
	holdEnv     = "HOSTILE_PODRESOURCES_HOLD"  // the socket: hold connections
	forkEnv     = "HOSTILE_PODRESOURCES_FLOOD" // the socket: call List as fast as possible
	durationEnv = "HOSTILE_PODRESOURCES_FOR"   // how long, a time.Duration
)

// Hold and flood sizes: issue 38's rows.
const (
	holdConnections = 64
	holdFor         = 15 * time.Second
	forks           = 30
	forkFor         = 3 * time.Second
)

func init() {
	d, _ := time.ParseDuration(os.Getenv(durationEnv))
	if sock := os.Getenv(holdEnv); sock != "" {
		os.Exit(holdPodResources(sock, d))
	}
	if sock := os.Getenv(forkEnv); sock != "" {
		os.Exit(floodFor(sock, d))
	}
}

// holdKinds are the connections the holding process opens, in turn.
var holdKinds = [...]string{"half-open", "idle", "Watch"}

// holdPodResources is the holding process: it opens holdConnections connections, in turn
// half-open (nothing sent), idle (HTTP/2's preface and SETTINGS) and Watch (a watch it never
// reads), prints how many of each the server accepted, holds them for d, and prints how many
// of each the server closed meanwhile.
func holdPodResources(sock string, d time.Duration) int {
	var held, closed [len(holdKinds)]atomic.Int64
	var conns []net.Conn
	for i := range holdConnections {
		kind := i % len(holdKinds)
		c, ok := holdOne(sock, kind)
		if !ok {
			continue
		}
		held[kind].Add(1)
		conns = append(conns, c)
		go func() {
			_, _ = io.Copy(io.Discard, c) // until the server closes it
			closed[kind].Add(1)
		}()
	}
	fmt.Printf("held %d %d %d\n", held[0].Load(), held[1].Load(), held[2].Load())
	time.Sleep(d) // the attack: hold them
	fmt.Printf("closed %d %d %d\n", closed[0].Load(), closed[1].Load(), closed[2].Load())
	for _, c := range conns {
		_ = c.Close()
	}
	return 0
}

// holdOne opens one connection of a kind and says whether the server accepted it: it sent its
// SETTINGS (a connection over a quota is closed at once, before).
func holdOne(sock string, kind int) (net.Conn, bool) {
	c, err := net.Dial("unix", sock)
	if err != nil {
		return nil, false
	}
	fr := http2.NewFramer(c, c)
	if kind > 0 {
		_, _ = io.WriteString(c, http2.ClientPreface)
		_ = fr.WriteSettings()
	}
	if kind == 2 {
		_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: grpcBlock(pb.PodResources_Watch_FullMethodName), EndHeaders: true})
		_ = fr.WriteData(1, true, []byte{0, 0, 0, 0, 0}) // an empty WatchRequest
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err = io.ReadFull(c, make([]byte, 9))
	_ = c.SetReadDeadline(time.Time{})
	if err != nil {
		_ = c.Close()
		return nil, false
	}
	return c, true
}

// holdResult is what the holding attack found.
type holdResult struct {
	pid            int // the holding process
	held, closed   [len(holdKinds)]int
	lists, watches int // the other process's calls answered, of 10 each
}

func (r holdResult) String() string {
	var held, closed []string
	for i, k := range holdKinds {
		held = append(held, fmt.Sprintf("%d %s", r.held[i], k))
		closed = append(closed, fmt.Sprintf("%d %s", r.closed[i], k))
	}
	return fmt.Sprintf("the holder kept %s of %d; podgate closed %s within %s; the other process: List %d/10, Watch %d/10 answered",
		strings.Join(held, ", "), holdConnections, strings.Join(closed, ", "), holdFor, r.lists, r.watches)
}

// holdAndCall runs the holding process against sock and, while it holds, makes 10 List and
// 10 Watch calls from this process, each on a connection of its own as a CNI plugin does.
func holdAndCall(ctx context.Context, sock string) (holdResult, error) {
	var r holdResult
	cmd := exec.CommandContext(ctx, os.Args[0])
	cmd.Env = append(os.Environ(), holdEnv+"="+sock, durationEnv+"="+holdFor.String())
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return r, err
	}
	if err := cmd.Start(); err != nil {
		return r, err
	}
	defer cmd.Wait() //nolint:errcheck // its output says how it went
	r.pid = cmd.Process.Pid
	lines := bufio.NewReader(out)
	if err := scanLine(lines, "held %d %d %d", &r.held[0], &r.held[1], &r.held[2]); err != nil {
		return r, err
	}
	for range 10 {
		if callOnce(ctx, sock, listCall) == nil {
			r.lists++
		}
		if callOnce(ctx, sock, watchCall) == nil {
			r.watches++
		}
	}
	if err := scanLine(lines, "closed %d %d %d", &r.closed[0], &r.closed[1], &r.closed[2]); err != nil {
		return r, err
	}
	return r, nil
}

func scanLine(r *bufio.Reader, format string, args ...any) error {
	line, err := r.ReadString('\n')
	if err != nil {
		return fmt.Errorf("the holding process: %w", err)
	}
	if _, err := fmt.Sscanf(line, format, args...); err != nil {
		return fmt.Errorf("the holding process said %q: %w", line, err)
	}
	return nil
}

// callOnce makes one call on a connection of its own, within 5 s.
func callOnce(ctx context.Context, sock string, call func(context.Context, *grpc.ClientConn) error) error {
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return call(ctx, conn)
}

func listCall(ctx context.Context, conn *grpc.ClientConn) error {
	_, err := podresourcesv1.NewPodResourcesListerClient(conn).List(ctx, &podresourcesv1.ListPodResourcesRequest{})
	return err
}

// watchCall watches until SYNCED.
func watchCall(ctx context.Context, conn *grpc.ClientConn) error {
	w, err := pb.NewPodResourcesClient(conn).Watch(ctx, &pb.WatchRequest{})
	if err != nil {
		return err
	}
	for {
		ev, err := w.Recv()
		if err != nil {
			return err
		}
		if ev.GetType() == pb.WatchEvent_SYNCED {
			return nil
		}
	}
}

// floodFor is a forked flooding process: List on sock from 4 goroutines for d; it prints how
// many calls were answered, refused (ResourceExhausted) and failed otherwise.
func floodFor(sock string, d time.Duration) int {
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer conn.Close()
	var ok, refused, other atomic.Int64
	end := time.Now().Add(d)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for time.Now().Before(end) {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				_, err := podresourcesv1.NewPodResourcesListerClient(conn).List(ctx, &podresourcesv1.ListPodResourcesRequest{})
				cancel()
				switch status.Code(err) {
				case codes.OK:
					ok.Add(1)
				case codes.ResourceExhausted:
					refused.Add(1)
				default:
					other.Add(1)
				}
			}
		})
	}
	wg.Wait()
	fmt.Printf("%d %d %d\n", ok.Load(), refused.Load(), other.Load())
	return 0
}

// forkResult is what the forked processes had answered, and in how long.
type forkResult struct {
	answered, refused, other int
	took                     time.Duration
}

func (r forkResult) String() string {
	return fmt.Sprintf("%d processes: %d answered in %.1f s (%.0f/s), %d ResourceExhausted, %d other",
		forks, r.answered, r.took.Seconds(), float64(r.answered)/r.took.Seconds(), r.refused, r.other)
}

// forkFlood runs forks flooding processes of this user at once against sock, each for forkFor.
func forkFlood(ctx context.Context, sock string) (forkResult, error) {
	var (
		r    forkResult
		mu   sync.Mutex
		errs []error
		wg   sync.WaitGroup
	)
	start := time.Now()
	for range forks {
		wg.Go(func() {
			cmd := exec.CommandContext(ctx, os.Args[0])
			cmd.Env = append(os.Environ(), forkEnv+"="+sock, durationEnv+"="+forkFor.String())
			cmd.Stderr = os.Stderr
			out, err := cmd.Output()
			var ok, refused, other int
			if err == nil {
				_, err = fmt.Sscanf(string(out), "%d %d %d", &ok, &refused, &other)
			}
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, fmt.Errorf("a flooding process: %w (%q)", err, out))
			}
			r.answered += ok
			r.refused += refused
			r.other += other
		})
	}
	wg.Wait()
	r.took = time.Since(start)
	if len(errs) > 0 {
		return r, errs[0]
	}
	return r, nil
}

// holdAttack and forkAttack are the rows of the table.
func holdAttack(ctx context.Context, sock string) (string, func()) {
	r, err := holdAndCall(ctx, sock)
	if err != nil {
		return err.Error(), func() {}
	}
	return fmt.Sprintf("holder pid %d: %s", r.pid, r), func() {}
}

func forkAttack(ctx context.Context, sock string) (string, func()) {
	r, err := forkFlood(ctx, sock)
	if err != nil {
		return err.Error(), func() {}
	}
	return r.String(), func() {}
}
