package podresources

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2/ktesting"
	v1 "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// floodEnv names the socket a child process of the test binary floods (TestFloodingClient).
const floodEnv = "PODGATE_TEST_FLOOD_SOCKET"

// TestFloodingClient is the flooding client of TestOneClientsFloodLeavesAnotherServed when
// the test binary runs as its child: it makes 300 calls as fast as it can and prints how many
// were answered and how many refused.
func TestFloodingClient(t *testing.T) {
	sock := os.Getenv(floodEnv)
	if sock == "" {
		t.Skip("only as the child of TestOneClientsFloodLeavesAnotherServed")
	}
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var ok, refused int
	for range 300 {
		_, err := v1.NewPodResourcesListerClient(conn).List(ctx, &v1.ListPodResourcesRequest{})
		switch status.Code(err) {
		case codes.OK:
			ok++
		case codes.ResourceExhausted:
			refused++
		default:
			t.Fatalf("a call: %v", err)
		}
	}
	fmt.Printf("flood: %d answered, %d refused\n", ok, refused)
}

// TestOneClientsFloodLeavesAnotherServed: the rate limit is each client's, told apart by the
// socket's peer credentials: a process that floods the socket is refused past its burst, one
// log line names its pid, and another process (this one) is then served its whole burst.
func TestOneClientsFloodLeavesAnotherServed(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("peer credentials are read on Linux")
	}
	logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true)))
	// A call every 100 s refills nothing the flood or the check below would notice.
	r := newRig(t, Options{Source: webSource(), QPS: 0.01, Burst: 20, Logger: logger})

	child := exec.Command(os.Args[0], "-test.run=^TestFloodingClient$", "-test.count=1")
	child.Env = append(os.Environ(), floodEnv+"="+r.path)
	out, err := child.CombinedOutput()
	if err != nil {
		t.Fatalf("the flooding client: %v\n%s", err, out)
	}
	var ok, refused int
	if i := strings.Index(string(out), "flood: "); i < 0 {
		t.Fatalf("the flooding client said:\n%s", out)
	} else if _, err := fmt.Sscanf(string(out[i:]), "flood: %d answered, %d refused", &ok, &refused); err != nil {
		t.Fatalf("the flooding client said %q: %v", out, err)
	}
	if ok != 20 || refused != 280 {
		t.Errorf("the flooding client had %d calls answered and %d refused, want its burst of 20 answered", ok, refused)
	}

	ctx := testContext(t)
	for i := range 20 {
		if _, err := r.v1().List(ctx, &v1.ListPodResourcesRequest{}); err != nil {
			t.Fatalf("call %d of another client after the flood: %v", i+1, err)
		}
	}
	if _, err := r.v1().List(ctx, &v1.ListPodResourcesRequest{}); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("the other client's call past its own burst: %v, want ResourceExhausted", err)
	}

	if got := metricValue(t, r.metrics, "podgate_podresources_refusals_total", "reason", "rate_limit"); got != float64(refused+1) {
		t.Errorf("refusals_total{rate_limit} = %v, want %d", got, refused+1)
	}
	logs := logger.GetSink().(ktesting.Underlier).GetBuffer().String()
	lines := strings.Count(logs, "Refused a PodResources client")
	if want := fmt.Sprintf("pid=%d", child.Process.Pid); !strings.Contains(logs, want) || !strings.Contains(logs, fmt.Sprintf("uid=%d", os.Getuid())) {
		t.Errorf("the log does not name the flooding client (%s):\n%s", want, logs)
	}
	if lines != 2 {
		t.Errorf("%d log lines for two refused clients (%d refusals), want one each:\n%s", lines, refused+1, logs)
	}
}

// TestRateLimitCountsStreamsAsTheyOpen: a call is counted when its stream opens, so streams
// that never send their request use the client's burst up as calls do.
func TestRateLimitCountsStreamsAsTheyOpen(t *testing.T) {
	ctx := testContext(t)
	r := newRig(t, Options{Source: webSource(), QPS: 1, Burst: 2})
	for range 2 {
		// A unary method opened as a stream whose request never comes.
		if _, err := r.conn.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true}, "/v1.PodResourcesLister/List"); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := r.v1().List(ctx, &v1.ListPodResourcesRequest{}); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("a call after two streams that never sent their request: %v, want ResourceExhausted", err)
	}
}

// TestHeaderListLimit: a header block larger than a client needs (64 KiB) is refused, one
// within it is served.
func TestHeaderListLimit(t *testing.T) {
	ctx := testContext(t)
	r := newRig(t, Options{Source: webSource()})
	small := metadata.AppendToOutgoingContext(ctx, "x-small", strings.Repeat("a", 1000))
	if _, err := r.v1().List(small, &v1.ListPodResourcesRequest{}); err != nil {
		t.Fatalf("a call with 1 KB of metadata: %v", err)
	}
	big := metadata.AppendToOutgoingContext(ctx, "x-big", strings.Repeat("a", 100<<10))
	if _, err := r.v1().List(big, &v1.ListPodResourcesRequest{}); err == nil {
		t.Error("a call with 100 KiB of metadata was served")
	}
}

