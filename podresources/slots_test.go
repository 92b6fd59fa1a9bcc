package podresources

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2/ktesting"
	v1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	pb "github.com/podgate/podgate/podresources/api/v1alpha1"
)

// holdEnv names the socket a child process of the test binary holds connections of
// (TestHoldingClient), holdCountEnv how many it opens.
const (
	holdEnv      = "PODGATE_TEST_HOLD_SOCKET"
	holdCountEnv = "PODGATE_TEST_HOLD_COUNT"
)

// TestHoldingClient is the process that holds connections when the test binary runs as the
// child of a test (startHolder): it opens the connections, says nothing on them, reads the
// server's SETTINGS on each (it was accepted) or its end (it was refused), prints how many
// it holds and keeps them until its stdin closes.
func TestHoldingClient(t *testing.T) {
	sock := os.Getenv(holdEnv)
	if sock == "" {
		t.Skip("only as the child of a test of the connection quotas")
	}
	n, err := strconv.Atoi(os.Getenv(holdCountEnv))
	if err != nil {
		t.Fatal(err)
	}
	var held []net.Conn
	for range n {
		c, err := net.Dial("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
		if _, err := io.ReadFull(c, make([]byte, 9)); err != nil {
			_ = c.Close()
			continue
		}
		held = append(held, c)
	}
	fmt.Printf("holding %d\n", len(held))
	_, _ = io.Copy(io.Discard, os.Stdin)
	for _, c := range held {
		_ = c.Close()
	}
}

// startHolder runs TestHoldingClient as a child holding up to n connections of sock, and
// returns it and how many it holds; it ends with the test.
func startHolder(t *testing.T, sock string, n int) (*exec.Cmd, int) {
	t.Helper()
	child := exec.Command(os.Args[0], "-test.run=^TestHoldingClient$", "-test.count=1")
	child.Env = append(os.Environ(), holdEnv+"="+sock, holdCountEnv+"="+strconv.Itoa(n))
	child.Stderr = os.Stderr
	stdin, err := child.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = stdin.Close()
		_ = child.Wait()
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	var held int
	if _, serr := fmt.Sscanf(line, "holding %d", &held); err != nil || serr != nil {
		t.Fatalf("the holding client said %q: %v %v", line, err, serr)
	}
	return child, held
}

// TestOneProcessCannotHoldEveryConnection (issue 38's row, with the default quotas): a process
// that opens 64 connections holds its quarter, 16, and is refused the rest, with a log line
// naming it as the holder and the slots metric naming it; another process's calls, each on a
// connection of its own as a CNI plugin makes them, are all answered.
func TestOneProcessCannotHoldEveryConnection(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("peer credentials are read on Linux")
	}
	ctx := testContext(t)
	logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true)))
	// The header timeout is out of the way: this is about the quotas.
	r := newRig(t, Options{Source: webSource(), HeaderTimeout: time.Minute, Logger: logger})
	child, held := startHolder(t, r.path, DefaultMaxConnections)
	if held != DefaultMaxConnections/4 {
		t.Errorf("the holding process holds %d connections, want its quota of %d", held, DefaultMaxConnections/4)
	}
	for i := range 10 {
		if _, err := v1.NewPodResourcesListerClient(dial(t, r.path)).List(ctx, &v1.ListPodResourcesRequest{}); err != nil {
			t.Errorf("call %d of another process, on a connection of its own: %v", i+1, err)
		}
	}
	pid := strconv.Itoa(child.Process.Pid)
	logs := logger.GetSink().(ktesting.Underlier).GetBuffer().String()
	if want := fmt.Sprintf(`pid=%s uid=%d reason="connections_per_process"`, pid, os.Getuid()); !strings.Contains(logs, want) ||
		!strings.Contains(logs, "holderPid="+pid) || !strings.Contains(logs, `holds="16 connections"`) {
		t.Errorf("the log does not name the holding process (%s) and what it holds:\n%s", want, logs)
	}
	if got := metricValue(t, r.metrics, "podgate_podresources_refusals_total", "reason", "connections_per_process"); got != float64(DefaultMaxConnections-held) {
		t.Errorf("refusals_total{connections_per_process} = %v, want %d", got, DefaultMaxConnections-held)
	}
	if got := metricValue(t, r.metrics, "podgate_podresources_slots", "kind", "connections", "pid", pid, "uid", strconv.Itoa(os.Getuid())); got != float64(held) {
		t.Errorf("podgate_podresources_slots{connections, the holder} = %v, want %d", got, held)
	}
}

// TestRefusalNamesTheHolder: when the socket's connections are all taken by one process, the
// line about another process refused names the one that holds them.
func TestRefusalNamesTheHolder(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("peer credentials are read on Linux")
	}
	ctx := testContext(t)
	logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true)))
	r := newRig(t, Options{Source: webSource(), MaxConnections: 4, MaxConnectionsPerProcess: 4, HeaderTimeout: time.Minute, Logger: logger})
	child, held := startHolder(t, r.path, 4)
	if held != 4 {
		t.Fatalf("the holding process holds %d connections, want 4", held)
	}
	if _, err := r.v1().List(ctx, &v1.ListPodResourcesRequest{}, grpc.WaitForReady(false)); status.Code(err) != codes.Unavailable {
		t.Errorf("a call of another process while the socket is full: %v, want Unavailable (connection closed)", err)
	}
	logs := logger.GetSink().(ktesting.Underlier).GetBuffer().String()
	want := fmt.Sprintf(`pid=%d uid=%d reason="connections" client="opened a connection" podgate="closed it" holderPid=%d holderUid=%d holds="4 connections" quota="podResources.maxConnections 4"`,
		os.Getpid(), os.Getuid(), child.Process.Pid, os.Getuid())
	if !strings.Contains(logs, want) {
		t.Errorf("the log does not name the refused process and the holder, want\n%s\nin:\n%s", want, logs)
	}
}

// TestSlotsQuotas: a process is held to its quota, then its user, then the socket; the refusal
// names the process that holds the most within the quota that refused; a slot given back
// (once, however often release is called) makes room.
func TestSlotsQuotas(t *testing.T) {
	s := newSlots([numKinds]quota{kindStreams: {total: 6, perUser: 4, perProcess: 2,
		totalKey: "total", perUserKey: "user", perProcessKey: "process"}})
	take := func(p peerID) func() {
		t.Helper()
		release, h := s.acquire(p, kindStreams)
		if h != nil {
			t.Fatalf("%+v refused: %+v", p, *h)
		}
		return release
	}
	a1, a2, a3, b := peerID{pid: 1, uid: 10}, peerID{pid: 2, uid: 10}, peerID{pid: 3, uid: 10}, peerID{pid: 4, uid: 20}
	releaseA1 := take(a1)
	take(a1)
	take(a2)
	if _, h := s.acquire(a1, kindStreams); h == nil || h.reason() != "streams_per_process" || h.peer != a1 || h.held != 2 {
		t.Errorf("a1 over its quota: %+v, want streams_per_process naming a1 with 2", h)
	}
	take(a2)
	if _, h := s.acquire(a3, kindStreams); h == nil || h.reason() != "streams_per_user" || h.peer != a1 || h.held != 2 {
		t.Errorf("a3 over its user's quota: %+v, want streams_per_user naming a1 (2, the lowest pid of the two that hold 2)", h)
	}
	take(b)
	take(b)
	if _, h := s.acquire(peerID{pid: 5, uid: 30}, kindStreams); h == nil || h.reason() != "streams" || h.peer != a1 {
		t.Errorf("a newcomer over the socket's total: %+v, want streams naming a1", h)
	}
	releaseA1()
	releaseA1()
	take(a3)
	if _, h := s.acquire(a3, kindStreams); h == nil || h.reason() != "streams" {
		t.Errorf("a3 after one slot came back and it took it: %+v, want the socket's total", h)
	}
	tops := s.tops(2)[kindStreams]
	if len(tops) != 2 || tops[0] != (held{a2, 2}) || tops[1] != (held{b, 2}) {
		t.Errorf("top holders %+v, want a2 and b with 2 each", tops)
	}
}

// TestStreamQuotaPerProcess: a process's calls open at once over all its connections are held
// to maxStreamsPerProcess: one over is ResourceExhausted, with a line naming what it holds;
// a call that ends gives its slot back.
func TestStreamQuotaPerProcess(t *testing.T) {
	ctx := testContext(t)
	logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true)))
	r := newRig(t, Options{Source: webSource(), MaxStreamsPerProcess: 2, Logger: logger})
	other := dial(t, r.path)
	var cancels []context.CancelFunc
	for _, conn := range []*grpc.ClientConn{r.conn, other} {
		sctx, cancel := context.WithCancel(ctx)
		cancels = append(cancels, cancel)
		// A unary method opened as a stream whose request never comes: it stays open.
		if _, err := conn.NewStream(sctx, &grpc.StreamDesc{ClientStreams: true}, "/v1.PodResourcesLister/List"); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "the server has both streams open", func() bool {
		tops := r.server.guard.slots.tops(1)[kindStreams]
		return len(tops) == 1 && tops[0].n == 2
	})
	if _, err := r.v1().List(ctx, &v1.ListPodResourcesRequest{}); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("a third call with two open on two connections: %v, want ResourceExhausted", err)
	}
	logs := logger.GetSink().(ktesting.Underlier).GetBuffer().String()
	if !strings.Contains(logs, `reason="streams_per_process"`) || !strings.Contains(logs, `holds="2 streams"`) {
		t.Errorf("the log does not tell of the process's streams:\n%s", logs)
	}
	cancels[0]()
	eventually(t, "a call after one stream ended is served", func() bool {
		_, err := r.v1().List(ctx, &v1.ListPodResourcesRequest{})
		return err == nil
	})
	cancels[1]()
}