// TestConnectionCap: past MaxConnections a new connection is closed at once, counted and
// logged; the ones open go on, and a connection closing makes room.
func TestConnectionCap(t *testing.T) {
	ctx := testContext(t)
	logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true)))
	// One process holds them all: its quota is above the total, which refuses the third.
	r := newRig(t, Options{Source: webSource(), MaxConnections: 2, MaxConnectionsPerProcess: 3, Logger: logger})
	if _, err := r.v1().List(ctx, &v1.ListPodResourcesRequest{}); err != nil { // r.conn: the first
		t.Fatal(err)
	}
	second, err := net.Dial("unix", r.path)
	if err != nil {
		t.Fatal(err)
	}
	// The server has accepted the second once it says its SETTINGS.
	if _, err := io.ReadFull(second, make([]byte, 9)); err != nil {
		t.Fatalf("the second connection: %v", err)
	}
	third, err := net.Dial("unix", r.path)
	if err != nil {
		t.Fatal(err)
	}
	_ = third.SetReadDeadline(time.Now().Add(15 * time.Second))
	if n, err := third.Read(make([]byte, 9)); !errors.Is(err, io.EOF) {
		t.Fatalf("the third connection read %d bytes, %v; want it closed", n, err)
	}
	if got := metricValue(t, r.metrics, "podgate_podresources_refusals_total", "reason", "connections"); got != 1 {
		t.Errorf("refusals_total{connections} = %v, want 1", got)
	}
	if _, err := r.v1().List(ctx, &v1.ListPodResourcesRequest{}); err != nil {
		t.Errorf("the first connection after the third was refused: %v", err)
	}
	logs := logger.GetSink().(ktesting.Underlier).GetBuffer().String()
	if !strings.Contains(logs, "Refused a PodResources client") || !strings.Contains(logs, "podResources.maxConnections") {
		t.Errorf("the log does not tell of the refused connection:\n%s", logs)
	}

	_ = second.Close()
	eventually(t, "a connection after one closed is served", func() bool {
		c, err := net.Dial("unix", r.path)
		if err != nil {
			return false
		}
		defer c.Close()
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err = io.ReadFull(c, make([]byte, 9))
		return err == nil
	})
}

// TestClientTable: the table of clients' buckets stays within its size; a client whose bucket
// refilled is forgotten to make room, and while none has, the newcomers share one bucket.
func TestClientTable(t *testing.T) {
	now := time.Unix(1000, 0)
	c := newClients(1, 2, 1000, 1000, 3, func() time.Time { return now })
	for pid := int32(1); pid <= 3; pid++ {
		if !c.ok(peerID{pid: pid}) {
			t.Fatalf("client %d's first call refused", pid)
		}
	}
	// Full, nobody idle: the fourth and fifth share the overflow bucket (burst 2).
	if !c.ok(peerID{pid: 4}) || !c.ok(peerID{pid: 5}) || c.ok(peerID{pid: 6}) {
		t.Error("newcomers to a full table did not share one bucket of 2")
	}
	if n := c.size(); n != 3 || c.has(peerID{pid: 4}) {
		t.Errorf("the table holds %d clients (client 4: %v), want the first 3", n, c.has(peerID{pid: 4}))
	}
	// 2 s later every bucket refilled: client 7 takes the place of an idle one.
	now = now.Add(2 * time.Second)
	var allowed []bool
	for range 3 {
		allowed = append(allowed, c.ok(peerID{pid: 7}))
	}
	if !slices.Equal(allowed, []bool{true, true, false}) || !c.has(peerID{pid: 7}) {
		t.Errorf("client 7's calls allowed %v (in the table: %v), want a bucket of 2 of its own", allowed, c.has(peerID{pid: 7}))
	}
	if n := c.size(); n > 3 {
		t.Errorf("the table holds %d clients, want at most 3", n)
	}
}

// ok is allow's answer alone.
func (c *clients) ok(p peerID) bool {
	_, ok := c.allow(p)
	return ok
}

func (c *clients) size() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.procs.m)
}

func (c *clients) has(p peerID) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.procs.m[p]
	return ok
}

// TestUserBucket: the processes of one user take from their user's bucket beside their own,
// so that together they get the user's burst; a call the user's bucket refuses gives the
// process's token back; another user's processes have a bucket of their own.
func TestUserBucket(t *testing.T) {
	now := time.Unix(1000, 0)
	c := newClients(1, 2, 1, 3, 16, func() time.Time { return now })
	var got []bool
	for pid := int32(1); pid <= 3; pid++ {
		for range 2 {
			got = append(got, c.ok(peerID{pid: pid, uid: 10}))
		}
	}
	if want := []bool{true, true, true, false, false, false}; !slices.Equal(got, want) {
		t.Errorf("three processes of one user, two calls each: allowed %v, want %v (the user's burst of 3)", got, want)
	}
	if by, ok := c.allow(peerID{pid: 3, uid: 10}); ok || by != scopeUser {
		t.Errorf("a call over the user's bucket: allowed %v by %v, want refused by the user's", ok, by)
	}
	other := peerID{pid: 4, uid: 20}
	if first, second := c.ok(other), c.ok(other); !first || !second {
		t.Error("another user's process was refused its burst")
	}
	// 1 s later the user's bucket holds 1 token: process 3, refused by it three times, is
	// served, as its own bucket got its tokens back (it would be 1 in debt otherwise); its
	// next call is the user's again to refuse.
	now = now.Add(time.Second)
	if !c.ok(peerID{pid: 3, uid: 10}) {
		t.Error("process 3 was refused once its user's bucket refilled: the user's refusals took its own tokens")
	}
	if by, ok := c.allow(peerID{pid: 3, uid: 10}); ok || by != scopeUser {
		t.Errorf("process 3's next call: allowed %v by %v, want refused by the user's bucket", ok, by)
	}
}