// TestHeaderTimeoutClosesHalfOpenConnections: a connection that says nothing, and one that
// says HTTP/2's preface and SETTINGS but opens no call, are closed after headerTimeout, which
// gives their slots back, and each is counted; a connection that opened a call stays.
func TestHeaderTimeoutClosesHalfOpenConnections(t *testing.T) {
	ctx := testContext(t)
	r := newRig(t, Options{Source: webSource(), HeaderTimeout: 300 * time.Millisecond, MaxConnections: 3, MaxConnectionsPerProcess: 3})
	if _, err := r.v1().List(ctx, &v1.ListPodResourcesRequest{}); err != nil {
		t.Fatal(err)
	}
	silent, err := net.Dial("unix", r.path)
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	preface, err := net.Dial("unix", r.path)
	if err != nil {
		t.Fatal(err)
	}
	defer preface.Close()
	fr := http2.NewFramer(preface, preface)
	if _, err := io.WriteString(preface, http2.ClientPreface); err != nil {
		t.Fatal(err)
	}
	if err := fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]net.Conn{"silent": silent, "preface only": preface} {
		_ = c.SetReadDeadline(time.Now().Add(15 * time.Second))
		if _, err := io.Copy(io.Discard, c); err != nil && !errors.Is(err, net.ErrClosed) && !strings.Contains(err.Error(), "reset by peer") {
			t.Errorf("the %s connection: %v, want it closed by the server", name, err)
		}
	}
	if got := metricValue(t, r.metrics, "podgate_podresources_refusals_total", "reason", "header_timeout"); got != 2 {
		t.Errorf("refusals_total{header_timeout} = %v, want 2 (not the connection that called)", got)
	}
	// Their slots are free again: two more connections fit within the total of 3.
	for range 2 {
		if _, err := v1.NewPodResourcesListerClient(dial(t, r.path)).List(ctx, &v1.ListPodResourcesRequest{}); err != nil {
			t.Errorf("a call on a new connection after the half-open ones closed: %v", err)
		}
	}
}

// TestWatchThatDoesNotReadIsEnded: a client that stops reading its watch blocks the watch's
// send on flow control; after watchSendTimeout the watch ends, gives its slots back, and is
// counted and logged; the client's other calls on the same connection go on, and once it
// reads it gets what was sent, then Canceled (grpc-go's Send ends only with the stream's
// context, and says so; the log and the metric say why).
func TestWatchThatDoesNotReadIsEnded(t *testing.T) {
	ctx := testContext(t)
	logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true)))
	b := NewBroadcaster(4, 4096)
	r := newRig(t, Options{Source: webSource(), Broadcaster: b, WatchSendTimeout: 300 * time.Millisecond, Logger: logger})
	// Fixed windows (no BDP estimation), as in TestWatchSlowWatcherDropped.
	conn := dial(t, r.path, grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
	w, err := pb.NewPodResourcesClient(conn).Watch(ctx, &pb.WatchRequest{})
	if err != nil {
		t.Fatal(err)
	}
	recvUntilSynced(t, w)
	// 64 events of 16 KiB, 1 MiB: past the window and grpc-go's write quota (64 KiB each),
	// within the buffer, so that the watch blocks in its send rather than falling behind.
	for i := range 64 {
		b.Publish(event(pb.WatchEvent_POD_UPDATED, uint64(i+2), bigPod("uid-big", 16<<10)))
	}
	eventually(t, "the watch that is not read ends", func() bool { return b.Watchers() == 0 })
	if got := metricValue(t, r.metrics, "podgate_podresources_refusals_total", "reason", "watch_stalled"); got != 1 {
		t.Errorf("refusals_total{watch_stalled} = %v, want 1", got)
	}
	if got := metricValue(t, r.metrics, "podgate_podresources_watchers_dropped_total"); got != 1 {
		t.Errorf("watchers_dropped_total = %v, want 1", got)
	}
	if logs := logger.GetSink().(ktesting.Underlier).GetBuffer().String(); !strings.Contains(logs, `reason="watch_stalled"`) ||
		!strings.Contains(logs, fmt.Sprintf("pid=%d", os.Getpid())) {
		t.Errorf("the log does not name the client whose watch ended:\n%s", logs)
	}
	if _, err := v1.NewPodResourcesListerClient(conn).List(ctx, &v1.ListPodResourcesRequest{}); err != nil {
		t.Errorf("a call on the watch's connection after it ended: %v", err)
	}
	eventually(t, "the watch's slots are given back", func() bool { return len(r.server.guard.slots.tops(1)[kindWatches]) == 0 })
	got := 0
	for {
		if _, err := w.Recv(); err != nil {
			if status.Code(err) != codes.Canceled || ctx.Err() != nil {
				t.Fatalf("after %d events: %v, want Canceled by the server", got, err)
			}
			break
		}
		got++
	}
	if got >= 64 {
		t.Errorf("the client read all %d events, want fewer: its watch ended", got)
	}
}

// TestForkedProcessesShareTheirUsersRate: processes of one user (children of the test, as a
// forking client's) are held together to the user's bucket, twice a process's by default, not
// each to a process's: 4 processes with a burst of 20 each get 40 calls answered, not 80.
func TestForkedProcessesShareTheirUsersRate(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("peer credentials are read on Linux")
	}
	logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true)))
	// A call every 100 s refills nothing the floods would notice.
	r := newRig(t, Options{Source: webSource(), QPS: 0.01, Burst: 20, Logger: logger})
	var wg sync.WaitGroup
	answered := make([]int, 4)
	for i := range answered {
		wg.Go(func() {
			child := exec.Command(os.Args[0], "-test.run=^TestFloodingClient$", "-test.count=1")
			child.Env = append(os.Environ(), floodEnv+"="+r.path)
			out, err := child.CombinedOutput()
			var refused int
			if j := strings.Index(string(out), "flood: "); err != nil || j < 0 {
				t.Errorf("flooding client %d: %v\n%s", i, err, out)
			} else if _, err := fmt.Sscanf(string(out[j:]), "flood: %d answered, %d refused", &answered[i], &refused); err != nil {
				t.Errorf("flooding client %d said %q: %v", i, out, err)
			}
		})
	}
	wg.Wait()
	total := 0
	for i, n := range answered {
		total += n
		if n > 20 {
			t.Errorf("flooding client %d had %d calls answered, over its own burst of 20", i, n)
		}
	}
	if total != 40 {
		t.Errorf("4 processes of one user had %d calls answered (%v), want the user's burst of 40", total, answered)
	}
	if logs := logger.GetSink().(ktesting.Underlier).GetBuffer().String(); !strings.Contains(logs, `reason="rate_limit_per_user"`) {
		t.Errorf("no line tells of the user's rate limit:\n%s", logs)
	}
}

// TestWatchQuotaPerProcess: a process runs at most maxWatchesPerProcess watches, far below the
// socket's 64: one over is ResourceExhausted with a line saying what the process holds; the
// watch ending gives the slot back.
func TestWatchQuotaPerProcess(t *testing.T) {
	ctx := testContext(t)
	logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true)))
	r := newRig(t, Options{Source: webSource(), MaxWatchesPerProcess: 1, Logger: logger})
	firstCtx, endFirst := context.WithCancel(ctx)
	defer endFirst()
	first, err := r.ext().Watch(firstCtx, &pb.WatchRequest{})
	if err != nil {
		t.Fatal(err)
	}
	recvUntilSynced(t, first)
	second, err := r.ext().Watch(ctx, &pb.WatchRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := second.Recv(); status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "podResources.maxWatchesPerProcess 1") {
		t.Fatalf("a second watch of the process: %v, want ResourceExhausted naming podResources.maxWatchesPerProcess", err)
	}
	if logs := logger.GetSink().(ktesting.Underlier).GetBuffer().String(); !strings.Contains(logs, `reason="watches_per_process"`) ||
		!strings.Contains(logs, `holds="1 watches"`) {
		t.Errorf("the log does not tell of the process's watches:\n%s", logs)
	}
	endFirst()
	eventually(t, "a watch after the first ended is served", func() bool {
		w, err := r.ext().Watch(ctx, &pb.WatchRequest{})
		if err != nil {
			return false
		}
		_, err = w.Recv()
		return err == nil
	})
}
